"""Decoding (minies/runtime/decoding.py). Compiled: the rule and its flag, the buckets, and, forced onto the CPU, greedy
tokens identical to eager decoding whatever the rows and prompt widths, and weights written in place (in-place
ES's members, IVON's samples) decoded at once and restored exactly. The module compiles once (inductor on a
CPU: tens of seconds); every compiled call stays in that one graph (8 rows, a 32-token cache). On a CPU: the
growing cache holds what transformers' DynamicCache holds, packed weights multiply as the weights do and are
packed from the weights as they are at each call, and generate's tokens, greedy and sampled, equal transformers'
own eager decoding."""
import contextlib
import types

import pytest
import torch
from torch._dynamo.utils import counters
from transformers.cache_utils import DynamicLayer

import eval as eval_script
import train
from conftest import DenseArithmetic, single_thread
import minies.es as es_module
from minies.es import ES, ESConfig, member_seeds
from minies.runtime import decoding
from minies.ivon import IVON
from minies.models import load_model, load_tokenizer
from minies.rollout import encode, format_prompts, generate, shared_prompt_cache
from minies.tasks import Arithmetic

pytestmark = pytest.mark.usefixtures("one_thread")

# Questions of different lengths, so that a batch needs left padding.
QUESTIONS = ["1+2+3", "45+67+89", "7+8+9", "10+2+33", "99+98+97", "0+0+1", "5+50+5", "12+34+56"]
NEW_TOKENS = 10  # with these prompts, within a 32-token cache


@pytest.fixture(scope="module")
def m(tiny_model_dir):
    """Two copies of the test model, one decoding compiled on the CPU, one eagerly, with their tokenizer and
    prompts; the first compiled call (the compile) made, and the count of graphs it left."""
    with pytest.MonkeyPatch.context() as patch, single_thread():
        patch.setattr(decoding, "DEVICES", ("cuda", "cpu"))
        # Without gradients from the start, as ES and generation run them: a tensor's requires_grad is part of
        # what a compiled graph is specialized on.
        compiled = load_model(tiny_model_dir, device="cpu").requires_grad_(False)
        eager = load_model(tiny_model_dir, device="cpu").requires_grad_(False)
        tok = load_tokenizer(tiny_model_dir)
        prompts = format_prompts(tok, QUESTIONS)
        greedy(compiled, tok, prompts)
        yield types.SimpleNamespace(compiled=compiled, eager=eager, tok=tok, prompts=prompts,
                                    graphs=counters["stats"]["unique_graphs"])


def greedy(model, tok, prompts, compile_decoding=True):
    return generate(model, tok, prompts, NEW_TOKENS, greedy=True, micro_batch=8, compile_decoding=compile_decoding)


def eager_at_compiled_weights(m, prompts=None):
    """The eager model's greedy completions at the compiled model's weights as they are now."""
    m.eager.load_state_dict(m.compiled.state_dict())
    return greedy(m.eager, m.tok, prompts or m.prompts, compile_decoding=False)


def assert_same(a, b):
    assert torch.equal(a.completion_ids, b.completion_ids) and a.texts == b.texts


def test_the_rule_and_its_flag(tiny_model_dir, monkeypatch):
    layer = torch.nn.Linear(2, 2)
    assert not decoding.compilable(layer)  # a CPU: eager
    monkeypatch.setattr(decoding, "DEVICES", ("cuda", "cpu"))
    assert decoding.compilable(layer)
    quantized = torch.nn.Linear(2, 2)
    quantized.hf_quantizer = types.SimpleNamespace(is_compileable=False)  # as bitsandbytes' 8-bit
    assert not decoding.compilable(quantized)
    asked = []
    monkeypatch.setattr(es_module, "generate", lambda *a, **kw: asked.append(kw["compile_decoding"]) or 1 / 0)
    for mode in ("lowrank", "inplace"):
        es = ES(load_model(tiny_model_dir, device="cpu"), load_tokenizer(tiny_model_dir), Arithmetic(test_size=10),
                ESConfig(population=4, prompts_per_step=8, mode=mode))
        with pytest.raises(ZeroDivisionError):
            es.step(es.task.train_problems(8, seed=0), seed=0)
    assert asked == [False, True]  # lowrank's hooks keep decoding eager; in place may compile
    assert train.parse_args([])[0].compile_decoding and eval_script.parse_args([]).compile_decoding
    assert not train.parse_args(["--no-compile-decoding"])[0].compile_decoding
    assert not eval_script.parse_args(["--no-compile-decoding"]).compile_decoding


def test_buckets():
    assert [decoding.bucket(n) for n in (1, 2, 3, 5, 8, 9, 33)] == [1, 2, 4, 8, 8, 16, 64]
    assert decoding.bucket(200, 256) == 256 and decoding.bucket(300, 384) == 384  # a full micro-batch: unpadded
    assert decoding.bucket(3, 384) == 4


