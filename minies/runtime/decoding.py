"""Decoding faster than transformers' eager loop: compiled on a GPU, with a cache that grows in place and
pre-packed weights on a CPU.

On a GPU: a static KV cache and a compiled decoding step, so that each generated token costs a replay of
recorded CUDA graphs instead of a forward pass launched kernel by kernel from Python.

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
batches hold many members, so per-token overhead is already shared by many rows. On a CPU decoding is eager,
the path every result in this repository was measured on, made faster with the same tokens (below).

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

On a CPU, whatever `compile_decoding` says (nothing is padded, so lowrank ES's hooks find their blocks):
transformers' own eager generate, with two of its costs removed.
- The KV cache grows in place (GrowingLayer): each layer's keys and values are written into buffers with room
  to spare, doubled when full, and attention reads their filled part, the very values transformers'
  DynamicCache holds; DynamicCache copies its whole cache into a new one at every token instead.
- Linear layers multiply by their weight packed by MKL for the batch's rows (packed_linears), which MKL's
  matmul otherwise repacks at every call: one more pass over every weight per token. A generate call still
  decoding after PACKED_AFTER steps (fewer would not win back the packing) packs the weights as they are
  then, so in-place writes between calls (ES's members, IVON's samples, optimizer steps) are decoded as
  written. The prompt's pass (other rows) multiplies by the weights
  themselves. A packed product rounds like the plain one at some row counts and differently at others
  (SmolLM2-135M's logits, of size ~30, moved by up to 1e-4); greedy and sampled tokens equal transformers'
  eager decoding on the shipped models and SmolLM2-135M (tests/test_decoding.py, bench/decode.py).
Not used on a CPU, as measured (docs/speed.md, "Decoding on a CPU"): torch.compile (inductor without CUDA
graphs: faster than eager at batch 1 only, slower from batch 32, after minutes of compiling), a StaticCache
(attention over its whole length cost what the copies saved), bfloat16 (tokens differ from float32's, and
without AMX its matmuls are slower).
"""
import contextlib
import functools
import inspect
import weakref

import torch
from transformers import CompileConfig, DynamicCache, StaticCache, StoppingCriteria, StoppingCriteriaList
from transformers.cache_utils import DynamicLayer

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
    return {**{name: value[pick] for name, value in enc.items()}, cache_keyword(model): cache,
            "compile_config": compile_config(device),
            "stopping_criteria": StoppingCriteriaList([PaddingRows(torch.arange(padded, device=device) >= rows)])}


