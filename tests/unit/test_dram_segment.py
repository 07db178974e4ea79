"""A DRAM segment maps all its pages into the daemon when it is made, so no transfer the daemon
serves pays a page fault per 4 KiB on space it has not touched yet."""

from __future__ import annotations

import re

import pytest

from kvstore.storage.dram import DramSegment
from tests.kernel import populate_supported

_HEADER = re.compile(r"^[0-9a-f]+-[0-9a-f]+ ")


def _mapped_bytes(path: str) -> int:
    """Bytes of the mapping of `path` present in this process's page tables (its Rss)."""
    mapped, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            if _HEADER.match(line):
                inside = line.rstrip().endswith(path)
            elif inside and line.startswith("Rss:"):
                mapped += int(line.split()[1]) * 1024
    return mapped


@pytest.mark.skipif(not populate_supported(), reason="MADV_POPULATE_WRITE needs Linux 5.14")
def test_a_new_segment_has_every_page_mapped() -> None:
    segment = DramSegment("test-populated", 40 << 20)  # not a multiple of the populate step
    try:
        assert _mapped_bytes(str(segment.path)) == segment.capacity
        segment.write_from(segment.capacity - 4096, memoryview(b"x" * 4096))
        out = bytearray(4096)
        segment.read_into(segment.capacity - 4096, memoryview(out))
        assert out == b"x" * 4096
    finally:
        segment.close()


def test_a_segment_made_without_mapping_leaves_its_pages_to_fault_in() -> None:
    segment = DramSegment("test-unmapped", 8 << 20, map_pages=False)  # the daemon's --no-map-dram-pages
    try:
        assert _mapped_bytes(str(segment.path)) == 0
    finally:
        segment.close()
