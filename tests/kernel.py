"""What the running kernel offers, for tests that skip without it."""

from __future__ import annotations

import mmap


def populate_supported() -> bool:
    """madvise(MADV_POPULATE_WRITE) works (Linux 5.14)."""
    probe = mmap.mmap(-1, mmap.PAGESIZE)
    try:
        probe.madvise(23, 0, mmap.PAGESIZE)  # MADV_POPULATE_WRITE
        return True
    except OSError:
        return False
    finally:
        probe.close()
