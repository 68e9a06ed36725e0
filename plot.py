"""Draw a run's curves: training reward, held-out accuracy and entropy against steps, from the log.jsonl and
summary.json that train.py writes.

    python plot.py out/es-arithmetic-seed0                     # writes out/es-arithmetic-seed0/curves.png
    python plot.py out/es-arithmetic-seed0 out/grpo-arithmetic-seed0 --out compare.png

Several runs are drawn on the same axes. matplotlib is optional (the library never plots): `pip install
matplotlib` when this script asks for it.
"""
import argparse
import json
import os

from minies import UserError
from minies.cli import ArgumentParser, check_writable, run_script

# (log key of every step, log key of the held-out evaluations, summary.json key, panel title)
PANELS = [("reward_mean", None, None, "training reward (mean over the step's completions)"),
          (None, "heldout_pass@1", "pass@1", "held-out pass@1"),
          (None, "heldout_greedy", "greedy_accuracy", "held-out greedy accuracy"),
          ("entropy", "heldout_entropy", "entropy", "token entropy (nats)")]


def read_run(run_dir):
    """(log rows, summary or None) of a run directory; a UserError naming what is missing."""
    log = os.path.join(run_dir, "log.jsonl")
    try:
        with open(log) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        raise UserError(f"{log}: cannot read it ({e}); pass the directory of a run train.py wrote") from None
    if not rows:
        raise UserError(f"{log} has no steps yet")
    summary = os.path.join(run_dir, "summary.json")
    try:
        with open(summary) as f:
            return rows, json.load(f)
    except (OSError, ValueError):
        return rows, None  # a run still in progress: no before/after points yet


def points(rows, summary, step_key, heldout_key, summary_key):
    """The (steps, values) of one panel: every step's value of `step_key`, or the held-out evaluations of
    `heldout_key` with summary.json's before (step 0) and after (last step) around them."""
    if step_key and any(step_key in r for r in rows):
        return [r["step"] for r in rows if step_key in r], [r[step_key] for r in rows if step_key in r]
    found = [(r["step"], r[heldout_key]) for r in rows if heldout_key in r]
    if summary and summary_key in summary["before"]:
        found = [(0, summary["before"][summary_key])] + found + [(rows[-1]["step"], summary["after"][summary_key])]
    return [s for s, _ in found], [v for _, v in found]


def main(argv=None):
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="run directories written by train.py")
    parser.add_argument("--out", default=None, help="the PNG to write (default: curves.png in the first run's "
                                                   "directory)")
    cfg = parser.parse_args(argv)
    out = cfg.out or os.path.join(cfg.runs[0], "curves.png")
    check_writable(os.path.dirname(out) or ".", "--out")
    runs = {os.path.basename(os.path.normpath(run)): read_run(run) for run in cfg.runs}
    try:
        import matplotlib
    except ImportError:
        raise UserError("plotting needs matplotlib, which minies does not require: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(4.2 * len(PANELS), 3.4))
    for ax, (step_key, heldout_key, summary_key, title) in zip(axes, PANELS):
        for name, (rows, summary) in runs.items():
            steps, values = points(rows, summary, step_key, heldout_key, summary_key)
            if values:
                ax.plot(steps, values, marker="o" if len(values) < 20 else None, markersize=3, label=name)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


if __name__ == "__main__":
    run_script(main)
