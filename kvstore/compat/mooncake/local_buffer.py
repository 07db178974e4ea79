"""The local buffer Mooncake's bytes API stages values through (setup's `local_buffer_size`).

Mooncake's `put`, `put_batch`, `put_parts`, the `upsert` forms and `get`, `get_batch`,
`get_buffer`, `batch_get_buffer` copy every value through a buffer of that many bytes that the
client allocates at set-up; calls on registered memory (`put_from`, `get_into`, ...) do not. A
call that needs more room than the buffer has fails: a put with INVALID_PARAMS, storing nothing of
its batch; a read answers its miss value (b"" or None), each key taking its room in call order.
kvstore's client needs no such buffer; the limit is kept so that code meets the same answers.
Not kept: concurrent calls sharing one buffer (each call here has the whole of it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class LocalBuffer:
    size: int

    def holds(self, nbytes: int) -> bool:
        """Whether one put of `nbytes` in all fits."""
        return nbytes <= self.size

    def admit(self, sizes: Sequence[int | None]) -> list[bool]:
        """For the values one read brings back (None: nothing to stage, a miss), in order, whether
        each still finds room after the ones before it took theirs."""
        room, out = self.size, []
        for size in sizes:
            fits = size is not None and size <= room
            room -= size if fits and size is not None else 0
            out.append(fits)
        return out
