"""How long train.py takes to reach its first training step on a large data file, and its peak memory.

    python -m bench.data                                  # 500,000 TinyZero-like Countdown rows (JSON Lines)
    python -m bench.data --format countdown-list          # Qiu et al.'s keys, one JSON list
    python -m bench.data --format gsm8k --rows 100000     # GSM8K rows (the test split's, each made distinct)

Writes a data file of --rows generated rows, runs train.py on it (ES, one tiny step, the smallest evaluation)
and stops it once step 1 is logged; then the same on the file's first SMALL_ROWS rows. Printed: the seconds
from the start of train.py to its first logged step, and the peak resident memory of the process (from the
kernel's accounting of the finished child), for both files, and the difference of the peaks over the large
file's size. Both runs have one thread (OMP_NUM_THREADS=1): train.py's threads otherwise follow the load on the
machine, and each thread's memory would move the peaks apart by more than a file of 20 MiB takes. Numbers are
measured, never asserted (tests/test_data_files.py runs this on a few hundred rows).
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from minies.config import add_arguments, from_args, option

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GSM8K_TEST = os.path.join(ROOT, "tests", "data", "gsm8k_test.jsonl")
SMALL_ROWS = 100
# One step of two members on four prompts, four held-out problems sampled once: the run's own work stays small
# beside reading the file, which is what is measured.
TINY_RUN = ["--steps", "1", "--population", "2", "--prompts-per-step", "4", "--eval-every", "0", "--eval-problems",
            "4", "--final-samples", "1", "--max-new-tokens", "8", "--save-every", "1000"]


@dataclass
class DataConfig:
    rows: int = option(500_000, "rows of the generated data file", check="count")
    format: str = option("countdown", "countdown: TinyZero's {\"target\", \"nums\"} as JSON Lines; countdown-list: "
                         "Qiu et al.'s keys in one JSON list; gsm8k: GSM8K's JSON Lines", type=str,
                         choices=["countdown", "countdown-list", "gsm8k"])
    seed: int = option(0, "seed of the generated rows", check="seed")
    scratch: str = option(None, "directory for the data files and runs (default: a temporary one)", type=str)


def countdown_rows(count, seed):
    """`count` rows of 3 or 4 numbers in 1..99 whose target is the value of a chain of + - * over them, left to
    right and kept positive (so every row has a solution), as TinyZero's Countdown-Tasks-3to4 holds."""
    rng = random.Random(f"bench-data-{seed}")
    for _ in range(count):
        nums = [rng.randint(1, 99) for _ in range(rng.choice((3, 4)))]
        target = nums[0]
        for n in nums[1:]:
            op = rng.choice("+-*" if target > n else "+*")
            target = target + n if op == "+" else target - n if op == "-" else target * n
        yield {"target": target, "nums": nums}


def gsm8k_rows(count):
    """`count` GSM8K rows: the test split's, over and over, each question made distinct by a number."""
    with open(GSM8K_TEST) as f:
        source = [json.loads(line) for line in f]
    for i in range(count):
        yield {**source[i % len(source)], "question": f"{source[i % len(source)]['question']} ({i})"}


def write_rows(path, cfg, count):
    """The data file of the first `count` rows of --format, written row by row: a child process starts as a
    copy of this one, and its peak memory would count rows held here. Returns the file's task."""
    task = "gsm8k" if cfg.format == "gsm8k" else "countdown"
    rows = gsm8k_rows(count) if task == "gsm8k" else countdown_rows(count, cfg.seed)
    with open(path, "w") as f:
        if cfg.format == "countdown-list":  # Qiu et al.'s file: numbers, the target as text, one list
            f.write("[")
            for i, row in enumerate(rows):
                qiu_row = {"id": i, "numbers": row["nums"], "target": str(row["target"])}
                f.write((",\n" if i else "") + json.dumps(qiu_row))
            f.write("]\n")
        else:
            f.writelines(json.dumps(row) + "\n" for row in rows)
    return task


def first_step(task, data, scratch, name):
    """(seconds to the first logged step, peak resident MiB) of train.py on `data`, stopped after that step."""
    run_dir, errors = os.path.join(scratch, name), os.path.join(scratch, f"{name}.err")
    log = os.path.join(run_dir, "log.jsonl")
    command = [sys.executable, "train.py", "--task", task, "--data", data, *TINY_RUN, "--out", scratch,
               "--run-name", name]
    start = time.perf_counter()
    with open(errors, "w") as err:
        process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err,
                                   env={**os.environ, "OMP_NUM_THREADS": "1"})
    seconds = None
    while True:
        # wait4, not Popen.poll: the child's own resource usage (its peak memory) comes with its exit status.
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)
        if seconds is None and os.path.exists(log) and os.path.getsize(log):
            seconds = time.perf_counter() - start
            process.kill()  # what follows step 1 (the final evaluation, the checkpoint) is not measured
        if pid:
            process.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
            break
        time.sleep(0.05)
    if seconds is None:
        with open(errors) as f:
            raise SystemExit(f"train.py ended before its first step:\n{f.read()[-2000:]}")
    return seconds, usage.ru_maxrss / 1024  # Linux counts it in KiB


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, DataConfig)
    cfg = from_args(DataConfig, parser.parse_args())
    with tempfile.TemporaryDirectory(dir=cfg.scratch) as scratch:
        suffix = "json" if cfg.format == "countdown-list" else "jsonl"
        big, small = os.path.join(scratch, f"big.{suffix}"), os.path.join(scratch, f"small.{suffix}")
        task = write_rows(big, cfg, cfg.rows)
        write_rows(small, cfg, min(SMALL_ROWS, cfg.rows))
        size = os.path.getsize(big) / 2**20
        print(f"{cfg.format}: {cfg.rows:,} rows, {size:.1f} MiB", flush=True)
        big_seconds, big_peak = first_step(task, big, scratch, "big")
        small_seconds, small_peak = first_step(task, small, scratch, "small")
    print(f"first step after {big_seconds:.1f} s ({min(SMALL_ROWS, cfg.rows)} rows: {small_seconds:.1f} s)")
    print(f"peak resident memory {big_peak:.0f} MiB ({min(SMALL_ROWS, cfg.rows)} rows: {small_peak:.0f} MiB): "
          f"{big_peak - small_peak:.0f} MiB more, {(big_peak - small_peak) / size:.1f}x the file's size")


if __name__ == "__main__":
    main()
