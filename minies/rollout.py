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
    # The token tensors stay on the model's device, for the log-prob passes; the per-row counts below are
    # host tensors, since they join the rewards and the log.

    @property
    def lengths(self):
        return self.completion_mask.sum(-1).cpu()

    def truncated(self, eos_id):
        """True for rows that hit max_new_tokens without emitting EOS."""
        return ~(self.completion_ids.eq(eos_id) & self.completion_mask.bool()).any(-1).cpu()

    def select(self, rows):
        """The rollouts at `rows` (indices), in that order."""
        rows = torch.as_tensor(rows)
        return Rollouts(self.prompt_ids[rows], self.prompt_mask[rows], self.completion_ids[rows],
                        self.completion_mask[rows], [self.texts[i] for i in rows.tolist()])


def format_prompts(tokenizer, questions, chat_template=True):
    """Prompt strings: the chat template with a generation prompt when the tokenizer has one."""
    if chat_template and tokenizer.chat_template:
        return [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                              add_generation_prompt=True) for q in questions]
    return list(questions)


def encode(tokenizer, prompts):
    """{input_ids, attention_mask}: the prompt strings tokenized and left-padded, each distinct prompt
    tokenized once (a GRPO group repeats its prompt, an ES population its whole batch)."""
    distinct = {prompt: i for i, prompt in enumerate(dict.fromkeys(prompts))}
    enc = tokenizer(list(distinct), return_tensors="pt", padding=True, add_special_tokens=False)
    rows = torch.tensor([distinct[prompt] for prompt in prompts])
    return {name: value[rows] for name, value in enc.items()}


def encoded_rows(encoded, rows):
    """The `rows` (a slice) of encode()'s result, with the left padding that none of them needs dropped:
    what encoding their prompts alone gives."""
    width = int(encoded["attention_mask"][rows].sum(1).max())
    return {name: value[rows, value.shape[1] - width:] for name, value in encoded.items()}


def completion_mask(completion_ids, eos_id):
    is_eos = completion_ids.eq(eos_id)
    # Number of EOS tokens strictly before each position: 0 means "still inside the completion".
    before = is_eos.int().cumsum(-1) - is_eos.int()
    return before.eq(0).long()


def position_ids(attention_mask):
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


@torch.no_grad()
def generate(model, tokenizer, prompts, max_new_tokens=16, temperature=1.0, top_p=1.0, greedy=False,
             micro_batch=256, seed=0, share_prompts=False):
    """Sample one completion per prompt string (repeat prompts for several); `prompts` may also be their
    encode(), for a caller that generates from the same prompts many times. Seeded: the same
    seed, model and prompts give the same completions (common random numbers for ES).
    `share_prompts`: a prompt repeated within a micro-batch is run once (shared_prompt_cache); only when
    every row runs under the same weights."""
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
        encoded = prompts if isinstance(prompts, dict) else encode(tokenizer, prompts)
        for start in range(0, len(encoded["input_ids"]), micro_batch):
            enc = {name: value.to(device)
                   for name, value in encoded_rows(encoded, slice(start, start + micro_batch)).items()}
            cache = shared_prompt_cache(model, enc["input_ids"], enc["attention_mask"]) if share_prompts else {}
            completions = model.generate(**enc, **cache, generation_config=config)[:, enc["input_ids"].shape[1]:]
            mask = completion_mask(completions, eos_id)
            texts = tokenizer.batch_decode(completions.masked_fill(mask == 0, tokenizer.pad_token_id),
                                           skip_special_tokens=True)
            parts.append(Rollouts(enc["input_ids"], enc["attention_mask"], completions, mask, texts))
    return concat_rollouts(parts, tokenizer.pad_token_id)


def concat_rollouts(parts, pad_id):
    """One Rollouts from several (micro-batches can differ in prompt and completion width), padded to
    common widths the way generate pads: prompts on the left, completions on the right."""
    width_p = max(r.prompt_ids.shape[1] for r in parts)
    width_c = max(max(r.completion_ids.shape[1] for r in parts), 1)
    return Rollouts(torch.cat([pad_left(r.prompt_ids, width_p, pad_id) for r in parts]),
                    torch.cat([pad_left(r.prompt_mask, width_p, 0) for r in parts]),
                    torch.cat([pad_right(r.completion_ids, width_c, pad_id) for r in parts]),
                    torch.cat([pad_right(r.completion_mask, width_c, 0) for r in parts]),
                    [t for r in parts for t in r.texts])


def pad_left(x, width, value):
    return torch.nn.functional.pad(x, (width - x.shape[1], 0), value=value)


