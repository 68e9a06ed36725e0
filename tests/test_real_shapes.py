"""The real-model path on Qwen2.5's architecture and formats, with random weights and no download:
a scaled-down Qwen2.5-0.5B saved like a hub model (bench/qwen_shapes.py), loaded in float32 and 8-bit,
its ChatML template, left-padded generation and re-scoring, and bench/gpu.py run on the CPU."""
import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from bench import gpu
from bench.qwen_shapes import (QWEN2_SHAPES, SYSTEM, memory_rows, memory_table, parameter_count, save_random_qwen2,
                               scaled_shape)
from conftest import REPO
from minies.models import load_model, load_tokenizer
from minies.recipes import prompt_style_for
from minies.perturbed import PerturbedTensor
from minies.rollout import completion_logprobs, generate


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    return save_random_qwen2(tmp_path_factory.mktemp("qwen-scaled"), scaled_shape("0.5b"))


@pytest.fixture(scope="module")
def qwen(qwen_dir):
    return load_model(qwen_dir, device="cpu"), load_tokenizer(qwen_dir)


def test_parameter_count_matches_the_model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    for name in QWEN2_SHAPES:  # tied (0.5b, 1.5b) and untied (7b)
        shape = scaled_shape(name)
        model = Qwen2ForCausalLM(Qwen2Config(**shape))
        assert parameter_count(shape)["total"] == sum(p.numel() for p in model.parameters())
    assert round(parameter_count(QWEN2_SHAPES["0.5b"])["total"] / 1e6) == 494  # the model card's 0.49B


def test_tokenizer_chatml_and_special_ids(qwen):
    _, tok = qwen
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text == (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                    "<|im_start|>assistant\n")
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>" and tok.padding_side == "left"
    sample = "<think>3 + 4</think>\n<answer>(75 - 3) * 2 / 4</answer>"
    assert tok.decode(tok(sample, add_special_tokens=False)["input_ids"]) == sample


def test_instruct_prompts_render_in_chatml(qwen_dir, qwen):
    """What an instruction-tuned Qwen model is shown: its default system message, the instruct question as
    the user turn, then the assistant turn opened for the completion."""
    from minies.models import load_config
    from minies.rollout import format_prompts
    from minies.tasks import get_task

    assert prompt_style_for("auto", load_config(qwen_dir)) == "instruct"  # no minies_recipe: a hub model
    task = get_task("countdown", prompt_style="instruct")
    problem = task.test_problems()[0]
    [prompt] = format_prompts(qwen[1], [problem.question])
    assert prompt == (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{problem.question}<|im_end|>\n"
                      "<|im_start|>assistant\n")
    assert problem.question.startswith(f"Using the numbers [{', '.join(map(str, problem.numbers))}], create an "
                                       f"equation that equals {problem.answer}.")


def test_loads_in_float32_and_8bit(qwen_dir, qwen):
    import bitsandbytes as bnb

    model, tok = qwen
    assert model.config.eos_token_id == tok.eos_token_id and model.config.pad_token_id == tok.pad_token_id
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied, as Qwen2.5-0.5B
    assert model.model.layers[0].self_attn.q_proj.bias is not None  # Qwen2's q/k/v biases
    eight = load_model(qwen_dir, load_in_8bit=True, device="cpu")
    linears = [m for name, m in eight.named_modules() if name.endswith("_proj")]
    assert linears and all(isinstance(m, bnb.nn.Linear8bitLt) for m in linears)
    assert not isinstance(eight.lm_head, bnb.nn.Linear8bitLt)  # bitsandbytes skips the head


def test_generate_left_padded_and_rescoring_match(qwen, one_thread):
    model, tok = qwen
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
               for q in ("1 2 3", "using 10, 20 and 35, make 45", "x")]
    r = generate(model, tok, prompts, max_new_tokens=6, greedy=True)
    assert r.prompt_mask[:, 0].tolist().count(0) == 2  # the two shorter prompts are left-padded
    eos = r.completion_ids.eq(tok.eos_token_id)
    after_eos = (eos.int().cumsum(-1) - eos.int()).gt(0)
    assert torch.equal(r.completion_mask.bool(), ~after_eos)  # the mask stops right after the first EOS
    with torch.no_grad():
        batch = completion_logprobs(model, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask)
        for i in range(len(prompts)):
            real = r.prompt_mask[i].bool()
            alone = completion_logprobs(model, r.prompt_ids[i:i + 1, real], r.prompt_mask[i:i + 1, real],
                                        r.completion_ids[i:i + 1], r.completion_mask[i:i + 1])
            keep = r.completion_mask[i].bool()
            torch.testing.assert_close(batch[i, keep], alone[0, keep], atol=1e-4, rtol=0)


