"""Model and tokenizer loading: float32, bfloat16 and 8-bit (bitsandbytes on the CPU), the shipped model,
and one-line errors for bad paths and dtypes."""
import os

import pytest
import torch

from minies import UserError
from minies.models import SHIPPED_MODEL, load_model, load_tokenizer, model_device
from minies.rollout import format_prompts, generate

pytestmark = pytest.mark.usefixtures("one_thread")


def _prompts(tokenizer, task, count=4):
    return format_prompts(tokenizer, [p.question for p in task.test_problems()[:count]])


def _generates(model, tokenizer, prompts, greedy=False):
    r = generate(model, tokenizer, prompts, max_new_tokens=12, greedy=greedy, seed=0)
    assert len(r.texts) == len(prompts)
    assert r.completion_ids.shape[0] == len(prompts) and r.completion_ids.shape[1] >= 1
    assert r.completion_mask.sum() > 0
    return r


def test_tokenizer_is_set_up_for_batched_generation(tokenizer):
    assert tokenizer.padding_side == "left"
    assert tokenizer.pad_token_id is not None


def test_tokenizer_without_pad_token_gets_eos(tokenizer, tmp_path):
    import copy

    tok = copy.deepcopy(tokenizer)
    tok.pad_token = None
    tok.save_pretrained(tmp_path)
    reloaded = load_tokenizer(str(tmp_path))
    assert reloaded.pad_token_id == reloaded.eos_token_id == tokenizer.eos_token_id
    assert reloaded.padding_side == "left"


def test_load_float32(model, tokenizer, task):
    assert not model.training
    assert model_device(model).type == "cpu"
    assert all(p.dtype == torch.float32 for p in model.parameters())
    _generates(model, tokenizer, _prompts(tokenizer, task))


def test_load_bfloat16(model_dir, tokenizer, task):
    m = load_model(model_dir, dtype="bfloat16", device="cpu")
    assert all(p.dtype == torch.bfloat16 for p in m.parameters())
    r = _generates(m, tokenizer, _prompts(tokenizer, task))
    from minies.rollout import completion_logprobs

    lp = completion_logprobs(m, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask)
    assert lp.dtype == torch.float32 and torch.isfinite(lp).all()


def test_load_8bit_on_cpu(model_dir, model, tokenizer, task):
    import bitsandbytes as bnb

    m = load_model(model_dir, load_in_8bit=True, device="cpu")
    int8 = [name for name, mod in m.named_modules() if isinstance(mod, bnb.nn.Linear8bitLt)]
    assert int8, "no Linear8bitLt after load_in_8bit"
    # Every linear layer of the decoder is quantized, with int8 weights; the output head is not.
    assert all(mod.weight.dtype == torch.int8 for mod in m.modules() if isinstance(mod, bnb.nn.Linear8bitLt))
    n_linear = sum(isinstance(mod, torch.nn.Linear) for mod in model.modules())
    assert len(int8) == n_linear - 1
    assert not isinstance(m.get_output_embeddings(), bnb.nn.Linear8bitLt)
    assert model_device(m).type == "cpu"
    prompts = _prompts(tokenizer, task, 8)
    r = _generates(m, tokenizer, prompts, greedy=True)
    # Quantization is a small perturbation: the 8-bit model's next-token logits stay close to float32's.
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        a = model(**enc).logits[:, -1].float()
        b = m(**enc).logits[:, -1].float()
    assert torch.isfinite(b).all()
    assert torch.nn.functional.cosine_similarity(a, b, dim=-1).min() > 0.9
    assert r.texts == generate(m, tokenizer, prompts, max_new_tokens=12, greedy=True).texts


@pytest.mark.skipif(not os.path.exists(os.path.join(SHIPPED_MODEL, "config.json")),
                    reason="the shipped model minies/assets/tiny is not built yet")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_head_multiplies_a_prompts_last_position_without_copying_its_weight(model_dir, tokenizer, dtype):
    """At a prompt's pass generate asks for the last position's logits, a strided view of the hidden states.
    With frozen weights (ES, a LoRA base) torch's matmul would multiply that view by the head's weight
    repeated per row (a batched matmul: 4.3 GB and 12 s for 16 rows at Qwen2.5-0.5B's size in bfloat16);
    load_model hands the head a contiguous row instead. The logits are the same to rounding."""
    model = load_model(model_dir, dtype).requires_grad_(False)
    head = model.get_output_embeddings()
    enc = tokenizer(["1+2=", "12+34+5="], return_tensors="pt", padding=True)

    def batched_head_products():
        with torch.no_grad(), torch.profiler.profile(record_shapes=True) as prof:
            logits = model(**enc, logits_to_keep=1).logits
        weight_shape = list(head.weight.T.shape)
        return logits, [e for e in prof.events() if e.name == "aten::bmm" and weight_shape in
                        [shape[1:] for shape in e.input_shapes]]

    logits, copies = batched_head_products()
    assert copies == []
    head._forward_pre_hooks.clear()  # what transformers alone does
    unhooked, copies = batched_head_products()
    assert len(copies) == 1
    torch.testing.assert_close(logits, unhooked)


def test_shipped_model_loads_and_generates(task):
    tok = load_tokenizer()
    m = load_model()
    problems = task.test_problems()[:16]
    r = generate(m, tok, format_prompts(tok, [p.question for p in problems]), task.max_new_tokens, greedy=True)
    # The warm start taught it the answer format: most greedy answers are well formed.
    scores = [task.score(t, p) for t, p in zip(r.texts, problems)]
    assert sum(not s.malformed for s in scores) >= len(scores) // 2, r.texts


def test_missing_model_directory_is_a_user_error(tmp_path):
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(UserError, match="no such directory"):
        load_model(missing)
    with pytest.raises(UserError, match="no such directory"):
        load_tokenizer(missing)


def test_directory_without_a_model_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="cannot load"):
        load_model(str(tmp_path), device="cpu")


def test_bad_dtype_is_a_user_error(model_dir):
    with pytest.raises(UserError, match="--dtype"):
        load_model(model_dir, dtype="float8")
