"""Mooncake Store calls kvstore does not offer: each answers what Mooncake answers for an
operation that cannot be done, NOT_SUPPORTED (-1012) where the result carries a code.

    tensors     put_tensor / get_tensor and their tp, parallelism, pub, upsert and batch forms:
                Mooncake's own tensor object format, not implemented over kvstore
    sessions    batch_{get,put}_session_* and the *_multi_buffer_ranges calls
    segments    mount/unmount, allocate_and_mount_segment, alloc_from_mem_pool: a kvstore client
                contributes no memory (daemons do)
    replicas    get_replica_desc, batch_get_replica_desc, batch_replica_clear, copy/move tasks
    modes       setup_dummy (Mooncake's standalone client process), init_all

Result shapes, by what the Mooncake method returns: an int -> -1012; a list of per-key ints ->
[-1012] per key; a tensor or descriptor -> None (per key for batches); a dict -> Mooncake's
failure dict with ret=-1012; a (task, code) tuple -> (None or (0, 0), -1012).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvstore.compat.mooncake.codes import ErrorCode

NOT_SUPPORTED = int(ErrorCode.NOT_SUPPORTED)


def _keys_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    keys = args[0] if args else kwargs.get("keys", kwargs.get("base_keys", ()))
    try:
        return len(keys)
    except TypeError:
        return 0


_SHAPES: dict[str, Callable[[tuple[Any, ...], dict[str, Any]], Any]] = {
    "int": lambda a, k: NOT_SUPPORTED,
    "ints": lambda a, k: [NOT_SUPPORTED] * _keys_of(a, k),
    "none": lambda a, k: None,
    "nones": lambda a, k: [None] * _keys_of(a, k),
    "empty_list": lambda a, k: [],
    "empty_dict": lambda a, k: {},
    "segment_dict": lambda a, k: {"ret": NOT_SUPPORTED, "segment_ids": []},
    "alloc_dict": lambda a, k: {"ret": NOT_SUPPORTED, "segment_ids": [], "allocated_size": 0},
    "task": lambda a, k: ((0, 0), NOT_SUPPORTED),
    "query": lambda a, k: (None, NOT_SUPPORTED),
    "null_pointer": lambda a, k: 0,
}

# method -> result shape; every public method of the installed Mooncake class that store.py and
# zero_copy.py do not define (tests/compat check the two lists together cover all of them).
UNSUPPORTED: dict[str, str] = {
    "setup_dummy": "int",
    "init_all": "int",
    "mount_segment": "segment_dict",
    "unmount_segment": "int",
    "allocate_and_mount_segment": "alloc_dict",
    "unmount_and_free_segment": "int",
    "unmount_local_disk_segment": "int",
    "alloc_from_mem_pool": "null_pointer",
    "get_offload_rpc_read_count": "null_pointer",
    "get_replica_desc": "empty_list",
    "batch_get_replica_desc": "empty_dict",
    "batch_replica_clear": "empty_list",
    "create_copy_task": "task",
    "create_move_task": "task",
    "query_task": "query",
    "batch_get_session_start": "ints",
    "batch_get_session_end": "int",
    "batch_get_into_multi_buffer_ranges": "ints",
    "batch_put_session_start": "ints",
    "batch_put_from_multi_buffer_ranges": "ints",
    "batch_put_session_end": "ints",
    "batch_put_session_revoke": "ints",
    "put_from_with_metadata": "int",
    "put_tensor": "int",
    "get_tensor": "none",
    "batch_put_tensor": "ints",
    "batch_get_tensor": "nones",
    "put_tensor_from": "int",
    "batch_put_tensor_from": "ints",
    "get_tensor_into": "none",
    "batch_get_tensor_into": "nones",
    "get_tensor_into_cuda": "int",
    "batch_get_tensor_into_cuda": "ints",
    "put_tensor_with_tp": "int",
    "batch_put_tensor_with_tp": "ints",
    "put_tensor_with_tp_from": "int",
    "batch_put_tensor_with_tp_from": "ints",
    "get_tensor_with_tp": "none",
    "batch_get_tensor_with_tp": "nones",
    "get_tensor_with_tp_into": "none",
    "batch_get_tensor_with_tp_into": "nones",
    "put_tensor_with_parallelism": "int",
    "batch_put_tensor_with_parallelism": "ints",
    "put_tensor_with_parallelism_from": "int",
    "batch_put_tensor_with_parallelism_from": "ints",
    "get_tensor_with_parallelism": "none",
    "batch_get_tensor_with_parallelism": "nones",
    "get_tensor_with_parallelism_into": "none",
    "batch_get_tensor_with_parallelism_into": "nones",
    "upsert_tensor": "int",
    "batch_upsert_tensor": "ints",
    "upsert_tensor_from": "int",
    "batch_upsert_tensor_from": "ints",
    "upsert_tensor_with_parallelism": "int",
    "batch_upsert_tensor_with_parallelism": "ints",
    "upsert_tensor_with_parallelism_from": "int",
    "batch_upsert_tensor_with_parallelism_from": "ints",
    "pub_tensor": "int",
    "batch_pub_tensor": "ints",
    "pub_tensor_with_tp": "int",
    "batch_pub_tensor_with_tp": "ints",
    "upsert_pub_tensor": "int",
    "batch_upsert_pub_tensor": "ints",
    "save_tensor_to_safetensor": "int",
    "load_tensor_from_safetensor": "none",
}


def _method(name: str, shape: str) -> Callable[..., Any]:
    answer = _SHAPES[shape]

    def call(self: object, *args: Any, **kwargs: Any) -> Any:
        return answer(args, kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"Not supported over kvstore: answers {answer((), {})!r} (see kvstore.compat.mooncake.unsupported)."
    return call


class UnsupportedCalls:
    """One method per UNSUPPORTED entry."""


for _name, _shape in UNSUPPORTED.items():
    setattr(UnsupportedCalls, _name, _method(_name, _shape))
