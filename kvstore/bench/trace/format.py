"""The Mooncake trace format: one JSON object a line, one request each.

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, ...]}

`timestamp` is the arrival in ms from the trace's start; `hash_ids` are remapped prefix block
hashes, BLOCK_TOKENS tokens a block (equal ids: a reusable prefix), so
len(hash_ids) == ceil(input_length / BLOCK_TOKENS). The last block of a request may be partial.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kvstore.errors import InvalidArgument

BLOCK_TOKENS = 512
FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


class TraceFormatError(InvalidArgument):
    """A line of a trace file that is not a valid request; `line` is its 1-based number."""

    def __init__(self, path: str, line: int, reason: str) -> None:
        super().__init__(f"{path}:{line}: {reason}")
        self.path = path
        self.line = line
        self.reason = reason


@dataclass(frozen=True)
class Request:
    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]

    def tokens_in(self, blocks: int) -> int:
        """Tokens of this prompt covered by its first `blocks` blocks (the last may be partial)."""
        return min(blocks * BLOCK_TOKENS, self.input_length)

    def to_json(self) -> str:
        return json.dumps(
            {
                "timestamp": self.timestamp_ms,
                "input_length": self.input_length,
                "output_length": self.output_length,
                "hash_ids": list(self.hash_ids),
            }
        )


def parse_line(text: str, path: str = "<trace>", line: int = 1) -> Request:
    """One request from one line; TraceFormatError (naming `path`:`line`) if it is not valid."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceFormatError(path, line, f"not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise TraceFormatError(path, line, f"not a JSON object but {type(obj).__name__}")
    missing = [f for f in FIELDS if f not in obj]
    if missing:
        raise TraceFormatError(path, line, f"missing field(s) {', '.join(missing)}")
    for name in ("timestamp", "input_length", "output_length"):
        value = obj[name]
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise TraceFormatError(path, line, f"{name} must be a non-negative integer, not {value!r}")
    ids = obj["hash_ids"]
    if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in ids):
        raise TraceFormatError(path, line, "hash_ids must be a list of integers")
    expected = math.ceil(obj["input_length"] / BLOCK_TOKENS)
    if len(ids) != expected:
        raise TraceFormatError(
            path,
            line,
            f"{len(ids)} hash_ids for input_length {obj['input_length']}: expected "
            f"ceil({obj['input_length']} / {BLOCK_TOKENS}) = {expected}",
        )
    if len(set(ids)) != len(ids):
        raise TraceFormatError(path, line, "a hash id repeats within one request")
    return Request(obj["timestamp"], obj["input_length"], obj["output_length"], tuple(ids))


def iter_trace(path: str | Path, limit: int = 0) -> Iterator[Request]:
    """The requests of a trace file in order (its first `limit` if limit > 0); blank lines are
    skipped. Raises TraceFormatError at the first bad line, and if timestamps go backwards."""
    name = str(path)
    last = 0
    count = 0
    with open(path, encoding="utf-8") as fh:
        for number, text in enumerate(fh, 1):
            if not text.strip():
                continue
            request = parse_line(text, name, number)
            if request.timestamp_ms < last:
                raise TraceFormatError(name, number, f"timestamp {request.timestamp_ms} is before the previous {last}")
            last = request.timestamp_ms
            yield request
            count += 1
            if count == limit:
                return


def read_trace(path: str | Path, limit: int = 0) -> list[Request]:
    requests = list(iter_trace(path, limit))
    if not requests:
        raise TraceFormatError(str(path), 0, "the trace has no requests")
    return requests


def write_trace(path: str | Path, requests: Iterable[Request]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for request in requests:
            fh.write(request.to_json() + "\n")
