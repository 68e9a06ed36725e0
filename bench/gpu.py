"""Every GPU check in one command, one table: train.py's algorithms for a few steps, ES's exact restore,
torchrun over NCCL, and decoding eager against compiled, on a random model of Qwen2.5-0.5B's shape.

    python -m bench.gpu                  # on one CUDA GPU, within 8 minutes on an H100-class card
    python -m bench.gpu --toy            # every part at toy size, on the CPU too (what the tests run)

Nothing is downloaded: the model is save_random_qwen2 (bench/qwen_shapes.py) with Qwen2.5's shapes, special
tokens and chat template, so loading, 8-bit conversion, generation and training run the code a real
checkpoint runs. The rows:
- train: each (algorithm, dtype) is a call of train.main in this process: pass/fail (a log row per step, no
  NaN reward), peak GPU memory (torch.cuda.max_memory_allocated, reset before each run) and the mean step time
  from the run's log.jsonl; ES in place and lowrank, in bfloat16 and in 8-bit, and GRPO (LoRA in 8-bit).
- torchrun: ES in place and GRPO under `torchrun --nproc_per_node 1` (NCCL on CUDA, gloo on a CPU), in a process
  of their own: the distributed code paths (process group, all-reduce, DDP) on the device.
- restore: 20 cycles of ES writing perturbed weights and clean ones leave every parameter and buffer
  bit-identical, per dtype.
- decode: greedy tokens/s eager against compiled (minies/runtime/decoding.py) at batches 1 to 256 in bfloat16,
  whether both give the same tokens; and whether compiled decoding follows ES's in-place writes.
"""
import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass

import torch

import train
from bench.qwen_shapes import QWEN2_SHAPES, save_random_qwen2, scaled_shape
from minies.cli import ArgumentParser, run_script
from minies.config import add_arguments, from_args, option
from minies.es import ES, ESConfig, member_seeds
from minies.models import default_device, load_model, load_tokenizer, model_device
from minies.recipes import QIU_DATA
from minies.runtime import decoding, set_up_process
from minies.rollout import generate
from minies.tasks import get_task

# The train.py flags of every run, in one place to adjust. --params '.*': ES perturbs every tensor,
# int8 ones included, so the whole write path runs (the default regex suits the shipped model only). The
# problems are a data file's, asked as instruct prompts: train.py refuses generated problems whose answers do
# not fit --max-new-tokens, and --toy's few tokens are for speed, not for answers (rows that cannot fit are
# only noted).
COMMON = ["--task", "countdown", "--data", QIU_DATA, "--prompt-style", "instruct", "--eval-problems", "8",
          "--final-samples", "1", "--eval-every", "0", "--save-every", "1000"]
# ES scores 8 members on --prompts prompts; GRPO and 3PO sample groups of 4 for half as many prompts.
ES_FLAGS = ["--algo", "es", "--population", "8", "--params", ".*"]
GRPO_FLAGS = ["--group-size", "4"]
ALGOS = {"es-inplace": ES_FLAGS + ["--mode", "inplace"], "es-lowrank": ES_FLAGS + ["--mode", "lowrank"],
         "grpo": ["--algo", "grpo"] + GRPO_FLAGS, "b3po": ["--algo", "b3po"] + GRPO_FLAGS,
         "m3po": ["--algo", "m3po"] + GRPO_FLAGS, "c3po": ["--algo", "c3po"] + GRPO_FLAGS}
TORCHRUN_ALGOS = ("es-inplace", "grpo")
# --toy: every part at toy size, on a CPU when there is no GPU (tests/test_real_shapes.py runs it).
TOY = {"shape": "scaled", "dtypes": "float32,float32+8bit", "steps": 1, "max_new_tokens": 4, "prompts": 4,
       "restore_cycles": 2, "decode_batches": "1,2", "decode_tokens": 4}
LORA_8BIT = ["--lora-rank", "16"]  # 8-bit weights are not trained directly: GRPO and 3PO train LoRA adapters


