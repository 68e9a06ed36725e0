"""How close ES gets to plain batched generation: overhead, efficiency, members/s, memory, torchrun scaling.

    python -m bench.es                              # the shipped model, ES defaults (N=32, P=256)
    python -m bench.es --model qwen0.5b-random      # a random model with Qwen2.5-0.5B's shape (no download)
    python -m bench.es --model smollm2-135m --population 30 --prompts 16   # a real model (any name or path)
    python -m bench.es --dtype bfloat16 --load-in-8bit ...

Every number is measured in this one run, side by side, and printed as ratios:
1. overhead: within a real step of each mode, the seconds outside scoring over those inside it (what the
   step waits for besides generation: writing weights, the update, noise not drawn in the background),
   read from the torch.profiler range `es.rollout` of one more step run under the profiler (which slows
   the range a little); and in place, the work itself: a step whose scoring is stubbed, over scoring the
   N members alone;
2. efficiency: generated tokens/s of an ES step over tokens/s of plain batched generation of the same
   N·P rows in the same chunks (the limit ES can approach), timed in turn with that mode's steps, for
   both modes; members/s of both modes;
   the mode `--mode auto` picks for this shape (minies.runtime.placement.choose_mode); on CUDA, the time to copy
   one member's fp32 masters from pinned host memory (what each member costs with --master-device cpu;
   with the masters on the device a member copies nothing);
3. memory: peak of an ES step (and of a GRPO step) over the peak of plain generation, each measured in
   a fresh subprocess (CUDA: max allocated on the device; CPU: the peak resident set while the workload
   runs, which includes the fp32 master copies and θ0 that ES keeps in host memory);
4. torchrun: an ES step in the mode `--mode auto` picks, with 2 processes of 1 thread each against 1 process
   of 2 threads.

Every ES step measured makes its update, as a real model's steps do: a random model's rewards all tie, and a
tied step skips its update, so each reward gets a distinct negligible offset (distinct_rewards).
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from functools import partial

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from bench.qwen_shapes import QWEN_05B
from minies.runtime import set_up_process
from minies.config import add_arguments, from_args, option, option_of
from minies.es import ES, ESConfig, ScoredRollouts, member_seeds
from minies.models import SHIPPED_MODEL, contiguous_head_input, default_device, load_model, load_tokenizer, model_device
from minies.options import TaskOptions
from minies.recipes import RECIPES, own_recipe, prompt_style_for
from minies.perturbed import noise
from minies.runtime.placement import choose_mode
from minies.rollout import generate
from minies.tasks import Score, get_task
from train import TrainConfig


@dataclass
class BenchConfig:
    model: str = option("shipped", "model under test: shipped, qwen0.5b-random, or any name or path --model takes")
    dtype: str = option_of(TrainConfig, "dtype")
    load_in_8bit: bool = option_of(TrainConfig, "load_in_8bit")
    population: int = option(32, "ES members per step (N)")
    prompts: int = option(256, "prompts per member (P)")
    micro_batch: int = option(1024, "rows per generate call (lowrank: whole members)")
    new_tokens: int = option(10, "max new tokens per row")
    prompt_style: str = option_of(TaskOptions, "prompt_style")
    params: str = option(".*", "regex of the perturbed parameters ('.*': all of them)")
    master_device: str = option_of(ESConfig, "master_device")
    repeats: int = option(3, "time each measurement this many times, keep the fastest")
    skip_torchrun: bool = option(False, "skip the 2-process measurement")
    scratch: str = option("/tmp/minies-bench", "where the 8-bit random model is saved")


def build(args):
    """The model, tokenizer and ES config under test. The random model reuses the shipped tokenizer: its
    ids fall inside Qwen's vocabulary, ids it has no character for decode to nothing, and a random model
    almost never emits EOS, so every row generates exactly max_new_tokens tokens."""
    tok = load_tokenizer(model_name(args))
    if args.model == "qwen0.5b-random":
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig, Qwen2Config
        torch.manual_seed(0)
        config = Qwen2Config(**QWEN_05B, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, args.dtype))
        if args.load_in_8bit:  # save, then load through bitsandbytes like any 8-bit checkpoint
            path = os.path.join(args.scratch, "qwen0.5b-random")
            model.save_pretrained(path)
            model = AutoModelForCausalLM.from_pretrained(
                path, quantization_config=BitsAndBytesConfig(load_in_8bit=True),
                device_map="cuda" if torch.cuda.is_available() else "cpu")
        elif torch.cuda.is_available():
            model = model.cuda()
        contiguous_head_input(model)  # as load_model does
    else:
        model = load_model(model_name(args), args.dtype, args.load_in_8bit)
    model.eval()
    return model, tok


def model_name(args):
    """What load_model and load_tokenizer read for --model (the random model borrows the shipped tokenizer)."""
    return SHIPPED_MODEL if args.model in ("shipped", "qwen0.5b-random") else args.model


def prompt_style(args, model):
    """--prompt-style, or for auto the model's own recipe's style (SmolLM2's: equation), else the model's."""
    recipe = RECIPES.get(own_recipe(model_name(args))) if args.model != "qwen0.5b-random" else None
    if args.prompt_style == "auto" and recipe and "prompt_style" in recipe.values:
        return recipe.values["prompt_style"][0]
    return prompt_style_for(args.prompt_style, model.config)


def bench_task(args, model):
    """The task every measurement uses (arithmetic in the model's prompt style, completions capped at
    --new-tokens) and its P training problems."""
    task = get_task("arithmetic", prompt_style=prompt_style(args, model),
                    max_new_tokens=args.new_tokens)
    return task, task.train_problems(args.prompts, seed=1)


def make_es(args, model, tok, task, mode):
    """The ES under test, with distinct_rewards, so that every step it takes makes an update."""
    es = ES(model, tok, task, ESConfig(population=args.population, prompts_per_step=args.prompts, mode=mode,
                                       micro_batch=args.micro_batch, params=args.params,
                                       master_device=args.master_device))
    distinct_rewards(es)
    return es


def plain_rows(args, tok, task, problems):
    """The N·P prompts ES's members read (the task's style), member-major, formatted once."""
    return task.prompts(tok, problems) * args.population


def plain_generation(args, model, tok, task, rows):
    """Generate `rows` (plain_rows, or the first of them) unperturbed, in the chunks lowrank ES uses (whole members
    per call): what ES's members generate. Returns the tokens generated."""
    chunk = max(1, args.micro_batch // args.prompts) * args.prompts
    return int(generate(model, tok, rows, task.max_new_tokens, greedy=True, micro_batch=chunk).lengths.sum())


def back_to_start(es):
    """Undo the steps `es` has made (its masters and the model back to θ0), before another mode is measured."""
    for t, t0 in zip(es.tensors, es.theta0):
        t.master.copy_(t0)
        t.write_clean()


def distinct_rewards(es):
    """Add 1e-9·(i + 1) to the reward of the i-th row es.rollout scores (counting over all its calls). A
    random model's rewards all tie, and ES skips the update of a tied step; with the offsets every member's
    mean reward differs, so the step makes its update, whose cost a real model's steps pay. The offsets
    change no timing and no memory: only which update is made."""
    rollout, scored = es.rollout, [0]

    def rollout_distinct(*args, **kwargs):
        members = rollout(*args, **kwargs)
        rows = sum(len(member.scores) for member in members)
        offsets = iter(1e-9 * (scored[0] + np.arange(1, rows + 1)))
        scored[0] += rows
        return [member._replace(scores=[replace(s, reward=s.reward + next(offsets)) for s in member.scores])
                for member in members]

    es.rollout = rollout_distinct


def sync(model):
    if model_device(model).type == "cuda":
        torch.cuda.synchronize()


def timed(fn, model, repeats=1):
    """(seconds, result) of fn(): the fastest of `repeats` calls, the least disturbed by other work."""
    best = None
    for _ in range(repeats):
        sync(model)
        start = time.perf_counter()
        out = fn()
        sync(model)
        best = min(best or float("inf"), time.perf_counter() - start)
    return best, out


def draw_noise(es, members):
    """The part of writing weights that is drawing the noise itself: one seeded randn per member and
    tensor, each dropped at once (keeping them would measure the allocator, not the generator)."""
    for seed, _ in members:
        for t in es.tensors:
            noise(seed, t.index, t.param.shape, t.param.device)


def pinned_copy_seconds(es, model, repeats):
    """Seconds to copy one member's fp32 masters from pinned host memory to the device, as a step with
    --master-device cpu does for every member; timed on pinned copies when the masters live on the device."""
    masters = [t.master if t.master.is_pinned() else t.master.cpu().pin_memory() for t in es.tensors]
    seconds, _ = timed(lambda: [m.to(model_device(model), non_blocking=True) for m in masters], model, repeats)
    return seconds


def outside_scoring(es, problems, model):
    """Of one ES step run under torch.profiler, the seconds outside its `es.rollout` range (generating and
    scoring) over those inside it: what the step waits for besides generation (writes, the update, noise
    not drawn in the background)."""
    with profile(activities=[ProfilerActivity.CPU]) as profiled:
        seconds, _ = timed(lambda: es.step(problems, seed=0), model)
    inside = sum(event.cpu_time_total for event in profiled.key_averages() if event.key == "es.rollout") / 1e6
    return (seconds - inside) / inside


def stubbed_rollout(rewards):
    """An ES.rollout that returns at once: each member it is asked for gets the next of `rewards` on every row,
    without a token."""
    return lambda problems, prompts, seed, copies, micro_batch: [
        ScoredRollouts([Score(float(next(rewards)), False, False)] * len(problems), np.zeros(len(problems), bool),
                       np.zeros(len(problems), int)) for _ in range(copies)]


def speed(args):
    model, tok = build(args)
    task, problems = bench_task(args, model)
    # The limit: plain generation of the same N·P rows, in the chunks lowrank ES uses. It is timed in turn
    # with each mode's steps, so that a drift in the machine's speed moves both sides of a ratio alike.
    rows = plain_rows(args, tok, task, problems)
    plain = partial(plain_generation, args, model, tok, task, rows)
    first_call = rows[:max(1, args.micro_batch // args.prompts) * args.prompts]
    timed(lambda: plain_generation(args, model, tok, task, first_call), model)  # a warm-up call

    result = {"auto": choose_mode(args.prompts, args.population, args.micro_batch)}
    for mode in ("inplace", "lowrank"):  # in place first: lowrank's hooks, idle, stay on the model
        es = make_es(args, model, tok, task, mode)
        plain_runs, steps = [], []
        for _ in range(args.repeats):
            plain_runs.append(timed(plain, model))
            steps.append(timed(lambda: es.step(problems, seed=0), model))
        plain_s, plain_tokens = min(plain_runs)
        step_s, stats = min(steps, key=lambda x: x[0])
        plain_tps = plain_tokens / plain_s
        result[mode] = {"step_s": step_s, "members_per_s": args.population / step_s, "plain_tokens_per_s": plain_tps,
                        "tokens_per_s": stats["tokens"] / step_s, "efficiency": stats["tokens"] / step_s / plain_tps,
                        "outside_scoring": outside_scoring(es, problems, model)}
        if mode == "inplace":  # the work plain generation does not do, against the work it does
            members = member_seeds(0, args.population, True)
            noise_s, _ = timed(lambda: draw_noise(es, members), model, args.repeats)
            copy_s = pinned_copy_seconds(es, model, args.repeats) if model_device(model).type == "cuda" else 0.0
            prompts = es.tokenize_prompts(problems)
            score_s, _ = timed(lambda: [es.rollout(problems, prompts, 0, 1, args.micro_batch) for _ in members],
                               model, args.repeats)
            # A step whose scoring returns at once: what is left is writing each member's weights, the restore
            # and the update, exactly as a step does them (the step's noise cache included).
            es.rollout = stubbed_rollout(iter(np.tile(np.linspace(0, 1, args.population), args.repeats)))
            overhead_s, _ = timed(lambda: es.step(problems, seed=0), model, args.repeats)
            result[mode].update(overhead=overhead_s / score_s, overhead_s=overhead_s, score_s=score_s,
                                noise_s=noise_s, noise_cache=es.step_noise is not None, copy_s=copy_s,
                                masters=es.resolved["master_device"], weights=sum(t.param.numel() for t in es.tensors))
        back_to_start(es)
    return result


def resident_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def memory_probe(args, what):
    """Peak memory of one workload, run in this (fresh) process. On CPU the resident set is sampled
    every 5 ms while the workload runs: the process's own high-water mark would be set by loading."""
    model, tok = build(args)
    peak = [resident_mib()]
    running = threading.Event()
    running.set()

    def sample():
        while running.is_set():
            peak[0] = max(peak[0], resident_mib())
            time.sleep(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        gpu_mib = workload(args, what, model, tok)
    finally:  # stop sampling even when the workload fails, or the process would never exit
        running.clear()
        sampler.join()
    return peak[0] if gpu_mib is None else gpu_mib


def workload(args, what, model, tok):
    task, problems = bench_task(args, model)
    cuda = model_device(model).type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    if what == "generate":
        plain_generation(args, model, tok, task, plain_rows(args, tok, task, problems))
    elif what == "grpo":
        from minies.grpo import GRPO, GRPOConfig
        for p in model.parameters():
            p.requires_grad_(p.dtype.is_floating_point)
        # 8-bit weights cannot be trained directly: GRPO trains LoRA adapters on them, as train.py does.
        lora_rank = 16 if args.load_in_8bit else 0
        prompts = args.prompts // 8 or 1
        GRPO(model, tok, task, GRPOConfig(prompts=prompts, lora_rank=lora_rank)).step(problems[:prompts], 0)
    else:
        make_es(args, model, tok, task, what).step(problems, seed=0)
    return torch.cuda.max_memory_allocated() / 2**20 if cuda else None


def probe(args, what, extra=(), env=None, launcher=None):
    cmd = (launcher or [sys.executable]) + ["-m", "bench.es", "--probe", what] + list(extra) + passthrough(args)
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if out.returncode:
        raise SystemExit(f"error: probe {what} failed: {out.stderr.strip().splitlines()[-1]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def passthrough(args):
    flags = ["--model", args.model, "--dtype", args.dtype, "--population", str(args.population),
             "--prompts", str(args.prompts), "--micro-batch", str(args.micro_batch),
             "--new-tokens", str(args.new_tokens), "--repeats", str(args.repeats), "--scratch", args.scratch,
             "--params", args.params, "--prompt-style", args.prompt_style, "--master-device", args.master_device]
    return flags + (["--load-in-8bit"] if args.load_in_8bit else [])


def step_time(args):
    """[seconds of one ES step (after a warm-up step), the mode `auto` picked] under however many processes
    launched this one (the mode counts the members on each process)."""
    from minies.runtime import distributed
    distributed.init()
    model, tok = build(args)
    task, problems = bench_task(args, model)
    es = make_es(args, model, tok, task, "auto")
    es.step(problems, seed=0)
    distributed.barrier()
    seconds, _ = timed(lambda: es.step(problems, seed=1), model, args.repeats)
    main = distributed.is_main()  # asked before close(): after it every process would be rank 0
    distributed.close()
    return [seconds, es.resolved["mode"]] if main else None


def print_speed(args, r):
    """speed()'s result `r` as the report's lines."""
    ip, lr = r["inplace"], r["lowrank"]
    for name, m in (("in-place", ip), ("lowrank", lr)):
        print(f"ES {name:9s} step {m['step_s']:7.2f} s  {m['members_per_s']:6.2f} members/s  "
              f"{m['tokens_per_s']:9.0f} tokens/s  efficiency {m['efficiency']:.2f}  "
              f"(plain generation, timed in turn: {m['plain_tokens_per_s']:.0f} tokens/s)")
    print(f"in-place step, time outside scoring / inside: {100 * ip['outside_scoring']:.1f}% "
          f"(lowrank: {100 * lr['outside_scoring']:.1f}%)")
    print(f"in-place overhead, the work itself (writes, restore and update {ip['overhead_s']:.2f} s, scoring stubbed) "
          f"/ scoring {ip['score_s']:.2f} s: {100 * ip['overhead']:.1f}%; the step's noise cache is "
          f"{'on' if ip['noise_cache'] else 'off'}")
    print(f"  drawing each member's noise once: {ip['noise_s']:.2f} s, "
          f"{1e9 * ip['noise_s'] / (ip['weights'] * args.population):.1f} ns per perturbed weight and member")
    if torch.cuda.is_available():
        gb = 4 * ip["weights"] / 1e9
        print(f"  copying one member's fp32 masters ({gb:.2f} GB) from pinned host memory: "
              f"{1e3 * ip['copy_s']:.1f} ms, {gb / ip['copy_s']:.1f} GB/s, "
              f"{100 * ip['copy_s'] / (ip['score_s'] / args.population):.0f}% of scoring "
              f"one member; this run's masters are on {ip['masters']}"
              + (" (a member copies nothing)" if ip["masters"] == "cuda" else ""))
    print(f"lowrank / in-place members per second: {lr['members_per_s'] / ip['members_per_s']:.2f}x")
    print(f"--mode auto picks: {r['auto']}, efficiency {r[r['auto']]['efficiency']:.2f}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p, BenchConfig, "bench.es")
    p.add_argument("--probe", help=argparse.SUPPRESS)  # internal: one measurement in a fresh process
    parsed = p.parse_args()
    args = from_args(BenchConfig, parsed)
    set_up_process(default_device())  # every process-wide setting, as train.py makes them (minies/runtime)
    args.probe = parsed.probe
    torch.set_grad_enabled(args.probe == "grpo")
    if args.probe:
        value = step_time(args) if args.probe == "step" else memory_probe(args, args.probe)
        if value is not None:
            print(json.dumps(value))
        return

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU, {torch.get_num_threads()} threads"
    print(f"# bench.es: {args.model} {args.dtype}{' 8-bit' if args.load_in_8bit else ''}, N={args.population}, "
          f"P={args.prompts}, {args.new_tokens} new tokens, --params {args.params!r}, on {device}")
    print_speed(args, speed(args))

    unit = "MiB allocated on the GPU" if torch.cuda.is_available() else "MiB peak RSS"
    base = probe(args, "generate")
    print(f"memory, plain generation: {base:.0f} {unit}")
    for what in ("inplace", "lowrank", "grpo"):
        value = probe(args, what)
        print(f"memory, {what:8s} step: {value:.0f} {unit}  ratio {value / base:.2f}")

    if not args.skip_torchrun and not torch.cuda.is_available():
        one = probe(args, "step", env={"OMP_NUM_THREADS": "2"})
        two = probe(args, "step", env={"OMP_NUM_THREADS": "1"},
                    launcher=[sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"])
        print(f"torchrun, the step --mode auto picks: 1 process x 2 threads {one[0]:.2f} s ({one[1]}), "
              f"2 processes x 1 thread {two[0]:.2f} s ({two[1]}), speed-up {one[0] / two[0]:.2f}x")


if __name__ == "__main__":
    main()