def cache_keyword(model):
    """The keyword of the model's forward (and generate) that takes a cache: `cache` (transformers from 5.2x) or
    `past_key_values`."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def compile_config(device):
    """transformers' default on CUDA (inductor, "reduce-overhead": CUDA graphs); plain inductor on other
    devices (the tests' CPU), which have no CUDA graphs. Marked to compile on any device: compilable() has
    decided, and transformers' own check would refuse a CPU."""
    config = CompileConfig(mode="reduce-overhead" if device.type == "cuda" else "default")
    config._compile_all_devices = True
    return config


# On a CPU: eager decoding without its two avoidable costs.


class GrowingLayer(DynamicLayer):
    """A DynamicCache layer whose keys and values are written into buffers with room to spare; update returns
    the filled part, the tensors a DynamicLayer would hold, without concatenating the whole cache again at
    every token. A full buffer is replaced by one twice as long (HEADROOM positions past the first update to
    start with), never longer than `capacity` (the prompt and every new token): a copy at each doubling, and
    at most twice the memory of the tokens held, however large max_new_tokens is. For one generate call,
    which neither reorders nor crops its cache."""

    HEADROOM = 64

    def __init__(self, capacity):
        super().__init__()
        self.capacity = capacity

    def lazy_initialization(self, key_states, value_states):
        super().lazy_initialization(key_states, value_states)
        self.key_buffer, self.value_buffer = key_states[:, :, :0], value_states[:, :, :0]  # the first update makes room
        self.keys, self.values = self.key_buffer, self.value_buffer

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self.keys.shape[-2]
        end = start + key_states.shape[-2]
        if end > self.capacity:  # a slice past the buffer would take the write silently, as nothing
            raise ValueError(f"a GrowingLayer of {self.capacity} positions cannot hold {end}")
        if end > self.key_buffer.shape[-2]:
            self.key_buffer, self.value_buffer = (
                self.grow(buffer, start, min(self.capacity, max(end + self.HEADROOM, 2 * buffer.shape[-2])), states)
                for buffer, states in ((self.key_buffer, key_states), (self.value_buffer, value_states)))
        self.key_buffer[:, :, start:end] = key_states
        self.value_buffer[:, :, start:end] = value_states
        self.keys, self.values = self.key_buffer[:, :, :end], self.value_buffer[:, :, :end]
        return self.keys, self.values

    @staticmethod
    def grow(buffer, filled, size, states):
        rows, heads, _, width = states.shape
        larger = states.new_empty(rows, heads, size, width)
        larger[:, :, :filled] = buffer[:, :, :filled]
        return larger


def growing_cache(model, capacity, cache=None):
    """{keyword: cache} for generate: `cache` (a DynamicCache, holding the shared prompts' keys and values) or
    a new one for `model`, each of its full-attention layers made a GrowingLayer of `capacity` positions (the
    prompt and every new token) that starts with what the layer held. Other layers (sliding windows) stay."""
    cache = cache if cache is not None else DynamicCache(config=model.config)
    cache.layers = [grown(layer, capacity) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return {cache_keyword(model): cache}


def grown(layer, capacity):
    growing = GrowingLayer(capacity)
    if layer.get_seq_length() > 0:
        growing.update(layer.keys, layer.values)
    return growing


# The smallest weight packed_linears packs: packing a small matrix costs a fixed ~10 µs per call, and the shipped
# models' layers (at most 66K weights) decoded no faster packed. SmolLM2-135M's smallest are 111K.
PACKED_WEIGHTS = 100_000
# The decoding step after which a call packs. Packing all of SmolLM2-135M's layers takes 0.1-0.2 s (two threads),
# which each step at 8 to 64 rows wins back at 15-37 ms; but a call's rows often end long before its
# max_new_tokens (SmolLM2's equations after ~8 tokens), so packing at the start of every call with room for 32
# tokens ran 0.88-1.02x as fast where its rows ended early. A call that is still decoding after PACKED_AFTER
# steps has shown it is long: it packs then, if max_new_tokens leaves it PACKED_AFTER more (docs/speed.md).
PACKED_AFTER = 16


def pack_after(max_new_tokens):
    """The step after which a call of `max_new_tokens` packs its weights (None: it never does)."""
    return PACKED_AFTER if max_new_tokens >= 2 * PACKED_AFTER else None


class PackedLinears(StoppingCriteria):
    """Every float32 nn.Linear of `model` with at least PACKED_WEIGHTS weights, made to multiply inputs of `rows`
    rows (a decoding step of that batch) by its weight packed by MKL for that shape, packed from the weight as
    it is then; inputs of other rows (the prompt's pass) by the weight itself. Nothing is packed for one row (a
    matrix-vector product, which packing does not speed up) or where torch has no MKL. Hooks on the layers run
    as before. `pack()` packs them; as a stopping criterion of generate (one that never stops a row) it packs
    at its `after`-th call, after that many decoding steps; `unpack()` gives back the class's forward."""

    def __init__(self, model, rows, after):
        self.rows, self.after, self.steps, self.packed = rows, after, 0, []
        self.linears = [m for m in model.modules() if type(m) is torch.nn.Linear and m.weight.dtype == torch.float32
                        and m.weight.numel() >= PACKED_WEIGHTS]
        if rows < 2 or not torch.backends.mkl.is_available():
            self.linears = []

    def pack(self):
        for layer in self.linears:
            packed = torch.ops.mkl._mkl_reorder_linear_weight(layer.weight, self.rows)
            layer.forward = functools.partial(packed_forward, layer, packed, self.rows)
        self.packed = self.linears

    def unpack(self):
        for layer in self.packed:
            del layer.forward  # the class's forward again
        self.packed = []

    def __call__(self, input_ids, scores, **kwargs):
        self.steps += 1
        if self.steps == self.after:
            self.pack()
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


@contextlib.contextmanager
def packed_linears(model, rows, after=0):
    """Within it, `model`'s large linear layers multiply `rows` rows by packed weights (PackedLinears): packed at
    once (`after` 0), or by the PackedLinears it yields, once generate has called it `after` times (None:
    never)."""
    packer = PackedLinears(model, rows, after)
    if after == 0:
        packer.pack()
    try:
        yield packer
    finally:
        packer.unpack()


def packed_forward(layer, packed, rows, x):
    return torch.ops.mkl._mkl_linear(x, packed, layer.weight, layer.bias, rows)
