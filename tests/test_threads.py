"""minies/runtime/threads.py: a run takes the cores other programs leave free, never more threads than it was given,
and never when OMP_NUM_THREADS fixes the count. The machine is simulated: its busy ticks and this process's
are fed in, one second apart."""
import os

import pytest
import torch

import minies.runtime.threads as threads


@pytest.fixture
def machine(monkeypatch):
    """A 4-core machine whose clock and tick counters the test advances: `run(others, own)` spends one second
    with the other programs on `others` cores and this process on `own`."""
    state = {"now": 0.0, "busy": 0, "own": 0}
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads.time, "monotonic", lambda: state["now"])
    monkeypatch.setattr(threads, "_busy_and_own", lambda: (state["busy"], state["own"]))
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: set(range(4)), raising=False)
    monkeypatch.setattr(threads.os, "sysconf", lambda name: 100)
    before = torch.get_num_threads()
    torch.set_num_threads(4)

    def run(others, own=2.0):
        state["now"] += 1.0
        state["own"] += int(own * 100)
        state["busy"] += int((others + own) * 100)

    yield run
    torch.set_num_threads(before)


def test_threads_follow_the_cores_others_leave_free(machine):
    follower = threads.LoadFollower()
    seen = []
    for others in (0.0, 1.0, 2.6, 3.9, 0.2, 1.4):
        machine(others)
        follower.follow()
        seen.append(torch.get_num_threads())
    assert seen == [4, 3, 1, 1, 4, 3]  # round(4 - others), at least 1, at most the 4 it started with


def test_no_more_threads_than_it_was_given(machine):
    torch.set_num_threads(2)
    follower = threads.LoadFollower()
    machine(0.0)
    follower.follow()
    assert torch.get_num_threads() == 2
    torch.set_num_threads(1)  # a count set elsewhere becomes the most
    machine(0.0)
    follower.follow()
    assert torch.get_num_threads() == 1


def test_looks_at_most_once_a_second(machine):
    follower = threads.LoadFollower()
    machine(3.0)
    follower.last = (follower.last[0] + 0.5, *follower.last[1:])  # the last look was half a second ago
    follower.follow()
    assert torch.get_num_threads() == 4


def test_omp_num_threads_fixes_the_count(machine, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    follower = threads.LoadFollower()
    machine(3.0)
    follower.follow()
    assert not follower.enabled and torch.get_num_threads() == 4


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="no /proc (not Linux): the count stays fixed")
def test_reads_this_machine():
    """The real counters: the machine has been busy at least as long as this process."""
    busy, own = threads._busy_and_own()
    assert busy >= own > 0