def test_greedy_tokens_equal_eager_decoding(m):
    assert_same(greedy(m.compiled, m.tok, m.prompts), greedy(m.eager, m.tok, m.prompts, compile_decoding=False))
    # 5 rows, padded to 8 (the padding rows finished at once), and wider prompts: the same graph
    assert_same(greedy(m.compiled, m.tok, m.prompts[:5]), greedy(m.eager, m.tok, m.prompts[:5], compile_decoding=False))
    wider = format_prompts(m.tok, [q + "+100" for q in QUESTIONS])
    assert_same(greedy(m.compiled, m.tok, wider), greedy(m.eager, m.tok, wider, compile_decoding=False))
    [(rows, cache)] = decoding.CACHES[m.compiled].items()  # one cache, reused by every call
    assert rows == 8 and cache.get_max_length() == 32
    assert counters["stats"]["unique_graphs"] == m.graphs >= 1


def test_sampling_is_seeded(m):
    def sample(seed):
        return generate(m.compiled, m.tok, m.prompts, NEW_TOKENS, micro_batch=8, seed=seed)

    assert_same(sample(1), sample(1))
    assert not torch.equal(sample(1).completion_ids, sample(2).completion_ids)
    assert counters["stats"]["unique_graphs"] == m.graphs


def test_in_place_es_members_are_decoded_and_restored(m):
    """Each member's weights, written into the parameters between calls, are what the compiled step decodes
    (the same tokens as eager decoding at those weights), and the clean weights give the clean tokens."""
    task = DenseArithmetic(test_size=10)  # a reward per character: the members' rewards differ
    es = ES(m.compiled, m.tok, task, ESConfig(population=4, prompts_per_step=8, mode="inplace", sigma=0.05))
    clean = greedy(m.compiled, m.tok, m.prompts)
    for seed, sign in member_seeds(0, 4, antithetic=True):
        for t in es.tensors:
            t.write_perturbed(seed, sign, es.config.sigma)
        member = greedy(m.compiled, m.tok, m.prompts)
        assert not torch.equal(member.completion_ids, clean.completion_ids)
        assert_same(member, eager_at_compiled_weights(m))
        for t in es.tensors:
            t.write_clean()
        assert_same(greedy(m.compiled, m.tok, m.prompts), clean)
    # A whole step, compiled and eager from the same weights: the same rewards, the same update.
    m.eager.load_state_dict(m.compiled.state_dict())
    twin = ES(m.eager, m.tok, task, es.config, compile_decoding=False)
    problems = task.train_problems(8, seed=0)
    logs = [es.step(problems, seed=3), twin.step(problems, seed=3)]
    assert logs[0]["reward_mean"] == logs[1]["reward_mean"] and logs[0]["update_norm"] == logs[1]["update_norm"] > 0
    assert all(torch.equal(a, b) for a, b in zip(m.compiled.parameters(), m.eager.parameters()))
    assert counters["stats"]["unique_graphs"] == m.graphs


def test_ivon_samples_are_decoded_and_restored(m):
    """3PO generates at IVON's weight samples, written into the parameters in place."""
    optimizer = IVON(m.compiled.parameters(), lr=0.1, ess=100.0)  # σ = 0.1: a sample changes the tokens
    clean = greedy(m.compiled, m.tok, m.prompts)
    with optimizer.sampled_params(train=False):
        sample = greedy(m.compiled, m.tok, m.prompts)
        assert not torch.equal(sample.completion_ids, clean.completion_ids)
        assert_same(sample, eager_at_compiled_weights(m))
    assert_same(greedy(m.compiled, m.tok, m.prompts), clean)
    assert counters["stats"]["unique_graphs"] == m.graphs


@pytest.fixture
def transformers_eager(monkeypatch):
    """Within it, rollout.generate on a CPU decodes as transformers does alone: no growing cache, no packing."""

    @contextlib.contextmanager
    def plain():
        with monkeypatch.context() as patch:
            patch.setattr(decoding, "growing_cache", lambda model, capacity, cache=None: {} if cache is None else
                          {decoding.cache_keyword(model): cache})
            patch.setattr(decoding, "packed_linears", lambda model, rows, after=0: contextlib.nullcontext())
            yield

    return plain


def test_a_growing_layer_holds_what_a_dynamic_layer_holds():
    torch.manual_seed(0)
    growing, dynamic = decoding.GrowingLayer(capacity=9), DynamicLayer()
    buffer = None
    for length in (5, 1, 1, 2):  # a prompt's pass, then decoding steps
        k, v = torch.randn(2, 3, length, 4), torch.randn(2, 3, length, 4)
        (gk, gv), (dk, dv) = growing.update(k, v), dynamic.update(k, v)
        assert torch.equal(gk, dk) and torch.equal(gv, dv) and growing.get_seq_length() == dynamic.get_seq_length()
        buffer = buffer or gk.data_ptr()
        assert gk.data_ptr() == buffer  # written in place: nothing reallocated, nothing copied again
    with pytest.raises(ValueError, match="cannot hold 10"):  # past its capacity
        growing.update(torch.randn(2, 3, 1, 4), torch.randn(2, 3, 1, 4))


