"""A GPU check, ready to run: every algorithm for a few steps on a random model of Qwen2.5-0.5B's shape.

    python -m bench.gpu_check                                   # on one CUDA GPU: bfloat16 and 8-bit
    python -m bench.gpu_check --shape scaled --allow-cpu --dtypes float32,float32+8bit   # CPU, seconds

Nothing is downloaded: the model is save_random_qwen2 (bench/qwen_shapes.py) with Qwen2.5's shapes,
special tokens and chat template, so loading, 8-bit conversion, generation and training run the same
code a real checkpoint runs. Each (algorithm, dtype) row is a call of train.main in this process and
reports pass/fail, peak GPU memory (torch.cuda.max_memory_allocated, reset before each run) and the
mean step time from the run's log.jsonl. Then ES's exact restore is checked on the device: 20 cycles of
writing perturbed weights and clean ones leave every parameter and buffer bit-identical. Last, decoding
(CUDA only): greedy tokens/s eager against compiled (minies/runtime/decoding.py) at batches 1 to 256 in bfloat16,
whether both give the same tokens, and whether compiled decoding follows ES's in-place writes.
"""
import argparse
import gc
import json
import os
import tempfile
import time
import traceback
from dataclasses import dataclass

import torch

import train
from bench.qwen_shapes import QWEN2_SHAPES, save_random_qwen2, scaled_shape
from minies import ArgumentParser, run_script
from minies.config import add_arguments, from_args, option
from minies.es import ES, ESConfig, member_seeds
from minies.models import default_device, load_model, load_tokenizer, model_device
from minies.runtime import set_up_process
from minies.rollout import generate
from minies.tasks import get_task

# The train.py flags of every run, in one place to adjust. --params '.*': ES perturbs every tensor,
# int8 ones included, so the whole write path runs (the default regex suits the shipped model only).
COMMON = ["--task", "countdown", "--eval-problems", "8", "--final-samples", "1", "--eval-every", "0",
          "--save-every", "1000"]
# ES scores 8 members on --prompts prompts; GRPO and 3PO sample groups of 4 for half as many prompts.
ES_FLAGS = ["--algo", "es", "--population", "8", "--params", ".*"]
GRPO_FLAGS = ["--group-size", "4"]
ALGOS = {"es-inplace": ES_FLAGS + ["--mode", "inplace"], "es-lowrank": ES_FLAGS + ["--mode", "lowrank"],
         "grpo": ["--algo", "grpo"] + GRPO_FLAGS, "b3po": ["--algo", "b3po"] + GRPO_FLAGS,
         "m3po": ["--algo", "m3po"] + GRPO_FLAGS, "c3po": ["--algo", "c3po"] + GRPO_FLAGS}
LORA_8BIT = ["--lora-rank", "16"]  # 8-bit weights are not trained directly: GRPO and 3PO train LoRA adapters


@dataclass
class CheckConfig:
    shape: str = option("0.5b", "model shape: a Qwen2.5 size, or 'scaled' (0.5B's scaled down, for CPU tests)",
                        choices=[*QWEN2_SHAPES, "scaled"])
    dtypes: str = option("bfloat16,bfloat16+8bit", "comma-separated load dtypes; +8bit: with --load-in-8bit")
    algos: str = option(",".join(ALGOS), "comma-separated algorithms to run")
    # Sized to run in a few minutes on one GPU: on an H200 the 0.5B shape generates a token every 24-32
    # ms in bfloat16 and every 82-121 ms in 8-bit, and in-place ES generates for each of its 8 members.
    steps: int = option(2, "training steps per run")
    max_new_tokens: int = option(32, "completion length of every rollout")
    prompts: int = option(16, "prompts per ES step (GRPO and 3PO: half as many, 4 completions each)")
    restore_cycles: int = option(20, "perturb/clean cycles of the exact-restore check")
    decode_batches: str = option("1,8,64,256", "comma-separated batch sizes of the decoding measurement (CUDA only)")
    decode_tokens: int = option(64, "tokens decoded per row in the decoding measurement")
    allow_cpu: bool = option(False, "without CUDA, run on the CPU instead of stopping (for tests)")
    out: str = option(None, "directory for the model and the runs (default: a temporary one)")


