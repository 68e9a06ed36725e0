"""Decoding on a GPU: a static KV cache and a compiled decoding step, so that each generated token costs
a replay of recorded CUDA graphs instead of a forward pass launched kernel by kernel from Python.

A decoding step of a small model is bound by launches, not by the device: on an H200, Qwen2.5-0.5B took
24-32 ms per token at batch 8 in bfloat16, while reading its 1 GB of weights takes a fifth of a
millisecond. transformers has the remedy built in: `generate`, given a compilable cache (a StaticCache,
whose keys and values live in buffers of one fixed shape, written in place) on an accelerator, runs the
decoding forward through torch.compile (inductor, mode "reduce-overhead": CUDA graphs). The prompt's pass
(the prefill), sampling, stopping and the logits processors stay eager around it.

The rule: rollout.generate compiles decoding when its caller asks (`compile_decoding`, True unless
--no-compile-decoding) and compilable() allows: on CUDA, and not for 8-bit models (transformers compiles no
bitsandbytes layer). Lowrank ES asks for eager decoding (minies/eggroll.py): its forward hooks add each
member's noise to the member's own block of rows, which padding the rows to a bucket would shift; and its
batches hold many members, so per-token overhead is already shared by many rows. Everywhere else (a CPU)
decoding is eager: the path every result in this repository was measured on.

Shapes. A compiled graph, and a CUDA graph even more, holds for one shape; rollouts come in many (the last
micro-batch of an evaluation, each step's longest prompt). So each call is bucketed:
- rows: padded to the next power of two, at most the call's micro-batch (a full one is never padded). The
  padding rows repeat the first row and are finished from their first token (PaddingRows), so they never
  keep a batch generating; generate drops them.
- cache length: the next power of two of prompt + max_new_tokens (the prompt's width itself only reaches
  the eager prefill).
One StaticCache per row bucket is kept for the model's lifetime, reset in place at each call, and replaced
by a longer one when a call needs more length: the CUDA graphs read it at fixed addresses, so keeping it
is what lets each call replay them instead of recording them again. With power-of-two buckets a run's
caches take less than twice the largest one's memory. torch.compile compiles the first shape it meets and
once or twice more as the batch or the cache length first changes (then with that dimension dynamic), and
records CUDA graphs once per bucket; that cost is paid by the first calls of a run.

What the compiled path changes: greedy decoding gives the eager path's tokens up to the rounding of the
compiled kernels (identical on a CPU: tests/test_decoding.py); sampled completions differ from the eager
path's (other random draws in the padded batch), reproducibly. Rows that share a prompt do not share its
pass (rollout.shared_prompt_cache needs a dynamic cache): the prefill is a small part of a rollout next to
decoding. Weights written in place (in-place ES's members, IVON's samples, optimizer steps) are read by
the graphs where they are, so every call decodes at the weights as they are now.
"""
import inspect
import weakref

import torch
from transformers import CompileConfig, StaticCache, StoppingCriteria, StoppingCriteriaList

from minies.models import model_device

DEVICES = ("cuda",)  # device types whose decoding is compiled (the tests add "cpu")
CACHES = weakref.WeakKeyDictionary()  # model -> {padded rows: its StaticCache}


def compilable(model):
    """Whether `model` can decode with a static cache and a compiled step: on CUDA, and not 8-bit."""
    quantizer = getattr(model, "hf_quantizer", None)
    return model_device(model).type in DEVICES and (quantizer is None or quantizer.is_compileable)


def bucket(n, most=None):
    """The next power of two >= n, but at most `most` (>= n)."""
    power = 1 << (n - 1).bit_length()
    return power if most is None else min(power, most)


class PaddingRows(StoppingCriteria):
    """Finishes the padding rows at their first token: they emit pad tokens from then on and never keep
    `generate` going once the real rows are done."""

    def __init__(self, padding):
        self.padding = padding  # [rows] bool

    def __call__(self, input_ids, scores, **kwargs):
        return self.padding


def static_inputs(model, enc, max_new_tokens, most):
    """`model.generate`'s keyword arguments that decode `enc` (input_ids, attention_mask) compiled: its rows
    padded to bucket(rows, most) by repeating the first, the model's StaticCache for that bucket (reset),
    the compile settings and PaddingRows. Its first rows are `enc`'s."""
    rows, width = enc["input_ids"].shape
    device = enc["input_ids"].device
    padded = bucket(rows, most)
    pick = torch.cat([torch.arange(rows), torch.zeros(padded - rows, dtype=torch.long)]).to(device)
    length = bucket(width + max_new_tokens)
    caches = CACHES.setdefault(model, {})
    if padded not in caches or caches[padded].get_max_length() < length:
        caches[padded] = StaticCache(config=model.config, max_cache_len=length)
    cache = caches[padded]
    cache.reset()
    # transformers names the keyword `cache` (from 5.2x) or `past_key_values`.
    keyword = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    return {**{name: value[pick] for name, value in enc.items()}, keyword: cache,
            "compile_config": compile_config(device),
            "stopping_criteria": StoppingCriteriaList([PaddingRows(torch.arange(padded, device=device) >= rows)])}


def compile_config(device):
    """transformers' default on CUDA (inductor, "reduce-overhead": CUDA graphs); plain inductor on other
    devices (the tests' CPU), which have no CUDA graphs. Marked to compile on any device: compilable() has
    decided, and transformers' own check would refuse a CPU."""
    config = CompileConfig(mode="reduce-overhead" if device.type == "cuda" else "default")
    config._compile_all_devices = True
    return config
