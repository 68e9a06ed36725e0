"""Train a run to a budget of generated training tokens, resumably: the equal budgets of bench/reproduce.py and
bench/smollm2.py.

Every run generates the same number of training tokens, as counted by train.py's log (all completion tokens
sampled for training; evaluations excluded). Steps are whole and cost different tokens per method, so a run is
trained in two pieces: first to 90% of the steps estimated from its rollouts per step and the start model's mean
completion length, then resumed (train.py --resume, bit-identical to an unbroken run) to the steps that the tokens
of those first steps say the budget holds. The lengths and evaluation points depend on nothing else, so a run
stopped anywhere (a kill, the end of a session) and started again with the same call ends exactly where an
unbroken one does.
"""
import json
import os

import train
from minies.runtime.checkpoint import written


def read_log(run_dir):
    with open(os.path.join(run_dir, "log.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def write_json(path, value):
    """Write `value` to `path` whole or not at all (a kill mid-write leaves the old file or none)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with written(path + ".tmp") as f:
        json.dump(value, f, indent=1)
    os.replace(path + ".tmp", path)


def is_trained(run_dir):
    return os.path.exists(os.path.join(run_dir, "budget.json"))


def train_to_budget(run_dir, flags, tokens, estimate):
    """Train the run at `run_dir` (train.py `flags`, without --out, --run-name and --steps) until it has generated
    `tokens` training tokens, resuming what is there; `estimate`: the steps the budget is estimated to hold.
    Returns {steps, tokens, seconds} (also kept in the run's budget.json, the mark of a finished run)."""
    done = os.path.join(run_dir, "budget.json")
    if os.path.exists(done):
        with open(done) as f:
            return json.load(f)
    out, name = os.path.split(run_dir)
    flags = [*flags, "--out", out, "--run-name", name, "--resume"]  # --resume: a new run starts at step 0
    first = max(1, int(0.9 * estimate))
    for piece in (1, 2):
        rows = read_log(run_dir) if os.path.exists(os.path.join(run_dir, "log.jsonl")) else []
        # Sized from the tokens of the first piece's steps alone, so that a stop anywhere gives the same length.
        steps = first if piece == 1 else max(first, round(tokens * first / rows[first - 1]["tokens"]))
        if not rows or rows[-1]["step"] < steps:
            train.main([str(f) for f in flags + ["--steps", steps]])
    rows = read_log(run_dir)
    # The log's "seconds" restart at 0 with each resumed piece: the run's wall time is the sum of the pieces'.
    seconds = sum(a["seconds"] for a, b in zip(rows, rows[1:] + [None]) if b is None or b["seconds"] < a["seconds"])
    result = {"steps": rows[-1]["step"], "tokens": rows[-1]["tokens"], "seconds": seconds}
    write_json(done, result)
    return result
