"""bench/es.py and bench/allocator.py run end to end on a small configuration (its numbers are measured, never asserted), and the steps
it times make their update even when every reward ties."""
import os
import re
import subprocess
import sys

import numpy as np
import torch

from bench.es import BenchConfig, make_es
from minies.models import load_model, load_tokenizer
from minies.tasks import Arithmetic

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_bench_es_prints_every_ratio(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "bench.es", "--population", "4", "--prompts", "8", "--new-tokens", "4",
                          "--repeats", "1", "--skip-torchrun", "--scratch", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                         env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout
    for mode in ("in-place", "lowrank"):
        efficiency = float(re.search(rf"ES {mode}.*efficiency ([0-9.]+)", text).group(1))
        assert 0 < efficiency < 10
    assert re.search(r"in-place overhead, the work itself .*: [0-9.]+%", text)
    drawing = re.search(r"drawing each member.s noise once: .*, ([0-9.]+) ns per perturbed weight", text)
    assert float(drawing.group(1)) > 0
    assert re.search(r"lowrank / in-place members per second: [0-9.]+x", text)
    outside = re.search(r"time outside scoring / inside: (-?[0-9.]+)% \(lowrank: (-?[0-9.]+)%\)", text)
    assert outside and all(float(x) > -100 for x in outside.groups())
    # 4 members per generate call: lowrank (minies/runtime/placement.py), with that mode's efficiency
    picked = re.search(r"^--mode auto picks: lowrank, efficiency ([0-9.]+)$", text, re.M)
    assert picked and float(picked.group(1)) == float(re.search(r"ES lowrank.*efficiency ([0-9.]+)", text).group(1))
    ratios = [float(r) for r in re.findall(r"step: \d+ MiB .* ratio ([0-9.]+)", text)]
    assert len(ratios) == 3 and all(r > 0.5 for r in ratios)


def test_bench_es_profile_splits_each_step_into_its_parts():
    """Every part of bench.es_profile's table is measured, the parts add up to the step, the hooks are counted
    only in lowrank, and the in-place run with the step's noise kept draws no noise on the step's own thread (the
shipped model's step noise fits the default cache, so its plain in-place run keeps it too)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "bench.es_profile", "--population", "4", "--prompts", "8",
                          "--new-tokens", "4", "--repeats", "1", "--noise-cache-gib", "1"], cwd=ROOT,
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    tables = re.split(r"^\n?(inplace|lowrank)", out.stdout, flags=re.M)
    runs = {}
    for label, body in zip(tables[1::2], tables[2::2]):
        step = float(re.search(r"step ([0-9.]+) s under the profiler", body).group(1))
        parts = {name: float(seconds) for name, seconds in re.findall(r"^\| ([a-z -]+) \| (-?[0-9.]+) \|", body, re.M)}
        assert set(parts) == {"generation", "low-rank hooks", "noise", "weight writes", "verifier", "update",
                              "drift", "other"}
        assert abs(sum(parts.values()) - step) < 1e-2 and parts["generation"] > 0
        runs[label + body.split(":")[0]] = parts, body
    assert set(runs) == {"inplace", "inplace, the step's noise kept (on 1 GiB)", "lowrank"}
    assert runs["inplace"][0]["low-rank hooks"] == 0
    assert runs["inplace, the step's noise kept (on 1 GiB)"][0]["noise"] == 0
    assert runs["lowrank"][0]["low-rank hooks"] > 0 and re.search(r"hooks: \d+ calls", runs["lowrank"][1])


def test_bench_grpo_prints_the_step_and_its_split():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "bench.grpo", "--prompts", "2", "--group-size", "2", "--steps", "1",
                          "--new-tokens", "4"], cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout
    assert float(re.search(r"minies GRPO step +([0-9.]+) s", text).group(1)) > 0
    for part in ("generation", "scoring", "log-prob forward", "backward and loss", "optimizer", "other"):
        assert re.search(rf"^  {part} +-?[0-9.]+ s +-?[0-9.]+%$", text, re.M), part
    # TRL is optional: either its step is measured or one line says it was skipped.
    assert re.search(r"TRL .*GRPOTrainer( step +[0-9.]+ s|: skipped \(trl is not installed\))", text)


def test_bench_allocator_prints_both_settings_and_their_ratios():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "bench.allocator", "--model", "shipped", "--dtype", "float32",
                          "--rows", "8", "--new-tokens", "2", "--repeats", "1"], cwd=ROOT, capture_output=True,
                         text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    for setting in ("default", "reuse"):
        line = re.search(rf"^malloc {setting} +plain generation +([0-9]+) tokens/s +lowrank members +([0-9]+) "
                         r"tokens/s .* peak RSS ([0-9]+) MiB$", out.stdout, re.M)
        assert line and all(int(x) > 0 for x in line.groups()), out.stdout
    assert re.search(r"^reuse ÷ default: plain generation [0-9.]+× as fast, lowrank [0-9.]+× as fast; peak RSS "
                     r"[0-9.]+×$", out.stdout, re.M)
    odd = subprocess.run([sys.executable, "-m", "bench.allocator", "--lowrank-members", "3"], cwd=ROOT,
                         capture_output=True, text=True, env=env, timeout=600)
    assert odd.returncode == 1 and odd.stderr.strip().startswith("error: --lowrank-members 3:")


def test_bench_es_steps_make_an_update_even_when_every_reward_ties(tiny_model_dir):
    """One new token is too short for any answer, so every reward is 0 and a plain step makes no update; the
    bench's ES (distinct_rewards) makes one, as a real model's step does, and scores the same rollouts."""
    args = BenchConfig(population=4, prompts=8)
    task = Arithmetic(max_new_tokens=1)
    problems = task.train_problems(args.prompts, seed=0)
    for mode in ("inplace", "lowrank"):
        logs = []
        for distinct in (False, True):
            torch.manual_seed(0)
            es = make_es(args, load_model(tiny_model_dir, device="cpu"), load_tokenizer(tiny_model_dir), task, mode)
            if not distinct:
                del es.rollout  # the plain method again
            logs.append(es.step(problems, seed=0))
        plain, bench = logs
        assert plain["all_tied"] and plain["update_norm"] == 0.0
        assert not bench["all_tied"] and bench["update_norm"] > 0.0
        assert np.isclose(bench["reward_mean"], plain["reward_mean"], atol=1e-6) and plain["tokens"] == bench["tokens"]
