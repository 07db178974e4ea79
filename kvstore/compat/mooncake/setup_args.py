"""`setup(...)`'s two forms, positional and config-dict, parsed into one frozen `SetupArgs`.

What kvstore does with each argument (docs/compat-mooncake.md has the table):

    master_server_addr       the kvstore metadata service's address (`kvstore serve` prints it);
                             $KVSTORE_MOONCAKE_META, when set, overrides it for unchanged configs
    local_hostname           the store's name, with a port added when it has none (segment_name.py)
    local_buffer_size        bounds what one bytes-API call moves (local_buffer.py)
    global_segment_size      > 0: the store's keys go when it closes, if KVSTORE_MOONCAKE_DROP_ON_CLOSE
                             asks for it (settings.py); no memory is contributed
    rdma_devices             the client's Mooncake transport devices (ClientConfig.mooncake_device)
    tenant_id                a key namespace (see namespace.py)
    metadata_server, protocol, engine, enable_ssd_offload, ssd_offload_path, ipc_socket_path,
    enable_client_http_server, client_http_port
                             accepted and not used: kvstore's daemons contribute the memory and the
                             SSD tier, and the client negotiates its transport per segment
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvstore.compat.mooncake.codes import ErrorCode
from kvstore.config import parse_size

DEFAULT_SEGMENT = 16 << 20  # the dict form's defaults, as in Mooncake
DEFAULT_MASTER = "127.0.0.1:50051"
DEFAULT_HTTP_PORT = 9300
MAX_LOCAL_BUFFER = 1 << 40  # Mooncake's MAX_SEGMENT_SIZE
MIN_SEGMENT = 1024  # ... and MIN_SEGMENT_SIZE (0 is allowed too)


@dataclass(frozen=True)
class SetupArgs:
    local_hostname: str
    metadata_server: str
    global_segment_size: int = DEFAULT_SEGMENT
    local_buffer_size: int = DEFAULT_SEGMENT
    protocol: str = "tcp"
    rdma_devices: str = ""
    master_server_addr: str = DEFAULT_MASTER
    engine: Any = None
    enable_ssd_offload: bool = False
    ssd_offload_path: str = ""
    tenant_id: str = "default"
    enable_client_http_server: bool = False
    client_http_port: int = DEFAULT_HTTP_PORT

    def problem(self) -> int:
        """INVALID_PARAMS where Mooncake's setup refuses these values, else 0."""
        if not self.local_hostname or not self.metadata_server or not self.master_server_addr:
            return int(ErrorCode.INVALID_PARAMS)
        if 0 < self.global_segment_size < MIN_SEGMENT:
            return int(ErrorCode.INVALID_PARAMS)
        if 0 < self.local_buffer_size < MIN_SEGMENT or self.local_buffer_size > MAX_LOCAL_BUFFER:
            return int(ErrorCode.INVALID_PARAMS)
        return int(ErrorCode.OK)


def _positional(
    self: object,
    local_hostname: str,
    metadata_server: str,
    global_segment_size: int,
    local_buffer_size: int,
    protocol: str,
    rdma_devices: str,
    master_server_addr: str,
    engine: Any = None,
    enable_ssd_offload: bool = False,
    ssd_offload_path: str = "",
    tenant_id: str = "default",
    enable_client_http_server: bool = False,
    client_http_port: int = DEFAULT_HTTP_PORT,
) -> None:
    """The first overload's signature: every argument through master_server_addr is required."""


_SIGNATURE = inspect.signature(_positional)
_STRINGS = (
    "local_hostname",
    "metadata_server",
    "protocol",
    "rdma_devices",
    "master_server_addr",
    "ssd_offload_path",
    "tenant_id",
)
_INTS = ("global_segment_size", "local_buffer_size", "client_http_port")
_BOOLS = ("enable_ssd_offload", "enable_client_http_server")


def from_call(store: object, args: tuple[Any, ...], kwargs: dict[str, Any]) -> SetupArgs | int:
    """Parse `setup(*args, **kwargs)`. TypeError for a call neither overload accepts (as pybind11
    raises); an int error code for values Mooncake's setup refuses."""
    if len(args) + len(kwargs) == 1 and (
        isinstance(args[0], Mapping) if args else isinstance(kwargs.get("config"), Mapping)
    ):
        return from_dict(args[0] if args else kwargs["config"])
    bound = _SIGNATURE.bind(store, *args, **kwargs)  # TypeError, as pybind11's overloads do
    bound.apply_defaults()
    values = dict(bound.arguments)
    del values["self"]
    for name in _STRINGS:
        if not isinstance(values[name], str):
            raise TypeError(f"setup(): {name} must be str, not {type(values[name]).__name__}")
    for name in _INTS:
        values[name] = operator.index(values[name])  # TypeError for non-integers
        if values[name] < 0:
            raise TypeError(f"setup(): {name} must be a non-negative int")
    for name in _BOOLS:
        if not isinstance(values[name], bool):
            raise TypeError(f"setup(): {name} must be bool")
    parsed = SetupArgs(**values)
    return parsed.problem() or parsed


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def from_dict(config: Mapping[Any, Any]) -> SetupArgs | int:
    """The config-dict overload: every value is read as its str(), as Mooncake's binding does;
    a missing required key or an unparsable size is INVALID_PARAMS."""
    text = {str(k): str(v) for k, v in config.items()}
    values: dict[str, Any] = {name: text[name] for name in _STRINGS if name in text}
    values.setdefault("local_hostname", "")
    values.setdefault("metadata_server", "")
    try:
        for name in _INTS:
            if name in text:
                values[name] = parse_size(text[name])
    except ValueError:
        return int(ErrorCode.INVALID_PARAMS)
    for name in _BOOLS:
        word = text.get(name, "").strip().lower()
        values[name] = word in _TRUE if word in _TRUE + _FALSE else False
    parsed = SetupArgs(**values)
    return parsed.problem() or parsed