def train_flags(cfg, algo, dtype, model_dir, out):
    """train.py's argument list for one row of the check."""
    load_dtype, _, eight_bit = dtype.partition("+")
    flags = ["--model", model_dir, "--dtype", load_dtype, "--out", out, "--run-name", f"{algo}-{dtype}",
             "--steps", str(cfg.steps), "--max-new-tokens", str(cfg.max_new_tokens), *COMMON, *ALGOS[algo],
             *(["--prompts-per-step", str(cfg.prompts)] if algo.startswith("es") else
               ["--prompts", str(max(1, cfg.prompts // 2))])]
    if eight_bit:
        flags += ["--load-in-8bit"] + (LORA_8BIT if not algo.startswith("es") else [])
    return flags


def run_one(cfg, algo, dtype, model_dir, out):
    """Train one (algorithm, dtype) in this process: (passed, peak GiB or None, mean step seconds, error)."""
    cuda = torch.cuda.is_available()
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    try:
        train.main(train_flags(cfg, algo, dtype, model_dir, out))
        with open(os.path.join(out, f"{algo}-{dtype}", "log.jsonl")) as f:
            rows = [json.loads(line) for line in f]
        passed = len(rows) == cfg.steps and all(r["reward_mean"] == r["reward_mean"] for r in rows)  # no NaN
        error = None if passed else f"{len(rows)} log rows for {cfg.steps} steps, or a NaN reward"
        step_s = rows[-1]["seconds"] / len(rows) if rows else float("nan")
    except Exception as e:  # a row that fails must not stop the others
        traceback.print_exc()
        passed, step_s, error = False, float("nan"), f"{type(e).__name__}: {e}"
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    return passed, peak, step_s, error


def snapshot(model):
    """A copy of every parameter and buffer, to compare with bit for bit."""
    return {name: t.detach().clone() for name, t in [*model.named_parameters(), *model.named_buffers()]}


@torch.no_grad()
def restore_is_exact(model_dir, dtype, cycles):
    """Whether `cycles` ES perturb/clean cycles (each with a forward at the perturbed weights) give back
    every parameter and buffer bit-identical. One forward comes first: bitsandbytes moves the int8 row
    scales to the layer's state on the first forward, and the check is about what training sees after."""
    load_dtype, _, eight_bit = dtype.partition("+")
    model = load_model(model_dir, load_dtype, bool(eight_bit))
    tok = load_tokenizer(model_dir)
    ids = tok(["<|im_start|>user\n1 2 3<|im_end|>\n"], return_tensors="pt").to(model_device(model))
    model(**ids)
    before = snapshot(model)
    es = ES(model, tok, None, ESConfig(params=".*", mode="inplace"))
    for seed, sign in member_seeds(0, cycles, antithetic=True):
        for t in es.tensors:
            t.write_perturbed(seed, sign, es.config.sigma)
        model(**ids)
        for t in es.tensors:
            t.write_clean()
    after = snapshot(model)
    return all(torch.equal(before[name], after[name]) for name in before)


@torch.no_grad()
def decoding_speed(model_dir, batches, new_tokens):
    """Greedy decoding of `new_tokens` tokens for each batch of Countdown prompts in bfloat16, eager and compiled
    (minies/runtime/decoding.py), each timed on its second call (the first compiles and records):
    ([(batch, eager tokens/s, compiled tokens/s, same tokens)], whether compiled decoding follows ES's in-place
    writes: a member's weights change the tokens sampled with one seed, and the clean weights give the clean
    tokens back; sampled, as a random model's greedy tokens hardly depend on its weights)."""
    tok = load_tokenizer(model_dir)
    eager, compiled = (load_model(model_dir, "bfloat16").requires_grad_(False) for _ in range(2))
    task = get_task("countdown", prompt_style="instruct")
    rows = []
    for batch in batches:
        prompts = task.prompts(tok, task.test_problems()[:batch])
        runs = []
        for model, compile_decoding in ((eager, False), (compiled, True)):
            generate(model, tok, prompts, new_tokens, greedy=True, micro_batch=batch, compile_decoding=compile_decoding)
            torch.cuda.synchronize()
            start = time.perf_counter()
            r = generate(model, tok, prompts, new_tokens, greedy=True, micro_batch=batch,
                         compile_decoding=compile_decoding)
            torch.cuda.synchronize()
            runs.append((r.completion_ids, r.completion_ids.numel() / (time.perf_counter() - start)))
        (eager_ids, eager_speed), (compiled_ids, compiled_speed) = runs
        rows.append((batch, eager_speed, compiled_speed, torch.equal(eager_ids, compiled_ids)))
    es = ES(compiled, tok, task, ESConfig(params=".*", mode="inplace"))

    def decoded():  # the last batch's prompts, in the shape already compiled
        return generate(compiled, tok, prompts, new_tokens, micro_batch=batches[-1]).completion_ids

    clean = decoded()
    for t in es.tensors:
        t.write_perturbed(seed=1, sign=1.0, sigma=es.config.sigma)
    member = decoded()
    for t in es.tensors:
        t.write_clean()
    return rows, not torch.equal(member, clean) and torch.equal(decoded(), clean)


def build_model(cfg, out):
    """Save the random model under test; the full shapes in bfloat16 (half the disk and load time)."""
    shape = scaled_shape("0.5b") if cfg.shape == "scaled" else QWEN2_SHAPES[cfg.shape]
    return save_random_qwen2(os.path.join(out, "model"), shape, "float32" if cfg.shape == "scaled" else "bfloat16")


def check(cfg, out):
    """Run every row and the restore checks, print them; returns ([(algo, dtype, passed, ...)], {dtype: exact})."""
    model_dir = build_model(cfg, out)
    dtypes, algos = cfg.dtypes.split(","), cfg.algos.split(",")
    rows = [(algo, dtype, *run_one(cfg, algo, dtype, model_dir, out)) for dtype in dtypes for algo in algos]
    exact = {dtype: restore_is_exact(model_dir, dtype, cfg.restore_cycles) for dtype in dtypes}
    print(f"\n# gpu_check: {cfg.shape} shape, {cfg.steps} steps, {cfg.max_new_tokens} new tokens, on "
          f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'CPU'}")
    print(f"{'algorithm':12s} {'dtype':16s} {'result':6s} {'peak GiB':>9s} {'s/step':>8s}")
    for algo, dtype, passed, peak, step_s, error in rows:
        peak_text = f"{peak:9.2f}" if peak is not None else f"{'-':>9s}"
        print(f"{algo:12s} {dtype:16s} {'pass' if passed else 'FAIL':6s} {peak_text} {step_s:8.2f}"
              + (f"  {error}" if error else ""))
    for dtype, ok in exact.items():
        print(f"ES restore after {cfg.restore_cycles} cycles, {dtype}: {'bit-exact' if ok else 'NOT EXACT'}")
    if not torch.cuda.is_available():
        print("decoding, eager vs compiled: skipped (compiled decoding runs on CUDA only)")
        return rows, exact
    speeds, follows = decoding_speed(model_dir, [int(b) for b in cfg.decode_batches.split(",")], cfg.decode_tokens)
    print(f"\n# greedy decoding, bfloat16, {cfg.decode_tokens} tokens per row (tokens/s: rows x decoding steps)")
    print(f"{'batch':>6s} {'eager tok/s':>12s} {'compiled tok/s':>15s} {'speedup':>8s}  same tokens")
    for batch, eager_speed, compiled_speed, same in speeds:
        print(f"{batch:6d} {eager_speed:12.0f} {compiled_speed:15.0f} {compiled_speed / eager_speed:7.1f}x  "
              f"{'yes' if same else 'no'}")
    print(f"compiled decoding follows ES's in-place writes (a member changes the tokens, clean restores them): "
          f"{'yes' if follows else 'NO'}")
    return rows, exact


def main(argv=None):
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, CheckConfig, "gpu check")
    cfg = from_args(CheckConfig, parser.parse_args(argv))
    set_up_process(default_device())  # every process-wide setting, as train.py makes them (minies/runtime)
    if not torch.cuda.is_available() and not cfg.allow_cpu:
        print("bench.gpu_check needs a CUDA GPU (or --allow-cpu with --shape scaled); nothing to do here")
        return None
    if cfg.out:
        return check(cfg, cfg.out)
    with tempfile.TemporaryDirectory() as out:
        return check(cfg, out)


if __name__ == "__main__":
    run_script(main)
