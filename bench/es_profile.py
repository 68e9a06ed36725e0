"""Where one ES step's time goes, in both modes, against plain generation of the same rows.

    python -m bench.es_profile --model smollm2-135m --population 4 --prompts 16 --micro-batch 64 --new-tokens 8
    python -m bench.es_profile --model smollm2-135m --population 4 --prompts 256 --micro-batch 1024 --new-tokens 8

One step of each mode runs under torch.profiler after a warm-up step, and its time is split by the ranges the
code marks (minies/es.py, minies/perturbed.py), each counted without the marked ranges inside it, and the
low-rank hooks by a clock around each call (a profiler range in a hook that runs once per layer and token would
cost more than some of the hooks' own work):
- generation: es.rollout without the hooks and the verifier: the model's forward passes and decoding;
- low-rank hooks: adding σ·A(Bᵀx) to each Linear's output, per Linear call and per member block;
- noise (es.noise): drawing ε (in place) or the factors A, B (lowrank) from their seeds;
- weight writes (es.write): cast(master + σ·ε) into the model and the clean weights back;
- verifier (es.verify): task.score of every completion;
- update (es.update): the seeded sum into the masters;
- drift (es.drift): ‖θ − θ0‖ for the log, θ0 read back from its file;
- other: the rest (prompts, normalizing the rewards, the log row, the factors' stacking).
Plain generation of the same N·P rows in the same calls is timed beside it (the fastest of --repeats). The
profiler slows every range a little, so the shares matter more than the seconds; bench.es times the steps.
With --noise-cache-gib, in place also runs with the step's noise kept (minies/perturbed.py's StepNoise, drawn in
the background while the member before generates) up to that much host memory: does the overlap pay here?
"""
import argparse
import time
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile

from bench.es import BenchConfig, back_to_start, bench_task, build, make_es, plain_generation, plain_rows, timed
from minies.cli import ArgumentParser, run_script
from minies import eggroll, perturbed
from minies.config import add_arguments, from_args, option
from minies.models import default_device
from minies.runtime import set_up_process

PARTS = ("es.rollout", "es.noise", "es.write", "es.verify", "es.update", "es.drift")
NAMES = {"es.rollout": "generation", "es.hooks": "low-rank hooks", "es.noise": "noise", "es.write": "weight writes",
         "es.verify": "verifier", "es.update": "update", "es.drift": "drift"}


@dataclass
class ProfileConfig(BenchConfig):
    modes: list = option(("inplace", "lowrank"), "the modes to profile", nargs="+", type=str,
                         choices=["inplace", "lowrank"])
    noise_cache_gib: float = option(0.0, "also profile in place with the step's noise kept in up to this much host "
                                    "memory (0: not)", check="non_negative")


def exclusive_seconds(events):
    """{range: seconds} over the PARTS ranges of a profile, each without the PARTS ranges nested in it, and
    {range: calls}."""
    seconds, calls = dict.fromkeys(PARTS, 0.0), dict.fromkeys(PARTS, 0)

    def nested(event):  # the time of the outermost PARTS ranges below `event`
        return sum(child.cpu_time_total if child.name in PARTS else nested(child) for child in event.cpu_children)

    for event in events:
        if event.name in PARTS:
            seconds[event.name] += (event.cpu_time_total - nested(event)) / 1e6
            calls[event.name] += 1
    return seconds, calls


def timed_hooks(clock):
    """Wrap lowrank's hooks so that each call's time is added to clock[0] and counted in clock[1]."""
    population = eggroll.LowRankPopulation
    for name in ("hook", "lookup_hook"):
        def timed_hook(self, module, inputs, output, hook=getattr(population, name)):
            start = time.perf_counter()
            result = hook(self, module, inputs, output)
            if module in self.active:
                clock[0] += time.perf_counter() - start
                clock[1] += 1
            return result
        setattr(population, name, timed_hook)


def profile_step(es, problems, step_seed, clock):
    """(wall seconds, {part: seconds}, {part: calls}) of one ES step under the profiler, the hooks' time taken out
    of generation's."""
    clock[:] = [0.0, 0]
    with profile(activities=[ProfilerActivity.CPU]) as profiled:
        seconds, _ = timed(lambda: es.step(problems, seed=step_seed), es.model)
    parts, calls = exclusive_seconds(profiled.events())
    parts["es.rollout"] -= clock[0]
    parts["es.hooks"], calls["es.hooks"] = clock
    return seconds, parts, calls


def print_profile(label, step_s, plain_s, rows, parts, calls, members_per_call):
    print(f"\n{label}: step {step_s:.2f} s under the profiler; plain generation of the same "
          f"{rows} rows {plain_s:.2f} s (step / plain: {step_s / plain_s:.2f})")
    print("| part | seconds | share of the step | ÷ plain generation |")
    print("| --- | --- | --- | --- |")
    for name in ("es.rollout", "es.hooks", *PARTS[1:]):
        print(f"| {NAMES[name]} | {parts[name]:.3f} | {100 * parts[name] / step_s:.1f}% | "
              f"{parts[name] / plain_s:.3f} |")
    other = step_s - sum(parts.values())
    print(f"| other | {other:.3f} | {100 * other / step_s:.1f}% | {other / plain_s:.3f} |")
    if calls["es.hooks"]:
        per_call = parts["es.hooks"] / calls["es.hooks"]
        print(f"hooks: {calls['es.hooks']} calls, {1e6 * per_call:.0f} µs per Linear call, "
              f"{1e6 * per_call / members_per_call:.0f} µs per member block ({members_per_call} per call)")


def main():
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p, ProfileConfig, "bench.es_profile")
    args = from_args(ProfileConfig, p.parse_args())
    set_up_process(default_device())
    torch.set_grad_enabled(False)
    model, tok = build(args)
    task, problems = bench_task(args, model)
    rows = plain_rows(args, tok, task, problems)
    print(f"# bench.es_profile: {args.model}, N={args.population}, P={args.prompts}, {args.new_tokens} new tokens, "
          f"--micro-batch {args.micro_batch}, {torch.get_num_threads()} threads")
    clock = [0.0, 0]
    timed_hooks(clock)
    # in place before lowrank: lowrank's hooks stay on the model (idle) once it has run
    runs = [(mode, cache) for mode in sorted(args.modes)
            for cache in ((0, args.noise_cache_gib) if mode == "inplace" and args.noise_cache_gib else (0,))]
    for mode, cache_gib in runs:
        if cache_gib:
            perturbed.NOISE_CACHE_BYTES = int(cache_gib * 2**30)
        es = make_es(args, model, tok, task, mode)
        es.step(problems, seed=0)  # warm-up: the first step pays for one-time work
        plain_s, _ = timed(lambda: plain_generation(args, model, tok, task, rows), model, args.repeats)
        step_s, parts, calls = profile_step(es, problems, 1, clock)
        members_per_call = max(1, args.micro_batch // args.prompts) if mode == "lowrank" else 1
        label = mode + (f", the step's noise kept ({'on' if es.step_noise else 'off: over'} {cache_gib:g} GiB)"
                        if cache_gib else "")
        print_profile(label, step_s, plain_s, len(rows), parts, calls, members_per_call)
        back_to_start(es)

if __name__ == "__main__":
    run_script(main)
