"""CPU decoding against the machine's limits: transformers' eager `generate`, the compiled path forced onto the
CPU, and minies' CPU decoding (minies/runtime/decoding.py), side by side in one run.

    python -m bench.decode                                         # SmolLM2-135M-Instruct, batches 1 8 32 64
    python -m bench.decode --model shipped --batches 1 4 --new-tokens 4 --paths eager minies

First the two bounds, measured here: the memory bandwidth (the fastest of 5 sums over 1 GiB) and the matmul rate
(the fastest of 5 products of two 2048 × 2048 matrices, in float32 and in bfloat16). A decoding step reads every
weight once and does 2 FLOPs per weight and row, so at `rows` rows it takes at least the longer of
weight bytes ÷ bandwidth and 2 · parameters · rows ÷ matmul rate (in the model's dtype); the KV cache and
attention are left out. Then, per batch, each path decodes the same prompts (the model's recipe's task) greedily
for --new-tokens tokens, every row to the end (no end token stops it): one untimed call per path (the compiled
path compiles in it), whose tokens are compared with eager's, then --repeats timed calls per path in turn, the
fastest kept. Printed: tokens/s of the whole call (the prompt's pass and minies' weight packing included) and of
its decoding steps alone (from the first new token to the last), that rate as a fraction of the bound, and
minies' speed-up over eager.
"""
import argparse
import contextlib
import time
from dataclasses import dataclass

import torch
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

from bench.es import model_name, prompt_style
from minies.config import add_arguments, from_args, option, option_of
from minies.models import load_model, load_tokenizer
from minies.options import ModelOptions
from minies.rollout import encode
from minies.runtime import decoding, set_up_process
from minies.tasks import TaskOptions, get_task

PATHS = ("eager", "compiled", "minies")


@dataclass
class DecodeConfig:
    model: str = option("smollm2-135m", "model under test: shipped, or any name or path --model takes")
    dtype: str = option_of(ModelOptions, "dtype")
    prompt_style: str = option_of(TaskOptions, "prompt_style")
    batches: tuple = option((1, 8, 32, 64), "rows per generate call, one table row each", nargs="+",
                            type=int)
    new_tokens: int = option(64, "new tokens per row (at least 2: one prompt pass, then decoding steps)",
                             check="count")
    repeats: int = option(3, "timed calls per path and batch; the fastest is kept", check="count")
    paths: tuple = option(PATHS, "what decodes: transformers' eager generate, the compiled path (a static cache "
                          "and torch.compile, as on CUDA), minies' CPU decoding", nargs="+", type=str,
                          choices=list(PATHS))


def fastest(f, repeats=5):
    """The fastest of `repeats` timings of f(), in seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return min(times)


def bandwidth():
    """Bytes per second that reading 1 GiB of float32 (a sum) streams from memory."""
    x = torch.ones(2**28)
    return x.numel() * 4 / fastest(x.sum)


def matmul_rate(dtype, n=2048):
    """FLOPs per second of an n × n matmul in `dtype`."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    return 2 * n**3 / fastest(lambda: a @ b)


class Clock(StoppingCriteria):
    """Notes the time at every new token; stops nothing."""

    def __init__(self):
        self.times = []

    def __call__(self, input_ids, scores, **kwargs):
        self.times.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def decode(path, model, enc, config):
    """One greedy generate call along `path`: its new tokens, the seconds of the whole call and of its decoding
    steps (first new token to last). minies' path is what rollout.generate runs on a CPU."""
    rows, width = enc["input_ids"].shape
    inputs, packed = dict(enc), contextlib.nullcontext()
    if path == "compiled":
        inputs = decoding.static_inputs(model, enc, config.max_new_tokens, rows)
    elif path == "minies":
        inputs.update(decoding.growing_cache(model, width + config.max_new_tokens))
        packed = decoding.packed_linears(model, rows, decoding.pack_after(config.max_new_tokens))  # as generate
    clock = Clock()
    inputs["stopping_criteria"] = StoppingCriteriaList([*inputs.get("stopping_criteria", []), clock])
    start = time.perf_counter()
    with packed as packer:
        if packer:
            inputs["stopping_criteria"].append(packer)
        tokens = model.generate(**inputs, generation_config=config)[:rows, width:]
    return tokens, time.perf_counter() - start, clock.times[-1] - clock.times[0]


