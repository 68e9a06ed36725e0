"""Rollouts: batched sampling with `model.generate`, and per-token log-probs / entropy of completions.

Decoder-only batching needs left padding (every prompt ends at the same column, so generation
continues all rows together) and explicit position ids (a padded row's first real token is
position 0), both in generation and when re-scoring, so that the log-probs we recompute equal
the ones the sampler used.

The completion mask covers every generated token up to and including the first EOS. It is
computed from the EOS position, never from the pad id, because many tokenizers use EOS as
the pad token and masking "pad" would silently drop the EOS the model must learn to emit.
"""
from dataclasses import dataclass

import torch
from transformers import GenerationConfig

from minies.models import model_device


@dataclass
class Rollouts:
    prompt_ids: torch.Tensor  # [B, P] left-padded
    prompt_mask: torch.Tensor  # [B, P] 1 on real prompt tokens
    completion_ids: torch.Tensor  # [B, C] right-padded after EOS
    completion_mask: torch.Tensor  # [B, C] 1 up to and including the first EOS
    texts: list  # decoded completions, special tokens dropped

    @property
    def lengths(self):
        return self.completion_mask.sum(-1)

    def truncated(self, eos_id):
        """True for rows that hit max_new_tokens without emitting EOS."""
        return ~(self.completion_ids.eq(eos_id) & self.completion_mask.bool()).any(-1)


def format_prompts(tokenizer, questions, chat_template=True):
    """Prompt strings: the chat template with a generation prompt when the tokenizer has one."""
    if chat_template and tokenizer.chat_template:
        return [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                              add_generation_prompt=True) for q in questions]
    return list(questions)


def completion_mask(completion_ids, eos_id):
    is_eos = completion_ids.eq(eos_id)
    # Number of EOS tokens strictly before each position: 0 means "still inside the completion".
    before = is_eos.int().cumsum(-1) - is_eos.int()
    return before.eq(0).long()


def position_ids(attention_mask):
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


@torch.no_grad()
def generate(model, tokenizer, prompts, max_new_tokens=16, temperature=1.0, top_p=1.0, greedy=False,
             micro_batch=256, seed=0):
    """Sample one completion per prompt string (repeat prompts for several). Seeded: the same
    seed, model and prompts give the same completions (common random numbers for ES)."""
    device = model_device(model)
    eos_id = tokenizer.eos_token_id
    # Every sampling knob is set explicitly: anything left unset is filled from the checkpoint's
    # generation_config.json (top_k=50, repetition penalties, ...), and the rollouts would then not come
    # from the distribution that completion_logprobs scores.
    config = GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=not greedy, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=eos_id, repetition_penalty=1.0, no_repeat_ngram_size=0,
        **({} if greedy else {"temperature": temperature, "top_p": top_p, "top_k": 0, "min_p": 0.0, "typical_p": 1.0}))
    parts = []
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        for start in range(0, len(prompts), micro_batch):
            enc = tokenizer(prompts[start:start + micro_batch], return_tensors="pt", padding=True,
                            add_special_tokens=False).to(device)
            out = model.generate(**enc, generation_config=config)
            parts.append((enc["input_ids"], enc["attention_mask"], out[:, enc["input_ids"].shape[1]:]))
    # Micro-batches can differ in prompt and completion width: pad them to a common shape.
    width_p = max(p.shape[1] for p, _, _ in parts)
    width_c = max(max(c.shape[1] for _, _, c in parts), 1)
    pad = tokenizer.pad_token_id
    prompt_ids = torch.cat([_pad_left(p, width_p, pad) for p, _, _ in parts])
    prompt_mask = torch.cat([_pad_left(m, width_p, 0) for _, m, _ in parts])
    completion_ids = torch.cat([_pad_right(c, width_c, pad) for _, _, c in parts])
    mask = completion_mask(completion_ids, eos_id)
    texts = tokenizer.batch_decode(completion_ids.masked_fill(mask == 0, pad), skip_special_tokens=True)
    return Rollouts(prompt_ids, prompt_mask, completion_ids, mask, texts)


def _pad_left(x, width, value):
    return torch.nn.functional.pad(x, (width - x.shape[1], 0), value=value)


def _pad_right(x, width, value):
    return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)


def completion_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature=1.0,
                        with_entropy=False, chunk=64):
    """Log-probability of each completion token under `model` at `temperature`, and optionally the
    full-vocabulary entropy of the next-token distribution at each completion position.

    Gradients flow when called with grad enabled. Rows are processed `chunk` at a time so that the
    [rows, completion, vocabulary] logits never exist for the whole batch at once.
    """
    logps, entropies = [], []
    width = completion_ids.shape[1]
    for s in range(0, len(prompt_ids), chunk):
        ids = torch.cat([prompt_ids[s:s + chunk], completion_ids[s:s + chunk]], 1)
        mask = torch.cat([prompt_mask[s:s + chunk], completion_mask[s:s + chunk]], 1)
        # Only the logits that predict completion tokens are computed (logits_to_keep).
        logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask),
                       logits_to_keep=width + 1).logits[:, :-1].float() / temperature
        logp_all = torch.log_softmax(logits, -1)
        logps.append(logp_all.gather(-1, completion_ids[s:s + chunk, :, None]).squeeze(-1))
        if with_entropy:
            p = logp_all.detach()  # entropy is only logged: keep no [rows, tokens, vocab] graph for it
            entropies.append(-(p.exp() * p).sum(-1))
    logps = torch.cat(logps)
    return (logps, torch.cat(entropies)) if with_entropy else logps