def test_every_gpu_check_runs_at_toy_size_on_cpu(tmp_path, one_thread, capsys):
    """python -m bench.gpu --toy: ES in place and lowrank and GRPO for a step of train.py on Qwen2.5's shapes and
    formats, in float32 and in 8-bit; ES and GRPO under torchrun (gloo here); the exact restore; decoding eager
    against compiled (compiled on the CPU here), with the same greedy tokens; one table."""
    rows = gpu.main(["--toy", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert [(part, setting) for part, setting, *_ in rows] == [
        ("train", "es-inplace float32"), ("train", "es-lowrank float32"), ("train", "grpo float32"),
        ("train", "es-inplace float32+8bit"), ("train", "es-lowrank float32+8bit"), ("train", "grpo float32+8bit"),
        ("torchrun", "es-inplace float32"), ("torchrun", "grpo float32"),
        ("restore", "2 cycles float32"), ("restore", "2 cycles float32+8bit"),
        ("decode", "batch 1 float32"), ("decode", "batch 2 float32"), ("decode", "follows ES's in-place writes")]
    assert all(passed for _, _, passed, *_ in rows), out
    assert out.count("| pass |") == len(rows) and "| torchrun | grpo float32 | pass |" in out


def test_the_memory_table_in_the_docs_is_the_one_qwen_shapes_computes():
    """docs/real-models.md shows memory_table()'s rows as they are computed (python -m bench.qwen_shapes)."""
    docs = (REPO / "docs" / "real-models.md").read_text()
    rows = [line for line in memory_table().splitlines() if line.startswith("| ") and not line.startswith("| method")]
    assert len(rows) == 6 and all(row in docs for row in rows)
    # ES in bfloat16 on the device: the weights, and 8 B per weight of the largest tensor (measured below)
    count = parameter_count(QWEN2_SHAPES["7b"])
    assert memory_rows(QWEN2_SHAPES["7b"])[0][1:3] == ("bfloat16", 2 * count["total"] + 8 * count["largest"])


class PeakBytes(TorchDispatchMode):
    """The peak bytes of the tensors that the ops run inside it allocate and keep alive at once (an op's
    output that shares an input's storage, as an in-place op's does, allocates nothing)."""

    def __init__(self):
        super().__init__()
        self.live, self.peak, self.alive = 0, 0, set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        inputs = {a.untyped_storage().data_ptr() for a in tensors}
        for t in (t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)):  # not a profiler range's handle
            key, size = t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()
            if key not in inputs and key not in self.alive:
                self.alive.add(key)
                self.live += size
                self.peak = max(self.peak, self.live)
                weakref.finalize(t, self.free, key, size)
        return out

    def free(self, key, size):
        self.alive.discard(key)
        self.live -= size


@pytest.mark.parametrize("masters,expected", [("host", 8), ("device", 4)])
def test_writing_a_perturbed_tensor_holds_what_the_memory_table_counts(masters, expected):
    """While in-place ES writes a tensor with its master in host memory, the device holds σ·ε (computed in
    the drawn ε itself) and the master's copy at once: 8 bytes per weight, what memory_rows counts for the
    largest tensor; 4 with the masters on the device (σ·ε alone: it is cast into the model as it is copied)."""
    layer = torch.nn.Linear(100, 100, bias=False).to(torch.bfloat16)
    t = PerturbedTensor(0, "weight", layer.weight, layer)
    assert t.master.dtype == torch.float32  # the master, copied at first use: before the write, as ES's θ0 does
    # On a CPU the master is already where the param is; on CUDA a host master is copied to the device.
    t.on_device = (lambda: t.master.clone()) if masters == "host" else (lambda: t.master)
    with torch.no_grad(), PeakBytes() as peak:
        t.write_perturbed(seed=1, sign=1.0, sigma=0.01)
    assert peak.peak == expected * layer.weight.numel() and peak.live == 0


def test_generation_stops_at_every_end_token_the_model_declares(qwen_dir, one_thread):
    """Qwen2.5-Instruct's generation_config lists two end tokens, <|im_end|> and <|endoftext|>: a completion
    ends at either, and its mask, truncation flag and text treat them alike."""
    from minies.rollout import stop_token_ids

    model, tok = load_model(qwen_dir, device="cpu"), load_tokenizer(qwen_dir)
    end_of_text = tok.convert_tokens_to_ids("<|endoftext|>")
    assert stop_token_ids(model, tok) == sorted([tok.eos_token_id, end_of_text])  # saved as Qwen2.5-Instruct's
    model.generation_config.eos_token_id = tok.eos_token_id  # first, a model that declares only its EOS
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
               for q in ("1 2 3", "using 10, 20 and 35, make 45")]
    plain = generate(model, tok, prompts, max_new_tokens=8, greedy=True)
    # Make <|endoftext|> win wherever the token the model first emits would: its (tied) embedding row becomes
    # a longer copy of that token's, so its logit is larger wherever that one's is positive.
    first = plain.completion_ids[0, 0].item()
    with torch.no_grad():
        model.get_input_embeddings().weight[end_of_text] = 2 * model.get_input_embeddings().weight[first]
    assert stop_token_ids(model, tok) == [tok.eos_token_id]
    runs_on = generate(model, tok, prompts, max_new_tokens=8, greedy=True)
    assert runs_on.completion_ids[0, 0] == end_of_text and runs_on.completion_mask[0].all()  # not an end token
    model.generation_config.eos_token_id = [tok.eos_token_id, end_of_text]
    assert stop_token_ids(model, tok) == sorted([tok.eos_token_id, end_of_text])
    r = generate(model, tok, prompts, max_new_tokens=8, greedy=True)
    assert r.completion_ids[0, 0] == end_of_text
    assert r.completion_mask[0].tolist() == [1] + [0] * (r.completion_ids.shape[1] - 1)
    assert not r.truncated[0] and r.lengths[0] == 1 and r.texts[0] == ""
    for row in range(len(prompts)):  # every row: ended exactly when one of the two end tokens is in its mask
        ends = torch.isin(r.completion_ids[row], torch.tensor([tok.eos_token_id, end_of_text]))
        assert bool((ends & r.completion_mask[row].bool()).any()) == (not r.truncated[row])
