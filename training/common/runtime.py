"""Process settings for fast CPU inference, applied by our command-line tools (never on import).

Beam search over a 37,000-word vocabulary allocates several fresh (batch·beams, vocab) buffers each step, ~19 MB
apiece. glibc's malloc serves blocks that large with mmap and returns them on free, so every step pays page faults
(and the kernel's zeroing) on tens of MB, a large share of a CPU beam search's time (`python -m benchmarks.generate
--plain_malloc` measures it without). Raising the mmap and trim thresholds keeps those blocks in the heap for reuse, as jemalloc/tcmalloc would.
"""

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc <malloc.h>
BIG = 1 << 30  # 1 GiB: blocks below this come from the heap and stay there after free


def keep_freed_memory_for_reuse() -> bool:
    """Tell glibc's malloc to keep large freed blocks for reuse. True when applied (Linux with glibc), else False."""
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl or another C library: nothing to tune
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, BIG)) and bool(mallopt(M_TRIM_THRESHOLD, BIG))
