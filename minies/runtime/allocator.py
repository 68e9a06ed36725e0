"""Large CPU tensors from memory the process already holds, not from fresh pages.

glibc's malloc serves every allocation above its mmap threshold (which it moves up to 32 MB at most) with
freshly mapped pages and hands them back to the system when the tensor is freed. A model's forward pass
on a CPU allocates such tensors at every layer and frees them at the next (at the 0.5B shape, one MLP
output of 512 rows × 20 prompt tokens is 100 MB in bfloat16), so each one costs a page fault and the
kernel zeroing every 4 KB page before torch writes it. Keeping freed memory for the next tensor instead
made generating 512 rows at that shape 1.09× as fast, and 1.18× as fast as two lowrank ES members, whose
hooks then added 1% to plain generation's time instead of 9% (docs/speed.md, "Memory the process keeps").

reuse_freed_memory() raises both of malloc's thresholds to 1 GiB: tensors up to that size come from the
heap, and up to that much freed memory stays in the process for the next allocation. The price is the
resident set: it stays near its peak instead of shrinking between passes. Nothing computed changes.
Elsewhere than glibc (macOS, musl) it does nothing.
"""
import ctypes
import functools

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
KEEP_BYTES = 2**30


@functools.cache
def reuse_freed_memory():
    """Once per process: serve tensors up to KEEP_BYTES from the heap and keep as much freed memory for reuse.
    Returns whether malloc took the setting."""
    libc = ctypes.CDLL(None)  # the C library this process runs on
    if not hasattr(libc, "gnu_get_libc_version"):  # not glibc (musl's mallopt accepts and ignores)
        return False
    return all(libc.mallopt(option, KEEP_BYTES) == 1 for option in (M_MMAP_THRESHOLD, M_TRIM_THRESHOLD))
