"""minies/runtime/allocator.py: on glibc a CPU run keeps freed memory for its next tensors instead of returning it."""
import ctypes
import subprocess
import sys

import pytest

from minies.runtime import allocator

GLIBC = hasattr(ctypes.CDLL(None), "gnu_get_libc_version")

# A fresh process (the setting is process-wide): the resident set, in MB, before a 256 MB tensor is
# allocated and written and after it is freed.
FREED = """
import os, sys, torch
from minies.runtime.allocator import reuse_freed_memory
if sys.argv[1] == "reuse":
    assert reuse_freed_memory()
def resident_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
before = resident_mb()
x = torch.ones(2**26)
del x
print(resident_mb() - before)
"""


def kept_after_free(mode):
    out = subprocess.run([sys.executable, "-c", FREED, mode], capture_output=True, text=True, check=True)
    return float(out.stdout)


@pytest.mark.skipif(not GLIBC, reason="mallopt's thresholds are glibc's")
def test_freed_tensors_stay_in_the_process_for_the_next_one():
    assert kept_after_free("default") < 32  # glibc's default: a tensor this large is unmapped when freed
    assert kept_after_free("reuse") > 200  # kept in the heap, where the next allocation finds it


def test_reuse_freed_memory_is_set_once_and_safe_to_call_again():
    assert allocator.reuse_freed_memory() == GLIBC
    assert allocator.reuse_freed_memory() == GLIBC
