"""CPU threads that leave room for other programs.

torch runs its CPU kernels on an OpenMP pool of one thread per core, and every kernel ends at a barrier
where the pool's threads wait for the slowest. When another program keeps a core busy, one of the pool's
threads gets that core only half the time, and the others wait for it at each of the thousands of barriers
of a step: on a 2-core machine beside one busy process, a step took 3.4x (ES) to 4.3x (GRPO) its quiet time,
where the same step on one thread lost nothing (docs/speed.md, "A CPU shared with other work").

So a script that turns it on (set_up_process, minies/runtime/__init__.py) measures, before each generation, how
many cores the *other* programs used since the last look (the machine's busy time in /proc/stat less this process's
own), and runs on the cores left, at most as many threads as it started with, at least one. On a quiet machine
nothing changes. The count can change a result's last bits: a reduction split over another number of threads
rounds differently (with longer rows than the shipped terse models', whose results are bit-identical on one thread
and on two), so a sampled run on a CPU shared with other work repeats only with the count fixed. OMP_NUM_THREADS, when
set, wins: the count is then fixed (docs/speed.md, "A CPU shared with other work").
"""
import os
import time

import torch

MIN_INTERVAL = 1.0  # seconds between two looks: shorter windows measure the scheduler's noise


def _busy_and_own():
    """(CPU ticks the whole machine spent busy, ticks this process spent), both since boot."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    busy = sum(ticks) - ticks[3] - ticks[4]  # all but idle and iowait
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return busy, int(fields[11]) + int(fields[12])  # utime + stime, every thread of this process


class LoadFollower:
    """`follow()` before each generation: sets torch's thread count to the cores other programs left free over
    the last second or more. A count set by someone else (torch.set_num_threads, a test) becomes the new most."""

    def __init__(self):
        self.most = self.current = torch.get_num_threads()
        self.cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        self.enabled = "OMP_NUM_THREADS" not in os.environ and os.path.exists("/proc/stat")
        if self.enabled:
            self.tick = os.sysconf("SC_CLK_TCK")
            self.last = (time.monotonic(), *_busy_and_own())

    def follow(self):
        if not self.enabled or time.monotonic() - self.last[0] < MIN_INTERVAL:
            return
        if torch.get_num_threads() != self.current:  # set elsewhere: that is the count to stay under
            self.most = self.current = torch.get_num_threads()
        (then, busy0, own0), now, (busy, own) = self.last, time.monotonic(), _busy_and_own()
        self.last = (now, busy, own)
        others = max(0, (busy - busy0) - (own - own0)) / self.tick / (now - then)  # cores the others used
        threads = max(1, min(self.most, round(self.cores - others)))
        if threads != self.current:
            torch.set_num_threads(threads)
            self.current = threads


_follower = None  # the process's LoadFollower, once follow_load_from_now_on() made it


def follow_load_from_now_on():
    """Make every later follow_load() adjust the thread count (set_up_process calls it on a CPU)."""
    global _follower
    if _follower is None:
        _follower = LoadFollower()


def follow_load():
    """Before each generation (rollout.generate): run on the cores other programs leave free, when the script
    turned following on (follow_load_from_now_on); else nothing."""
    if _follower is not None:
        _follower.follow()
