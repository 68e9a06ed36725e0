"""Rollouts: completion masks (also when the pad token is the EOS token), left padding, position ids,
log-probs that match a manual forward pass, and seeded sampling."""
import copy

import pytest
import torch

from minies.rollout import (completion_logprobs, completion_mask, encode, encoded_rows, format_prompts, generate,
                            position_ids)

pytestmark = pytest.mark.usefixtures("one_thread")

# Questions of different lengths, so that a batch needs left padding.
QUESTIONS = ["1+2+3", "45+67+89", "7+8+9", "10+2+33", "99+98+97", "0+0+1", "5+50+5", "12+34+56"]


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return format_prompts(tokenizer, QUESTIONS)


@pytest.fixture(scope="module")
def eos_pad_tokenizer(tokenizer):
    """A copy of the tokenizer whose pad token is its EOS token, as with Llama-style tokenizers."""
    tok = copy.deepcopy(tokenizer)
    tok.pad_token = tok.eos_token
    assert tok.pad_token_id == tok.eos_token_id != tokenizer.pad_token_id
    return tok


def test_completion_mask_includes_the_first_eos_only():
    E = 1
    ids = torch.tensor([[5, 6, E, E, E],  # EOS then EOS-as-pad
                        [5, E, 7, E, 0],  # tokens after the first EOS are out
                        [E, 0, 0, 0, 0],  # EOS first
                        [5, 6, 7, 8, 9]])  # no EOS: truncated, all in
    expected = torch.tensor([[1, 1, 1, 0, 0],
                             [1, 1, 0, 0, 0],
                             [1, 0, 0, 0, 0],
                             [1, 1, 1, 1, 1]])
    assert torch.equal(completion_mask(ids, E), expected)


def test_position_ids_start_at_the_first_real_token():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 0, 0]])
    assert position_ids(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4], [0, 0, 1, 1, 1]]


def test_format_prompts(tokenizer):
    assert format_prompts(tokenizer, ["1+2"], chat_template=False) == ["1+2"]
    templated = format_prompts(tokenizer, ["1+2"])[0]
    assert "1+2" in templated and templated != "1+2"
    assert templated == tokenizer.apply_chat_template([{"role": "user", "content": "1+2"}], tokenize=False,
                                                      add_generation_prompt=True)