def bound(rows, parameters, weight_bytes, bytes_per_second, flops_per_second):
    """Tokens per second a decoding step of `rows` rows cannot beat: the longer of reading every weight once
    and 2 FLOPs per weight and row."""
    return rows / max(weight_bytes / bytes_per_second, 2 * parameters * rows / flops_per_second)


def measure(cfg, model, enc, config):
    """{path: (tokens of the untimed call, fastest call seconds, fastest decoding seconds)} for one batch."""
    first = {path: decode(path, model, enc, config)[0] for path in cfg.paths}
    best = {path: (float("inf"), float("inf")) for path in cfg.paths}
    for _ in range(cfg.repeats):
        for path in cfg.paths:  # in turn: a drift in the machine's speed reaches every path alike
            _, call, steps = decode(path, model, enc, config)
            best[path] = (min(best[path][0], call), min(best[path][1], steps))
    return {path: (first[path], *best[path]) for path in cfg.paths}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, DecodeConfig, "bench.decode")
    cfg = from_args(DecodeConfig, parser.parse_args())
    if cfg.new_tokens < 2:
        parser.error("--new-tokens: at least 2 (decoding steps follow the prompt's pass)")
    set_up_process("cpu")  # every process-wide setting, as train.py makes them (minies/runtime)
    model = load_model(model_name(cfg), cfg.dtype, device="cpu").requires_grad_(False)
    tok = load_tokenizer(model_name(cfg))
    task = get_task("arithmetic", prompt_style=prompt_style(cfg, model), max_new_tokens=cfg.new_tokens)
    prompts = task.prompts(tok, task.train_problems(max(cfg.batches), seed=0))
    # No end token: every row decodes all new tokens, so each call runs the same steps.
    config = GenerationConfig(max_new_tokens=cfg.new_tokens, do_sample=False, pad_token_id=tok.pad_token_id,
                              eos_token_id=[])
    parameters = sum(p.numel() for p in model.parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    rates = {dtype: matmul_rate(dtype) for dtype in (torch.float32, torch.bfloat16)}
    per_second = bandwidth()
    print(f"{cfg.model}: {parameters / 1e6:.1f}M parameters, {weight_bytes / 1e6:.0f} MB in {cfg.dtype}; "
          f"{torch.get_num_threads()} threads; {cfg.new_tokens} new tokens per row")
    print(f"memory bandwidth {per_second / 1e9:.1f} GB/s; matmul float32 {rates[torch.float32] / 1e9:.0f} GFLOP/s, "
          f"bfloat16 {rates[torch.bfloat16] / 1e9:.0f} GFLOP/s")
    for rows in cfg.batches:
        flops = rates[model.dtype]
        limit = bound(rows, parameters, weight_bytes, per_second, flops)
        by_bytes = bound(rows, 0, weight_bytes, per_second, flops)
        print(f"batch {rows}: bound {limit:,.0f} tok/s ({'bandwidth' if limit == by_bytes else 'matmul'}-bound; "
              f"bandwidth alone {by_bytes:,.0f}, matmul alone {bound(rows, parameters, 0, per_second, flops):,.0f})",
              flush=True)
        results = measure(cfg, model, encode(tok, prompts[:rows]), config)
        eager = results.get("eager")
        for path, (tokens, call, steps) in results.items():
            decoding_rate = rows * (cfg.new_tokens - 1) / steps
            line = (f"  {path:<9} call {rows * cfg.new_tokens / call:8,.1f} tok/s   decoding {decoding_rate:8,.1f} "
                    f"tok/s   {decoding_rate / limit:4.0%} of the bound")
            if eager and path != "eager":
                line += (f"   same greedy tokens: {'yes' if torch.equal(tokens, eager[0]) else 'no'}   "
                         f"×{eager[1] / call:.2f} eager (call), ×{eager[2] / steps:.2f} (decoding)")
            print(line, flush=True)


if __name__ == "__main__":
    main()
