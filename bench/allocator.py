"""Generation on a CPU with glibc's default malloc against the setting minies makes (minies/runtime/allocator.py).

    python -m bench.allocator                               # the 0.5B shape, bfloat16, 512 rows, 8 new tokens
    python -m bench.allocator --rows 64 --dtype float32

malloc's thresholds are process-wide, so each setting runs in a fresh process, the two in turn, each timing
plain generation of the same rows (after one untimed call) and, with `--lowrank-members` k > 0, the same rows
generated as k lowrank ES members (the hooks at work); the fastest of --repeats, and the process's peak
resident memory. Prints both and their ratios.
"""
import argparse
import json
import resource
import subprocess
import sys
import time
from dataclasses import dataclass

import torch

from bench.es import BenchConfig, bench_task, build, make_es
from minies.runtime import allocator
from minies.config import add_arguments, from_args, option
from minies.es import member_seeds
from minies.models import DTYPES
from minies.rollout import format_prompts, generate

SETTINGS = ("default", "reuse")


@dataclass
class AllocatorBenchConfig:
    model: str = option("qwen0.5b-random", "model under test", choices=["shipped", "qwen0.5b-random"])
    dtype: str = option("bfloat16", "the model's dtype", choices=list(DTYPES))
    rows: int = option(512, "rows per generate call", check="count")
    lowrank_members: int = option(2, "also time the rows as this many lowrank ES members (0: plain only)",
                                  check="non_negative")
    new_tokens: int = option(8, "new tokens per row", check="count")
    repeats: int = option(2, "timed calls per setting; the fastest is kept", check="count")


def child(args, setting):
    """One setting's measurements in this process: {"plain_s", "lowrank_s", "tokens", "peak_mib"}."""
    if setting != "default":  # "default": malloc as glibc sets it
        allocator.reuse_freed_memory()
    k = max(1, args.lowrank_members)
    config = BenchConfig(model=args.model, dtype=args.dtype, population=k, prompts=args.rows // k,
                         micro_batch=args.rows, new_tokens=args.new_tokens, prompt_style="terse")
    torch.set_grad_enabled(False)
    model, tok = build(config)
    task, problems = bench_task(config, model)
    rows = format_prompts(tok, [p.question for p in problems]) * k

    def fastest(fn):
        fn()
        seconds = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            fn()
            seconds.append(time.perf_counter() - start)
        return min(seconds)

    result = {"plain_s": fastest(lambda: generate(model, tok, rows, args.new_tokens, greedy=True,
                                                  micro_batch=args.rows)), "tokens": len(rows) * args.new_tokens}
    if args.lowrank_members:
        es = make_es(config, model, tok, task, "lowrank")
        members = member_seeds(0, k, True)
        result["lowrank_s"] = fastest(lambda: es.score(members, problems, 0))
    result["peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p, AllocatorBenchConfig, "bench.allocator")
    p.add_argument("--setting", choices=SETTINGS, help=argparse.SUPPRESS)  # internal: one setting, this process
    ns = p.parse_args(argv)
    args = from_args(AllocatorBenchConfig, ns)
    if ns.setting:
        print(json.dumps(child(args, ns.setting)))
        return
    if args.lowrank_members % 2 or args.rows % max(1, args.lowrank_members):
        sys.exit(f"error: --lowrank-members {args.lowrank_members}: ES's members come in mirrored pairs, and "
                 f"--rows {args.rows} must split into them; give an even count that divides --rows, or 0")
    print(f"# bench.allocator: {args.model} {args.dtype}, {args.rows} rows, {args.new_tokens} new tokens, "
          f"on CPU, {torch.get_num_threads()} threads")
    results = {}
    for setting in SETTINGS:
        out = subprocess.run([sys.executable, "-m", "bench.allocator", *(argv or sys.argv[1:]), "--setting", setting],
                             capture_output=True, text=True)
        if out.returncode:
            sys.exit(f"error: the {setting} process failed: {out.stderr.strip().splitlines()[-1]}")
        results[setting] = r = json.loads(out.stdout.strip().splitlines()[-1])
        line = f"malloc {setting:8s} plain generation {r['tokens'] / r['plain_s']:7.0f} tokens/s"
        if "lowrank_s" in r:
            line += f"   lowrank members {r['tokens'] / r['lowrank_s']:7.0f} tokens/s ({r['lowrank_s'] / r['plain_s']:.3f}× plain's time)"
        print(line + f"   peak RSS {r['peak_mib']:.0f} MiB")
    d, m = results["default"], results["reuse"]
    print(f"reuse ÷ default: plain generation {d['plain_s'] / m['plain_s']:.2f}× as fast"
          + (f", lowrank {d['lowrank_s'] / m['lowrank_s']:.2f}× as fast" if "lowrank_s" in d else "")
          + f"; peak RSS {m['peak_mib'] / d['peak_mib']:.2f}×")


if __name__ == "__main__":
    main()