@dataclass
class CheckConfig:
    shape: str = option("0.5b", "model shape: a Qwen2.5 size, or 'scaled' (0.5B's scaled down, for CPU tests)",
                        choices=[*QWEN2_SHAPES, "scaled"])
    dtypes: str = option("bfloat16,bfloat16+8bit", "comma-separated load dtypes; +8bit: with --load-in-8bit")
    algos: str = option("es-inplace,es-lowrank,grpo", f"comma-separated algorithms to run, of {', '.join(ALGOS)}")
    # Sized to run in a few minutes on one GPU: on an H200 the 0.5B shape generates a token every 24-32
    # ms in bfloat16 and every 82-121 ms in 8-bit, and in-place ES generates for each of its 8 members.
    steps: int = option(2, "training steps per run")
    max_new_tokens: int = option(32, "completion length of every rollout")
    prompts: int = option(16, "prompts per ES step (GRPO and 3PO: half as many, 4 completions each)")
    restore_cycles: int = option(20, "perturb/clean cycles of the exact-restore check")
    decode_batches: str = option("1,8,64,256", "comma-separated batch sizes of the decoding measurement")
    decode_tokens: int = option(64, "tokens decoded per row in the decoding measurement")
    toy: bool = option(False, "every part at toy size (" + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in TOY.items())
                       + "), on the CPU when there is no GPU, with decoding compiled there too")
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


