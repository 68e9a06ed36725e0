"""bench/soak.py watches a run end to end at toy length: it reads memory, disk and the log at two steps, keeps the
newest checkpoints only, and finds the resumed tail identical (its figures are measured, never asserted)."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_soak_prints_its_figures_and_the_resumed_tail_is_identical(tmp_path):
    out = subprocess.run([sys.executable, "-m", "bench.soak", "--algos", "grpo", "--grpo-steps", "8", "--save-every",
                          "4", "--early-step", "4", "--out", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    row = re.search(r"^\| grpo \| 8 \|.*\| ([0-9.]+) → ([0-9.]+) MiB \(([0-9.]+)×\) \|.*\| "
                    r"2 \(step-000004, step-000008\) \| yes \|$", out.stdout, re.M)
    assert row, out.stdout
    assert float(row.group(1)) > 0 and float(row.group(3)) > 0
    assert sorted(os.listdir(tmp_path / "grpo")) == ["config.json", "latest", "log.jsonl", "step-000004", "step-000008",
                                                     "summary.json"]


def test_soak_refuses_a_run_shorter_than_its_checkpoint_interval():
    out = subprocess.run([sys.executable, "-m", "bench.soak", "--algos", "grpo", "--grpo-steps", "5",
                          "--save-every", "10"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and out.stderr.strip().startswith("error:") and len(out.stderr.strip().splitlines()) == 1
