"""Large copies are hashed on a helper thread, a piece behind the copy (kvstore.checksum): the
checksum is the one-pass xxh3 of the bytes, each piece is prepared before it is copied, an error
reaches the caller, and no view of the caller's buffers outlives the call."""

from __future__ import annotations

import os
import random
import signal
import threading

import pytest
import xxhash

from kvstore.checksum import PIECE, PIPELINE_MIN, PIPELINED, HashPipe, copy_with_checksum

on_two_cores = pytest.mark.skipif(not PIPELINED, reason="one core: large copies stay on one thread")


def _bytes(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


@pytest.mark.parametrize("n", [PIPELINE_MIN - 1, PIPELINE_MIN, PIPELINE_MIN + 1, 5 * PIECE + 123])
def test_a_copy_returns_the_one_pass_checksum(n: int) -> None:
    src = _bytes(n, n)
    dst = bytearray(n)
    assert copy_with_checksum(memoryview(dst), memoryview(src)) == xxhash.xxh3_64_intdigest(src)
    assert dst == src


@on_two_cores
def test_each_piece_is_prepared_once_in_order_before_its_copy() -> None:
    n = PIPELINE_MIN + 2 * PIECE + 7
    src = _bytes(n, 1)
    dst = bytearray(n)
    seen: list[tuple[int, int]] = []

    def prepare(start: int, length: int) -> None:
        assert not any(dst[start : start + length])  # not copied yet
        seen.append((start, length))

    assert copy_with_checksum(memoryview(dst), memoryview(src), prepare) == xxhash.xxh3_64_intdigest(src)
    assert seen == [(s, min(PIECE, n - s)) for s in range(0, n, PIECE)]
    assert dst == src


def test_a_failing_prepare_reaches_the_caller_and_lets_go_of_the_buffers() -> None:
    n = PIPELINE_MIN + PIECE
    dst = bytearray(n)

    def prepare(start: int, length: int) -> None:
        if start + length > 2 * PIECE:
            raise OSError("cannot map")

    try:
        copy_with_checksum(memoryview(dst), memoryview(_bytes(n, 2)), prepare)
    except OSError as exc:
        message = str(exc)
    else:
        pytest.fail("the error did not reach the caller")
    assert message == "cannot map"
    dst.extend(b"x")  # BufferError if the helper, or the error, still held a view of it


def test_no_view_of_the_buffers_outlives_a_copy() -> None:
    n = PIPELINE_MIN + 1
    src, dst = bytearray(_bytes(n, 3)), bytearray(n)
    copy_with_checksum(memoryview(dst), memoryview(src))
    src.extend(b"x")
    dst.extend(b"x")


def test_concurrent_copies_each_get_their_own_checksum() -> None:
    n = PIPELINE_MIN + PIECE // 2
    sources = [_bytes(n, 10 + i) for i in range(4)]
    wrong: list[int] = []

    def copy_many(i: int) -> None:
        dst = bytearray(n)
        for _ in range(5):
            if copy_with_checksum(memoryview(dst), memoryview(sources[i])) != xxhash.xxh3_64_intdigest(sources[i]):
                wrong.append(i)

    threads = [threading.Thread(target=copy_many, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []


def test_a_pipe_hashes_several_buffers_in_order() -> None:
    buffers = [_bytes(n, n) for n in (0, 1, PIECE, 3 * PIECE + 5)]
    pipe = HashPipe()
    try:
        for buf in buffers:
            for start in range(0, len(buf), PIECE):
                pipe.update(memoryview(buf)[start : start + PIECE])
            pipe.digest()
    finally:
        digests = pipe.finish()
    assert digests == [xxhash.xxh3_64_intdigest(b) for b in buffers]


def test_a_forked_child_starts_its_own_helper() -> None:
    n = PIPELINE_MIN
    src = _bytes(n, 4)
    copy_with_checksum(memoryview(bytearray(n)), memoryview(src))  # the parent's helper is running
    pid = os.fork()
    if pid == 0:  # the child: no helper thread came with the fork
        signal.alarm(30)  # a hang (waiting on a helper that does not exist) fails the test
        ok = copy_with_checksum(memoryview(bytearray(n)), memoryview(src)) == xxhash.xxh3_64_intdigest(src)
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
