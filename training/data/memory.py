"""Keeping the preparation's memory down where datasets forks workers and reads memory-mapped Arrow files.

`release_mapped_pages(table)`: a process that reads rows of a memory-mapped Arrow file (datasets' cache files) keeps
each page it touched mapped for as long as the mapping lives, and its RSS and PSS count them. A tokenizing
`Dataset.map` worker reads its whole shard once: for WMT14 en-de's 4.5M pairs the two workers held most of the
634 MB Arrow file by the end of the tokenization (benchmarks/results/data-cpu2-2026-12-01-3.md). This unmaps, in
this process, the pages of a table's buffers that lie in a read-only mapping of a file: madvise(MADV_DONTNEED) on
them. The pages stay in the kernel's page cache, as after a plain read(), and a later read of the same rows maps
them again (a minor fault, nothing read from disk). Buffers anywhere else (an in-memory table: anonymous memory,
whose pages MADV_DONTNEED would zero) are left alone. Linux only; elsewhere nothing is released.
`VASWANI_RELEASE_PAGES=0` (or `false`, `no`, `off`) in the environment switches the tokenization's use of it off
(`release_pages_enabled`), for A/B measurements; any other value, or none, leaves it on.

`frozen_for_fork()`: around a `Dataset.map(num_proc=...)`, whose worker processes are forked from this one, the
objects this process holds are frozen out of the garbage collector (`gc.freeze`, the use Python's documentation
gives it): a forked worker's collections would otherwise write to every container object it inherited, copying
the pages they sit on (copy-on-write), so that each worker ends up with its own copy of much of the parent's heap.
"""

from __future__ import annotations

import ctypes
import gc
import mmap
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa

RELEASE_PAGES_ENV = "VASWANI_RELEASE_PAGES"
_MADV_DONTNEED = 4  # linux/mman-common.h
_PAGE = mmap.PAGESIZE
_libc = None


def release_pages_enabled() -> bool:
    """Whether the tokenization unmaps the corpus pages it has read: on unless the environment's
    VASWANI_RELEASE_PAGES says 0, false, no or off (any case, surrounding blanks ignored)."""
    return os.environ.get(RELEASE_PAGES_ENV, "").strip().lower() not in ("0", "false", "no", "off")


def readonly_file_mappings() -> list[tuple[int, int]]:
    """(start, end) of this process's mappings of files that are neither writable nor executable
    (/proc/self/maps), sorted; none where there is no /proc."""
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return []
    spans = []
    for line in lines:
        fields = line.split(maxsplit=5)
        # address perms offset dev inode path: a file's path starts with "/" (not [heap], [stack], anonymous)
        if len(fields) == 6 and fields[5].startswith("/") and fields[1][:3] == "r--":
            start, end = (int(x, 16) for x in fields[0].split("-"))
            spans.append((start, end))
    return sorted(spans)


def _page_ranges(tables: tuple[pa.Table, ...], spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The page-aligned (start, end) ranges, merged, of the tables' buffers inside `spans` (each clipped to its
    mapping: mappings start and end on page boundaries)."""
    wanted = []
    for table in tables:
        for chunk in (chunk for column in table.columns for chunk in column.chunks):
            for buf in chunk.buffers():  # children's buffers included
                if buf is None or buf.size == 0:
                    continue
                lo, hi = buf.address, buf.address + buf.size
                for start, end in spans:
                    if start <= lo < end:
                        wanted.append((lo - lo % _PAGE, min(end, -(-hi // _PAGE) * _PAGE)))
                        break
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(wanted):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def release_mapped_pages(*tables: pa.Table) -> int:
    """Unmap from this process the pages of the tables' buffers that lie in a read-only file mapping (memory-mapped
    Arrow), as the module says; returns the bytes of address range released (0 off Linux, or for tables held in
    memory). The tables stay valid: reading them again maps their pages again from the page cache. One call for
    many tables: reading /proc/self/maps takes ~2 ms in a process that has imported torch."""
    global _libc
    if sys.platform != "linux" or not tables:
        return 0
    ranges = _page_ranges(tables, readonly_file_mappings())
    if not ranges:
        return 0
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        _libc.madvise.restype = ctypes.c_int
    released = 0
    for lo, hi in ranges:
        if _libc.madvise(lo, hi - lo, _MADV_DONTNEED) == 0:
            released += hi - lo
    return released


@contextmanager
def frozen_for_fork(forks: bool = True) -> Iterator[None]:
    """This process's objects frozen out of the garbage collector for the block (`gc.freeze` after a collection;
    `gc.unfreeze` after it), so that processes forked in the block share the parent's pages instead of copying
    them; nothing when `forks` is false or a caller has frozen objects already (theirs to unfreeze)."""
    if not forks or gc.get_freeze_count():
        yield
        return
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
