"""train.py's step time on a CPU shared with other work: quiet, and beside one busy process, in one run.

    python -m bench.load                 # ES (train.py defaults) and GRPO (--algo grpo) on the shipped model

Each configuration runs train.py in a fresh process (OpenMP reads its settings once, when torch starts) for
a few steps, and the step time is read from its log (the `seconds` of the last step over the steps after the
first). "busy" starts one single-threaded busy loop before the run and stops it after, on a machine with as
many cores as torch has threads: one other program at full speed, as on any laptop or CI runner.

Configurations: `minies` (train.py as shipped: its threads follow the load, minies/runtime/threads.py), `one thread`
(OMP_NUM_THREADS=1) and `fixed` (OMP_NUM_THREADS = torch's default count, which turns the following off: every thread
kept whatever the load). Printed: each step time and the two ratios the threading rule (docs/speed.md, "A CPU
shared with other work") is held to: busy ÷ quiet one-thread (at most 1.2) and quiet ÷ quiet fixed (within
5%). Quiet runs are repeated (the fastest counts); a busy run is long and is run once.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import torch

from minies.config import add_arguments, from_args, option

WORKLOADS = {"es": ["--steps", "6"], "grpo": ["--algo", "grpo", "--steps", "20"]}
CONFIGS = {"minies": {}, "one thread": {"OMP_NUM_THREADS": "1"},
           "fixed": {"OMP_NUM_THREADS": str(torch.get_num_threads())}}  # the count a run starts with
FAST = ["--eval-problems", "16", "--final-samples", "1", "--eval-every", "0", "--save-every", "1000"]


@dataclass
class LoadConfig:
    workloads: tuple = option(tuple(WORKLOADS), "train.py runs to time", nargs="+", type=str,
                              choices=list(WORKLOADS))
    repeats: int = option(2, "runs of each quiet configuration (the fastest counts)", check="count")


def step_seconds(workload, env, busy):
    """Seconds per step of one train.py run (steps after the first), with a busy loop beside it or not."""
    loop = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        with tempfile.TemporaryDirectory() as out:
            subprocess.run([sys.executable, "train.py", *WORKLOADS[workload], *FAST, "--out", out, "--run-name", "r"],
                           env={**{k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}, **env},
                           check=True, capture_output=True)
            with open(os.path.join(out, "r", "log.jsonl")) as f:
                rows = [json.loads(line) for line in f]
    finally:
        if loop:
            loop.kill()
    return (rows[-1]["seconds"] - rows[0]["seconds"]) / (len(rows) - 1)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, LoadConfig)
    cfg = from_args(LoadConfig, parser.parse_args())
    print(f"{torch.get_num_threads()} threads; seconds per step (quiet: the fastest of {cfg.repeats} runs)")
    for workload in cfg.workloads:
        times = {(name, busy): min(step_seconds(workload, env, busy) for _ in range(1 if busy else cfg.repeats))
                 for name, env in CONFIGS.items() for busy in (False, True)}
        cells = "  ".join(f"{name} {'busy' if busy else 'quiet'} {t:.3f}" for (name, busy), t in times.items())
        print(f"{workload}: {cells}")
        print(f"{workload}: busy ÷ quiet one-thread {times['minies', True] / times['one thread', False]:.2f} "
              f"(at most 1.2); quiet ÷ quiet fixed {times['minies', False] / times['fixed', False]:.2f} "
              f"(within 5%)", flush=True)


if __name__ == "__main__":
    main()