def _check_left_padding(r, tokenizer, prompts):
    lengths = [len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    assert len(set(lengths)) > 1, "the test prompts should differ in length"
    assert r.prompt_ids.shape[1] == max(lengths)
    for row, n in enumerate(lengths):
        width = r.prompt_ids.shape[1]
        assert r.prompt_mask[row].tolist() == [0] * (width - n) + [1] * n  # left padded
        assert (r.prompt_ids[row, :width - n] == tokenizer.pad_token_id).all()
        assert r.prompt_ids[row, width - n:].tolist() == tokenizer(prompts[row], add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("pad_is_eos", [False, True])
def test_generate_masks_and_left_padding(model, tokenizer, eos_pad_tokenizer, prompts, pad_is_eos):
    tok = eos_pad_tokenizer if pad_is_eos else tokenizer
    eos = tok.eos_token_id
    r = generate(model, tok, prompts, max_new_tokens=16, greedy=True)
    _check_left_padding(r, tok, prompts)
    assert r.completion_ids.shape == r.completion_mask.shape
    ended_early = 0
    for row in range(len(prompts)):
        ids, mask = r.completion_ids[row], r.completion_mask[row]
        hits = (ids == eos).nonzero().flatten().tolist()
        if not hits:  # truncated: every generated token counts
            assert mask.all() and r.truncated[row]
            continue
        first = hits[0]
        # The EOS token is inside the mask (the model must learn to emit it); what follows is not.
        assert mask[:first + 1].all() and mask[first] == 1
        assert not mask[first + 1:].any()
        assert (ids[first + 1:] == tok.pad_token_id).all()
        assert not r.truncated[row]
        assert r.lengths[row] == first + 1
        ended_early += first + 1 < len(ids)
        assert r.texts[row] == tok.decode(ids[:first], skip_special_tokens=True)
        assert tok.eos_token not in r.texts[row]
    assert ended_early, "no row ended before the others: the test checks nothing after EOS"


def test_pad_token_choice_does_not_change_completions(model, tokenizer, eos_pad_tokenizer, prompts):
    a = generate(model, tokenizer, prompts, max_new_tokens=16, greedy=True)
    b = generate(model, eos_pad_tokenizer, prompts, max_new_tokens=16, greedy=True)
    assert a.texts == b.texts
    assert torch.equal(a.completion_mask, b.completion_mask)
    assert torch.equal(a.lengths, b.lengths)


def test_micro_batches_are_padded_to_a_common_shape(model, tokenizer, prompts):
    r = generate(model, tokenizer, prompts, max_new_tokens=16, greedy=True, micro_batch=3)
    assert r.prompt_ids.shape[0] == r.completion_ids.shape[0] == len(prompts) == len(r.texts)
    _check_left_padding(r, tokenizer, prompts)
    eos = tokenizer.eos_token_id
    assert torch.equal(r.completion_mask, completion_mask(r.completion_ids, eos))


def test_repeated_prompts_are_tokenized_once_with_the_same_result(tokenizer, prompts):
    rows = [prompts[i] for i in (3, 0, 3, 1, 0, 3)]
    calls = []

    def counting(texts, **kwargs):
        calls.append(len(texts))
        return tokenizer(texts, **kwargs)

    enc = encode(counting, rows)
    assert calls == [3]  # three distinct prompts
    full = tokenizer(rows, return_tensors="pt", padding=True, add_special_tokens=False)
    assert all(torch.equal(enc[name], full[name]) for name in ("input_ids", "attention_mask"))
    # Some rows of it: only the padding none of them needs is dropped, as if they were tokenized alone.
    alone = tokenizer(rows[:2], return_tensors="pt", padding=True, add_special_tokens=False)
    part = encoded_rows(enc, slice(0, 2))  # without the longest prompt (rows[3])
    assert part["input_ids"].shape[1] < enc["input_ids"].shape[1]
    assert all(torch.equal(part[name], alone[name]) for name in ("input_ids", "attention_mask"))


def test_generate_from_encoded_prompts_equals_generate_from_strings(model, tokenizer, prompts):
    """ES tokenizes its step's prompts once and scores every member on them: each micro-batch of the
    encoded prompts generates what its prompt strings generate alone."""
    rows = prompts + prompts[:3]
    together = generate(model, tokenizer, encode(tokenizer, rows), max_new_tokens=8, greedy=True, micro_batch=3)
    for start in range(0, len(rows), 3):
        alone = generate(model, tokenizer, rows[start:start + 3], max_new_tokens=8, greedy=True)
        assert together.texts[start:start + 3] == alone.texts
        width = alone.completion_ids.shape[1]
        assert torch.equal(together.completion_ids[start:start + 3, :width], alone.completion_ids)


def _manual_logprobs(model, ids, start):
    """log p(ids[t] | ids[:t]) for t >= start, from one plain forward of an unpadded sequence."""
    with torch.no_grad():
        logits = model(input_ids=ids[None]).logits[0].float()
    logp = torch.log_softmax(logits, -1)
    return logp[start - 1:-1].gather(-1, ids[start:, None]).squeeze(-1)


def test_completion_logprobs_match_a_manual_forward(model, tokenizer, prompts):
    r = generate(model, tokenizer, prompts, max_new_tokens=16, temperature=1.0, seed=3)
    with torch.no_grad():
        lp, ent = completion_logprobs(model, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask,
                                      temperature=1.0, with_entropy=True)
    assert lp.shape == ent.shape == r.completion_ids.shape
    padded = [i for i in range(len(prompts)) if not r.prompt_mask[i].all()]
    unpadded = [i for i in range(len(prompts)) if r.prompt_mask[i].all()]
    assert padded and unpadded
    for row in unpadded + padded:
        prompt = r.prompt_ids[row][r.prompt_mask[row].bool()]
        n = int(r.lengths[row])
        ids = torch.cat([prompt, r.completion_ids[row, :n]])
        # A left-padded row scores exactly like the same row without padding (position ids start at 0).
        expected = _manual_logprobs(model, ids, len(prompt))
        torch.testing.assert_close(lp[row, :n], expected, atol=1e-4, rtol=1e-4)
    m = r.completion_mask.bool()
    assert (ent[m] >= -1e-5).all() and (ent[m] <= torch.log(torch.tensor(len(tokenizer))) + 1e-4).all()


def test_completion_logprobs_chunks_and_temperature(model, tokenizer, prompts):
    r = generate(model, tokenizer, prompts, max_new_tokens=8, seed=1)
    args = (r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask)
    with torch.no_grad():
        whole = completion_logprobs(model, *args)
        chunked = completion_logprobs(model, *args, chunk=3)
        hot = completion_logprobs(model, *args, temperature=2.0)
    m = r.completion_mask.bool()
    torch.testing.assert_close(whole[m], chunked[m], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(whole[m], hot[m])


def test_completion_logprobs_carry_gradients(model, tokenizer, prompts):
    r = generate(model, tokenizer, prompts[:2], max_new_tokens=4, seed=1)
    lp = completion_logprobs(model, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask)
    assert lp.requires_grad
    (lp * r.completion_mask).sum().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and any(g.abs().sum() > 0 for g in grads)
    model.zero_grad(set_to_none=True)


def test_rows_sharing_a_prompt_run_it_once_with_the_same_logprobs_and_gradients(model, tokenizer, prompts):
    """A GRPO group (G completions of one prompt) runs its prompt once; the log-probs and the gradient
    are those of running every row as its own sequence (which is what a chunk of one row does)."""
    group = [p for p in prompts[:3] for _ in range(4)]  # 3 prompts of different lengths, 4 completions each
    r = generate(model, tokenizer, group, max_new_tokens=6, temperature=1.0, seed=5)
    args = (r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask)
    assert r.completion_ids.shape[1] > 1 and not r.prompt_mask.all()  # several tokens, some prompts padded
    distinct = torch.unique(torch.cat([r.prompt_ids, r.prompt_mask], 1), dim=0)
    assert len(distinct) == 3

    def logps_and_grads(chunk):
        model.zero_grad(set_to_none=True)
        lp = completion_logprobs(model, *args, chunk=chunk)
        (lp * r.completion_mask * torch.linspace(-1, 1, len(group))[:, None]).sum().backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        return lp.detach(), grads

    shared, shared_grads = logps_and_grads(chunk=len(group))
    alone, alone_grads = logps_and_grads(chunk=1)
    m = r.completion_mask.bool()
    torch.testing.assert_close(shared[m], alone[m], atol=1e-5, rtol=1e-5)
    assert shared_grads.keys() == alone_grads.keys() and len(shared_grads) == len(list(model.parameters()))
    for name in alone_grads:
        torch.testing.assert_close(shared_grads[name], alone_grads[name], atol=1e-5, rtol=1e-4, msg=name)


def test_generate_is_seeded(model, tokenizer, task):
    questions = [p.question for p in task.test_problems()[:12]] * 2
    prompts = format_prompts(tokenizer, questions)
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    a = generate(model, tokenizer, prompts, max_new_tokens=10, temperature=1.0, seed=7)
    # The global RNG is left as it was (sampling uses a forked, seeded stream).
    assert torch.equal(torch.rand(3), expected_next)
    b = generate(model, tokenizer, prompts, max_new_tokens=10, temperature=1.0, seed=7)
    c = generate(model, tokenizer, prompts, max_new_tokens=10, temperature=1.0, seed=8)
    assert a.texts == b.texts and torch.equal(a.completion_ids, b.completion_ids)
    assert a.texts != c.texts
    g1 = generate(model, tokenizer, prompts, max_new_tokens=10, greedy=True, seed=1)
    g2 = generate(model, tokenizer, prompts, max_new_tokens=10, greedy=True, seed=2)
    assert g1.texts == g2.texts


def test_left_padding_with_absolute_position_embeddings(tokenizer):
    """With rotary embeddings a constant position shift cancels out, so the check above cannot see wrong
    position ids; a GPT-2 layout (learned absolute positions) can: padded rows must still match."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    gpt = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_positions=64, n_embd=32, n_layer=2, n_head=2,
                                     pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)).eval()
    prompts = [tokenizer(q, add_special_tokens=False)["input_ids"] for q in ["1+2+3", "45+67+89+10"]]
    completions = [tokenizer(c, add_special_tokens=False)["input_ids"] for c in ["<answer>6</answer>", "<answer>1"]]
    width_p, width_c = max(map(len, prompts)), max(map(len, completions))
    pad = tokenizer.pad_token_id
    prompt_ids = torch.tensor([[pad] * (width_p - len(p)) + p for p in prompts])
    prompt_mask = torch.tensor([[0] * (width_p - len(p)) + [1] * len(p) for p in prompts])
    completion_ids = torch.tensor([c + [pad] * (width_c - len(c)) for c in completions])
    c_mask = torch.tensor([[1] * len(c) + [0] * (width_c - len(c)) for c in completions])
    with torch.no_grad():
        lp = completion_logprobs(gpt, prompt_ids, prompt_mask, completion_ids, c_mask)
    for row, (p, c) in enumerate(zip(prompts, completions)):
        expected = _manual_logprobs(gpt, torch.tensor(p + c), len(p))
        torch.testing.assert_close(lp[row, :len(c)], expected, atol=1e-4, rtol=1e-4)


def test_sampling_ignores_the_models_generation_defaults(model_dir, model, tokenizer, task, tmp_path):
    """Rollouts come from the plain distribution at `temperature` (or its argmax), whatever the checkpoint's
    generation_config.json asks for: hub models set top_k, top_p, temperature and penalties, and any key
    minies does not set itself (num_beams, min_new_tokens, bad_words_ids, ...) would reach generate.
    completion_logprobs and the entropy assume exactly that distribution."""
    import json
    import shutil

    from minies.models import load_model

    shutil.copytree(model_dir, tmp_path, dirs_exist_ok=True)
    path = tmp_path / "generation_config.json"
    config = json.loads(path.read_text())
    config.update(top_k=2, top_p=0.5, temperature=0.3, repetition_penalty=1.5, min_p=0.2, num_beams=2,
                  min_new_tokens=8, no_repeat_ngram_size=2, bad_words_ids=[[tokenizer.convert_tokens_to_ids("1")]])
    path.write_text(json.dumps(config))
    other = load_model(str(tmp_path), device="cpu")
    declared = other.generation_config
    prompts = format_prompts(tokenizer, [p.question for p in task.test_problems()[:16]])
    for greedy in (False, True):
        a = generate(model, tokenizer, prompts, max_new_tokens=10, temperature=1.0, seed=5, greedy=greedy)
        b = generate(other, tokenizer, prompts, max_new_tokens=10, temperature=1.0, seed=5, greedy=greedy)
        assert a.texts == b.texts
        assert torch.equal(a.completion_ids, b.completion_ids)
    assert min(a.lengths) < 8  # min_new_tokens 8 would have forbidden these ends
    assert other.generation_config is declared and other.generation_config.num_beams == 2  # restored after
