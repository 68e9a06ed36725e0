"""A long run of train.py, watched from outside: does it hold its memory, its disk and its exactness?

    python -m bench.soak                                  # GRPO 10,000 steps and ES 2,000 steps, --save-every 10
    python -m bench.soak --algos grpo --grpo-steps 300    # a shorter look

Each algorithm trains the shipped model in a fresh process with small steps (so that many of them fit in an
hour: the question is what a long run accumulates, not how fast it learns), checkpointing every --save-every
steps and evaluating only before and after. While it runs, this script reads the process's resident memory
(/proc/PID/status), the run directory's size on disk and log.jsonl's size, and prints them at step
--early-step and at the last step. Then it checks that --resume from the end is exact: a copy of the run
directory keeps only the checkpoint before the last (train.py keeps the newest --keep-checkpoints), resumes
from it to the same last step, and its log rows and saved weights must equal the original's.

Printed per algorithm: RSS and disk at both steps and their ratio, log bytes per line at both (a log that
grows linearly has the same), the checkpoints on disk at the end, and whether the resumed tail is identical.
Linux only (/proc).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from safetensors.torch import load_file

from minies.config import add_arguments, from_args, option

# Small steps of each algorithm on the shipped model: a fraction of a second each on a CPU core.
SMALL_STEPS = {"grpo": ["--prompts", "4", "--group-size", "4"],
               "es": ["--population", "4", "--prompts-per-step", "8"]}
QUIET_EVAL = ["--eval-every", "0", "--eval-problems", "8", "--final-samples", "1"]


@dataclass
class SoakConfig:
    algos: tuple = option(("grpo", "es"), "algorithms to soak", nargs="+", type=str)
    grpo_steps: int = option(10_000, "GRPO's steps", check="positive")
    es_steps: int = option(2_000, "ES's steps", check="positive")
    save_every: int = option(10, "checkpoint every k steps", check="positive")
    early_step: int = option(100, "the step whose memory, disk and log size the last step's are compared with",
                             check="positive")
    out: str = option(None, "directory for the runs (default: a temporary one, deleted at the end)")


def resident_bytes(pid):
    """VmRSS of a running process, in bytes (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return None


def disk_bytes(path):
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(path) for name in names)


def train_command(algo, steps, cfg, out, *extra):
    return [sys.executable, "train.py", "--algo", algo, "--steps", str(steps), "--save-every", str(cfg.save_every),
            "--out", out, "--run-name", algo, *SMALL_STEPS[algo], *QUIET_EVAL, *extra]


def watch(command, run_dir, marks):
    """Run `command`, sampling every 0.2 s; returns {step in marks: (rss, disk, log bytes)}, each read when the log
    first holds that many lines, and the wall time."""
    log_path, seen, lines, offset = os.path.join(run_dir, "log.jsonl"), {}, 0, 0
    started = time.time()
    # stderr to a file, not a pipe: a long run's progress bar would fill a pipe nobody reads until the end.
    errors = tempfile.TemporaryFile("w+")
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=errors, text=True)
    while process.poll() is None:
        time.sleep(0.2)
        if os.path.exists(log_path):
            with open(log_path, "rb") as f:
                f.seek(offset)
                chunk = f.read()
            lines += chunk.count(b"\n")
            offset += len(chunk)
        for mark in marks:
            if mark not in seen and lines >= mark:
                seen[mark] = (resident_bytes(process.pid), disk_bytes(run_dir), offset)
    if process.returncode:
        errors.seek(0)
        sys.exit(f"error: {' '.join(command)} failed:\n{errors.read()[-2000:]}")
    return seen, time.time() - started


def log_rows(run_dir, first):
    """log.jsonl's rows from step `first` on, without their timings."""
    with open(os.path.join(run_dir, "log.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [{k: v for k, v in row.items() if k not in ("seconds", "seconds_per_member", "tokens_per_second")}
            for row in rows if row["step"] >= first]


def resumed_tail_is_exact(run_dir, algo, steps, cfg, scratch):
    """Resume a copy of the run from its checkpoint before the last, to the last step: the same log rows and
    weights as the original?"""
    copy = os.path.join(scratch, f"{algo}-resumed")
    shutil.copytree(run_dir, copy)
    last, before = f"step-{steps:06d}", f"step-{steps - cfg.save_every:06d}"
    shutil.rmtree(os.path.join(copy, last))
    with open(os.path.join(copy, "latest"), "w") as f:
        f.write(before)
    subprocess.run(train_command(algo, steps, cfg, scratch, "--resume", "--run-name", f"{algo}-resumed"),
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = steps - cfg.save_every + 1
    same_log = log_rows(run_dir, first) == log_rows(copy, first)
    a, b = (load_file(os.path.join(d, last, "model.safetensors")) for d in (run_dir, copy))
    same_weights = a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)
    return same_log and same_weights


def soak(algo, steps, cfg, scratch):
    run_dir = os.path.join(scratch, algo)
    marks = (min(cfg.early_step, steps), steps)
    seen, wall = watch(train_command(algo, steps, cfg, scratch), run_dir, marks)
    (rss0, disk0, log0), (rss1, disk1, log1) = seen[marks[0]], seen[marks[1]]
    checkpoints = sorted(d for d in os.listdir(run_dir) if d.startswith("step-"))
    exact = resumed_tail_is_exact(run_dir, algo, steps, cfg, scratch)
    mib = 2**20
    print(f"| {algo} | {steps} | {wall / 60:.1f} min | {rss0 / mib:.0f} → {rss1 / mib:.0f} MiB ({rss1 / rss0:.3f}×) | "
          f"{disk0 / mib:.1f} → {disk1 / mib:.1f} MiB | {log0 / marks[0]:.0f} → {log1 / marks[1]:.0f} | "
          f"{len(checkpoints)} ({', '.join(checkpoints)}) | {'yes' if exact else 'NO'} |", flush=True)
    return exact


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, SoakConfig, "bench.soak")
    cfg = from_args(SoakConfig, parser.parse_args(argv))
    steps = {"grpo": cfg.grpo_steps, "es": cfg.es_steps}
    unknown = [a for a in cfg.algos if a not in steps]
    if unknown or any(steps[a] <= cfg.save_every for a in cfg.algos):
        sys.exit(f"error: --algos takes grpo and es, each with more steps than --save-every {cfg.save_every}")
    scratch = cfg.out or tempfile.mkdtemp(prefix="minies-soak-")
    print(f"# bench.soak: shipped model, --save-every {cfg.save_every}, steps at {cfg.early_step} and at the end")
    print("| algo | steps | wall | resident memory | disk of the run | log bytes per line | checkpoints kept at "
          "the end | resumed tail identical |")
    print("|---|---:|---:|---|---|---|---|---|")
    try:
        exact = all([soak(algo, steps[algo], cfg, scratch) for algo in cfg.algos])
    finally:
        if cfg.out is None:
            shutil.rmtree(scratch, ignore_errors=True)
    sys.exit(0 if exact else 1)


if __name__ == "__main__":
    main()