def test_a_growing_layer_doubles_its_buffer_when_full(monkeypatch):
    """A large capacity (max_new_tokens of 10**6) is not allocated: the buffer starts HEADROOM past the prompt
    and doubles when full, holding the same values as a DynamicLayer throughout."""
    monkeypatch.setattr(decoding.GrowingLayer, "HEADROOM", 4)
    torch.manual_seed(0)
    growing, dynamic = decoding.GrowingLayer(capacity=10**6), DynamicLayer()
    sizes = []
    for length in (5,) + (1,) * 40:
        k, v = torch.randn(2, 3, length, 4), torch.randn(2, 3, length, 4)
        (gk, gv), (dk, dv) = growing.update(k, v), dynamic.update(k, v)
        assert torch.equal(gk, dk) and torch.equal(gv, dv)
        sizes.append(growing.key_buffer.shape[-2])
    assert sorted(set(sizes)) == [9, 18, 36, 72]  # 5 + 4, then doubled each time it filled: 3 copies for 45 tokens
    bounded = decoding.GrowingLayer(capacity=12)
    for length in (5, 5, 2):
        bounded.update(torch.randn(2, 3, length, 4), torch.randn(2, 3, length, 4))
    assert bounded.key_buffer.shape[-2] == 12  # doubled to 18, but never past its capacity


def test_packed_weights_multiply_as_the_weights_do_and_follow_in_place_writes(monkeypatch):
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 96)
    with decoding.packed_linears(layer, rows=8):  # too small to pay for its packing
        assert "forward" not in vars(layer)
    monkeypatch.setattr(decoding, "PACKED_WEIGHTS", 64 * 96)
    seen = []
    layer.register_forward_hook(lambda module, inputs, output: seen.append(output.shape[0]))
    x, other = torch.randn(8, 64), torch.randn(5, 64)
    with torch.no_grad(), decoding.packed_linears(layer, rows=8):
        assert "forward" in vars(layer)
        torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))
        assert torch.equal(layer(other), torch.nn.functional.linear(other, layer.weight, layer.bias))  # unpacked
    assert "forward" not in vars(layer) and seen == [8, 5]  # the class's forward again; hooks ran
    with torch.no_grad():
        layer.weight.mul_(-1)  # as in-place ES writes a member
        with decoding.packed_linears(layer, rows=8):
            torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))
    with decoding.packed_linears(layer, rows=1):  # one row: a matrix-vector product, left alone
        assert "forward" not in vars(layer)
    ids = torch.zeros(8, 3, dtype=torch.long)
    with decoding.packed_linears(layer, rows=8, after=2) as packer:  # packed by generate's 2nd decoding step
        assert "forward" not in vars(layer) and not packer(ids, None).any()
        assert "forward" not in vars(layer) and not packer(ids, None).any()
        assert "forward" in vars(layer)
    assert "forward" not in vars(layer)
    with decoding.packed_linears(layer, rows=8, after=None) as packer:  # never
        for _ in range(50):
            packer(ids, None)
        assert "forward" not in vars(layer)
    assert decoding.pack_after(2 * decoding.PACKED_AFTER) == decoding.PACKED_AFTER and decoding.pack_after(2 * decoding.PACKED_AFTER - 1) is None


@pytest.mark.parametrize("rows", [1, 3, 8])
def test_cpu_decoding_gives_transformers_eager_tokens(model, tokenizer, transformers_eager, rows, monkeypatch):
    """Greedy and sampled, with and without a shared prompt pass, several micro-batches of left-padded prompts;
    every linear layer of the shipped model packed (it is too small to be by default)."""
    used = []
    packed_linears = decoding.packed_linears
    monkeypatch.setattr(decoding, "packed_linears",
                        lambda model, rows, after=0: used.append(rows) or packed_linears(model, rows, after))
    monkeypatch.setattr(decoding, "PACKED_WEIGHTS", 1)
    monkeypatch.setattr(decoding, "pack_after", lambda max_new_tokens: 2)  # packed within the call, at its 3rd step
    prompts = format_prompts(tokenizer, [q for q in QUESTIONS for _ in range(2)])[:2 * rows]
    for greedy_, share in ((True, False), (False, False), (False, True)):
        def run():
            return generate(model, tokenizer, prompts, NEW_TOKENS, greedy=greedy_, micro_batch=rows, seed=3,
                            share_prompts=share, compile_decoding=False)  # as this module's `m` lets the CPU compile

        ours = run()
        with transformers_eager():
            assert_same(ours, run())
    assert used and set(used) == {rows}


def test_a_shared_prompt_pass_grows_in_place(model, tokenizer):
    """The shared prompts' cache (rollout.shared_prompt_cache) is carried into the growing one."""
    enc = encode(tokenizer, format_prompts(tokenizer, [QUESTIONS[0]] * 3 + [QUESTIONS[1]]))
    [(keyword, shared)] = shared_prompt_cache(model, enc["input_ids"], enc["attention_mask"]).items()
    before = [(layer.keys.clone(), layer.values.clone()) for layer in shared.layers]
    [(_, grown)] = decoding.growing_cache(model, 40, shared).items()
    for layer, (keys, values) in zip(grown.layers, before):
        assert isinstance(layer, decoding.GrowingLayer) and layer.key_buffer.shape[-2] == 40
        assert torch.equal(layer.keys, keys) and torch.equal(layer.values, values)