def torchrun_one(cfg, algo, dtype, model_dir, out):
    """Train one algorithm under `torchrun --nproc_per_node 1` in a process of its own: (passed, None, mean step
    seconds, error)."""
    flags = train_flags(cfg, algo, dtype, model_dir, out)
    flags[flags.index("--run-name") + 1] += "-torchrun"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "train.py", *flags]
    done = subprocess.run(command, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          capture_output=True, text=True)
    if done.returncode:
        return False, None, float("nan"), (done.stderr.strip().splitlines() or ["failed"])[-1]
    with open(os.path.join(out, f"{algo}-{dtype}-torchrun", "log.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return len(rows) == cfg.steps, None, rows[-1]["seconds"] / len(rows), None


def synchronize():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


@torch.no_grad()
def decoding_speed(model_dir, dtype, batches, new_tokens):
    """Greedy decoding of `new_tokens` tokens for each batch of Countdown prompts, eager and compiled
    (minies/runtime/decoding.py), each timed on its second call (the first compiles and records):
    ([(batch, eager tokens/s, compiled tokens/s, same tokens)], whether compiled decoding follows ES's in-place
    writes: a member's weights change the tokens sampled with one seed, and the clean weights give the clean
    tokens back; sampled, as a random model's greedy tokens hardly depend on its weights)."""
    tok = load_tokenizer(model_dir)
    eager, compiled = (load_model(model_dir, dtype).requires_grad_(False) for _ in range(2))
    task = get_task("countdown", prompt_style="instruct")
    rows = []
    for batch in batches:
        prompts = task.prompts(tok, task.test_problems()[:batch])
        runs = []
        for model, compile_decoding in ((eager, False), (compiled, True)):
            generate(model, tok, prompts, new_tokens, greedy=True, micro_batch=batch, compile_decoding=compile_decoding)
            synchronize()
            start = time.perf_counter()
            r = generate(model, tok, prompts, new_tokens, greedy=True, micro_batch=batch,
                         compile_decoding=compile_decoding)
            synchronize()
            runs.append((r.completion_ids, r.completion_ids.numel() / (time.perf_counter() - start)))
        (eager_ids, eager_speed), (compiled_ids, compiled_speed) = runs
        rows.append((batch, eager_speed, compiled_speed, torch.equal(eager_ids, compiled_ids)))
    return rows, follows_in_place_writes(compiled, tok, task, prompts, new_tokens, batches[-1])


def follows_in_place_writes(model, tok, task, prompts, new_tokens, micro_batch):
    """Whether compiled decoding of `prompts` (a shape already compiled) sees an ES member's weights written in
    place, and the clean weights again after them."""
    es = ES(model, tok, task, ESConfig(params=".*", mode="inplace", sigma=0.1))  # a σ that surely changes tokens

    def decoded():
        return generate(model, tok, prompts, new_tokens, micro_batch=micro_batch).completion_ids

    clean = decoded()
    for t in es.tensors:
        t.write_perturbed(seed=1, sign=1.0, sigma=es.config.sigma)
    member = decoded()
    for t in es.tensors:
        t.write_clean()
    return not torch.equal(member, clean) and torch.equal(decoded(), clean)


def build_model(cfg, out):
    """Save the random model under test; the full shapes in bfloat16 (half the disk and load time)."""
    shape = scaled_shape("0.5b") if cfg.shape == "scaled" else QWEN2_SHAPES[cfg.shape]
    return save_random_qwen2(os.path.join(out, "model"), shape, "float32" if cfg.shape == "scaled" else "bfloat16")


def check(cfg, out):
    """Every part, then one table; returns its rows: (part, setting, passed, peak GiB or None, measured, note)."""
    model_dir = build_model(cfg, out)
    dtypes, algos = cfg.dtypes.split(","), cfg.algos.split(",")
    rows = [("train", f"{algo} {dtype}", *step_row(run_one(cfg, algo, dtype, model_dir, out)))
            for dtype in dtypes for algo in algos]
    rows += [("torchrun", f"{algo} {dtypes[0]}", *step_row(torchrun_one(cfg, algo, dtypes[0], model_dir, out)))
             for algo in TORCHRUN_ALGOS]
    rows += [("restore", f"{cfg.restore_cycles} cycles {dtype}", restore_is_exact(model_dir, dtype, cfg.restore_cycles),
              None, "bit-exact", None) for dtype in dtypes]
    devices = decoding.DEVICES
    if cfg.toy:
        decoding.DEVICES = ("cuda", "cpu")  # compiled on a CPU too, as tests/test_decoding.py runs it
    try:
        speeds, follows = decoding_speed(model_dir, dtypes[0].partition("+")[0],
                                         [int(b) for b in cfg.decode_batches.split(",")], cfg.decode_tokens)
    finally:
        decoding.DEVICES = devices
    rows += [("decode", f"batch {batch} {dtypes[0].partition('+')[0]}", same, None,
              f"{eager:.0f} -> {compiled:.0f} tok/s ({compiled / eager:.1f}x)", None if same else "tokens differ")
             for batch, eager, compiled, same in speeds]
    rows.append(("decode", "follows ES's in-place writes", follows, None, "-", None))
    print_table(cfg, rows)
    return rows


def step_row(result):
    passed, peak, step_s, error = result
    return passed, peak, f"{step_s:.2f} s/step", error


def print_table(cfg, rows):
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    print(f"\n# bench.gpu: {cfg.shape} shape, {cfg.steps} steps, {cfg.max_new_tokens} new tokens, on {device}")
    print("| part | setting | result | peak GiB | measured |\n|---|---|---|---:|---|")
    for part, setting, passed, peak, measured, note in rows:
        peak_text = f"{peak:.2f}" if peak is not None else "-"
        print(f"| {part} | {setting} | {'pass' if passed else 'FAIL'} | {peak_text} | {measured}"
              + (f"; {note}" if note else "") + " |")


def main(argv=None):
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, CheckConfig, "bench.gpu")
    cfg = from_args(CheckConfig, parser.parse_args(argv))
    set_up_process(default_device())  # every process-wide setting, as train.py makes them (minies/runtime)
    if cfg.toy:
        for key, value in TOY.items():
            setattr(cfg, key, value)
    elif not torch.cuda.is_available():
        print("bench.gpu needs a CUDA GPU (or --toy, which runs every part at toy size on the CPU); nothing to do here")
        return None
    if cfg.out:
        return check(cfg, cfg.out)
    with tempfile.TemporaryDirectory() as out:
        return check(cfg, out)


if __name__ == "__main__":
    run_script(main)