def pad_right(x, width, value):
    return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)


# A pass over completions holds a few [rows, completion, vocabulary] fp32 tensors at once (logits, log-probs,
# under autograd what backward keeps), so passes take as many rows as keep one of them under this size. A real
# model's vocabulary is large: Qwen2.5's 151,936 tokens make 256 rows of 512 tokens 80 GB per tensor.
LOGITS_BYTES = 2**30


def logits_rows(width, vocab_size, most):
    """Rows per pass over completions `width` tokens wide: at most `most`, and no more than keep their fp32
    logits within LOGITS_BYTES (at least one)."""
    return max(1, min(most, LOGITS_BYTES // (4 * width * vocab_size)))


def completion_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature=1.0,
                        with_entropy=False, chunk=64):
    """Log-probability of each completion token under `model` at `temperature`, and optionally the
    full-vocabulary entropy of the next-token distribution at each completion position.

    Gradients flow when called with grad enabled. Rows are processed `chunk` at a time so that the
    [rows, completion, vocabulary] logits never exist for the whole batch at once.
    """
    logps, entropies = [], []
    for s in range(0, len(prompt_ids), chunk):
        rows = slice(s, s + chunk)
        logits = completion_logits(model, prompt_ids[rows], prompt_mask[rows], completion_ids[rows],
                                   completion_mask[rows]) / temperature
        logp_all = torch.log_softmax(logits, -1)
        logps.append(logp_all.gather(-1, completion_ids[rows, :, None]).squeeze(-1))
        if with_entropy:
            p = logp_all.detach()  # entropy is only logged: keep no [rows, tokens, vocab] graph for it
            entropies.append(-(p.exp() * p).sum(-1))
    logps = torch.cat(logps)
    return (logps, torch.cat(entropies)) if with_entropy else logps


def completion_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask):
    """The fp32 logits [rows, C, vocabulary] that predict each of the C completion tokens: one forward pass
    over prompt + completion, or, when rows share their prompt (shared_prompt_cache), over the rest."""
    width, prompt_width = completion_ids.shape[1], prompt_ids.shape[1]
    mask = torch.cat([prompt_mask, completion_mask], 1)
    positions = position_ids(mask)
    # Under DistributedDataParallel the prompt pass runs on the wrapped model: DDP expects one forward per
    # backward, and its gradient hooks fire on the parameters whichever pass used them.
    cache = shared_prompt_cache(getattr(model, "module", model), prompt_ids, prompt_mask)
    if not cache:
        ids = torch.cat([prompt_ids, completion_ids], 1)
        # Only the logits that predict completion tokens are computed (logits_to_keep).
        return model(input_ids=ids, attention_mask=mask, position_ids=positions,
                     logits_to_keep=width + 1).logits[:, :-1].float()
    # On top of the cache: each prompt's last token, then the completion but its last token (which predicts
    # nothing).
    ids = torch.cat([prompt_ids[:, -1:], completion_ids[:, :-1]], 1)
    return model(input_ids=ids, attention_mask=mask[:, :-1], position_ids=positions[:, prompt_width - 1:-1],
                 use_cache=True, **cache).logits.float()


def shared_prompt_cache(model, prompt_ids, prompt_mask):
    """When rows share their prompt (a GRPO group: G completions of one prompt), the keys and values of
    every prompt but its last token, computed once per distinct prompt and repeated for the rows that
    share it, as {keyword: cache} for the model's forward or generate; else {} (nothing to share, or under
    gradient checkpointing, where transformers keeps no cache).

    Every row must run under the same weights: not for lowrank ES, whose rows differ by member.
    Results equal one pass over every full row, up to floating-point rounding. Under autograd the repeat
    is an indexing, so each row's gradient flows back to its prompt's one pass, summed."""
    if prompt_ids.shape[1] < 2 or getattr(model, "is_activation_checkpointing", False):
        return {}
    distinct, row_prompt = torch.unique(torch.cat([prompt_ids, prompt_mask], 1), dim=0, return_inverse=True)
    if len(distinct) == len(prompt_ids):
        return {}
    ids, mask = distinct[:, :prompt_ids.shape[1] - 1], distinct[:, prompt_ids.shape[1]:-1]
    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask), use_cache=True,
                logits_to_keep=1)
    # transformers names it `cache` (from 5.2x) or `past_key_values`; a model that returns none: no sharing.
    name = next((name for name in ("cache", "past_key_values") if out.get(name) is not None), None)
    if name is None:
        return {}
    out[name].batch_select_indices(row_prompt)
    return {name: out[name]}
