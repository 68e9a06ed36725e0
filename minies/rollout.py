"""Rollouts: batched sampling with `model.generate`, and per-token log-probs / entropy of completions.

Decoder-only batching needs left padding (every prompt ends at the same column, so generation
continues all rows together) and explicit position ids (a padded row's first real token is
position 0), both in generation and when re-scoring, so that the log-probs we recompute equal
the ones the sampler used.

The completion mask covers every generated token up to and including the first end token. It is
computed from the end token's position, never from the pad id, because many tokenizers use EOS as
the pad token and masking "pad" would silently drop the EOS the model must learn to emit. A model may
declare several end tokens (Qwen2.5-Instruct's generation_config lists <|im_end|> and <|endoftext|>):
generation stops at any of them, and masks, truncation and rewards treat them all alike (stop_token_ids).
"""
import contextlib
from dataclasses import dataclass

import torch
from tqdm import tqdm
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

from minies.runtime import decoding, distributed
from minies.runtime.guard import Diverged
from minies.models import model_device, note_long_prompts
from minies.runtime.threads import follow_load


@dataclass
class Rollouts:
    prompt_ids: torch.Tensor  # [B, P] left-padded
    prompt_mask: torch.Tensor  # [B, P] 1 on real prompt tokens
    completion_ids: torch.Tensor  # [B, C] right-padded after EOS
    completion_mask: torch.Tensor  # [B, C] 1 up to and including the first end token
    texts: list  # decoded completions, special tokens dropped
    ended: torch.Tensor  # [B] bool: the completion stopped at an end token (else max_new_tokens cut it off)
    # The token tensors stay on the model's device, for the log-prob passes; the per-row values (lengths,
    # `ended`) are host tensors, since they join the rewards and the log.

    @property
    def lengths(self):
        return self.completion_mask.sum(-1).cpu()

    @property
    def truncated(self):
        """True for rows that hit max_new_tokens without emitting an end token."""
        return ~self.ended

    def select(self, rows):
        """The rollouts at `rows` (indices), in that order."""
        rows = torch.as_tensor(rows)
        return Rollouts(self.prompt_ids[rows], self.prompt_mask[rows], self.completion_ids[rows],
                        self.completion_mask[rows], [self.texts[i] for i in rows.tolist()], self.ended[rows])


def format_prompts(tokenizer, questions, chat_template=True, system=None, prefill=""):
    """Prompt strings, exactly as the model reads them: each question as the user message of the tokenizer's
    chat template (after the `system` message, if given) with the generation prompt, when the tokenizer has a
    template and `chat_template` is on; else the question itself after the tokenizer's own start tokens
    (start_text). `prefill` is appended either way: the start of the answer, written for the model, which
    continues it (TinyZero's "Let me solve this step by step.\n<think>"); one string for every question, or a
    list with one per question."""
    prefills = [prefill] * len(questions) if isinstance(prefill, str) else prefill
    if chat_template and tokenizer.chat_template:
        head = [{"role": "system", "content": system}] if system is not None else []
        return [tokenizer.apply_chat_template(head + [{"role": "user", "content": q}], tokenize=False,
                                              add_generation_prompt=True) + f for q, f in zip(questions, prefills)]
    start = start_text(tokenizer)
    return [start + q + f for q, f in zip(questions, prefills)]


def start_text(tokenizer):
    """The special tokens a tokenizer puts before any text it encodes (Llama 3's <|begin_of_text|>), as text;
    "" for one that adds none (Qwen2.5, the shipped models). Prompts are encoded without special tokens
    (encode), so that a chat template, which writes its own, never gets a second one; a raw prompt gets them
    here instead, written into the prompt string, where --show-prompt shows them."""
    plain = tokenizer("x", add_special_tokens=False)["input_ids"]
    marked = tokenizer("x")["input_ids"]
    at = next((i for i in range(len(marked) - len(plain) + 1) if marked[i:i + len(plain)] == plain), 0)
    return tokenizer.decode(marked[:at])


def stop_token_ids(model, tokenizer):
    """Every token that ends a completion: the tokenizer's EOS and each end token the model's generation_config
    declares (a list for Qwen2.5-Instruct: <|im_end|> and <|endoftext|>), sorted."""
    declared = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    declared = declared if isinstance(declared, (list, tuple)) else [declared]
    return sorted({int(i) for i in [tokenizer.eos_token_id, *declared] if i is not None})


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


def completion_mask(completion_ids, stop_ids):
    """1 on every token up to and including the first of `stop_ids` (an id or a list of ids), 0 after it."""
    is_end = torch.isin(completion_ids, torch.tensor(stop_ids, device=completion_ids.device).reshape(-1))
    # Number of end tokens strictly before each position: 0 means "still inside the completion".
    before = is_end.int().cumsum(-1) - is_end.int()
    return before.eq(0).long()


def position_ids(attention_mask):
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


@torch.no_grad()
def generate(model, tokenizer, prompts, max_new_tokens=16, temperature=1.0, top_p=1.0, greedy=False,
             micro_batch=256, seed=0, share_prompts=False, compile_decoding=True):
    """Sample one completion per prompt string (repeat prompts for several); `prompts` may also be their
    encode(), for a caller that generates from the same prompts many times. Seeded: the same
    seed, model and prompts give the same completions (common random numbers for ES).
    `share_prompts`: a prompt repeated within a micro-batch is run once (shared_prompt_cache); only when
    every row runs under the same weights, and not where decoding is compiled. `compile_decoding`: decode
    with a static cache and a compiled step where the model allows it (on CUDA, not 8-bit:
    minies/runtime/decoding.py); False keeps transformers' eager decoding. On a CPU decoding is eager either
    way, its cache grown in place and its weights packed: the same tokens, faster (decoding.py)."""
    device = model_device(model)
    stop_ids = stop_token_ids(model, tokenizer)
    # Every knob minies uses is set here, and no other (generate_from_nothing): the rollouts come from exactly
    # the distribution that completion_logprobs scores, whatever the checkpoint's generation_config.json says.
    config = GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=not greedy, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=stop_ids, repetition_penalty=1.0, no_repeat_ngram_size=0,
        **({} if greedy else {"temperature": temperature, "top_p": top_p, "top_k": 0, "min_p": 0.0, "typical_p": 1.0}))
    parts = []
    devices = [device] if device.type == "cuda" else []
    encoded = prompts if isinstance(prompts, dict) else encode(tokenizer, prompts)
    bar = tokens_bar(len(encoded["input_ids"]), max_new_tokens)
    compiled = compile_decoding and decoding.compilable(model)
    on_cpu = device.type == "cpu" and not compiled
    with torch.random.fork_rng(devices=devices), generate_from_nothing(model), bar:
        torch.manual_seed(seed)
        for start in range(0, len(encoded["input_ids"]), micro_batch):
            follow_load()  # when the script asked for it: threads on the cores other programs leave free
            enc = {name: value.to(device)
                   for name, value in encoded_rows(encoded, slice(start, start + micro_batch)).items()}
            rows, width = enc["input_ids"].shape
            note_long_prompts(model, width, max_new_tokens)
            if compiled:  # a static cache, a compiled step, rows padded (minies/runtime/decoding.py)
                inputs = decoding.static_inputs(model, enc, max_new_tokens, micro_batch)
            else:
                inputs = {**enc, **(shared_prompt_cache(model, enc["input_ids"], enc["attention_mask"])
                                    if share_prompts else {})}
            if on_cpu:  # eager, its cache grown in place, its weights packed (minies/runtime/decoding.py)
                inputs.update(decoding.growing_cache(model, width + max_new_tokens,
                                                     inputs.get(decoding.cache_keyword(model))))
            counted = BarTokens(bar, rows)
            inputs["stopping_criteria"] = StoppingCriteriaList([*inputs.get("stopping_criteria", []), counted])
            try:  # on a CPU, the weights packed once the call has shown it is long (decoding.pack_after)
                with (decoding.packed_linears(model, rows, decoding.pack_after(max_new_tokens)) if on_cpu
                      else contextlib.nullcontext()) as packer:
                    if packer:
                        inputs["stopping_criteria"].append(packer)
                    completions = model.generate(**inputs, generation_config=config)[:rows, width:]
            except RuntimeError as e:  # sampling from logits that overflowed: the weights or the temperature diverged
                if "probability tensor contains" not in str(e):
                    raise
                raise Diverged("the model's next-token distribution") from None
            mask = completion_mask(completions, stop_ids)
            texts = tokenizer.batch_decode(completions.masked_fill(mask == 0, tokenizer.pad_token_id),
                                           skip_special_tokens=True)
            ended = (torch.isin(completions, torch.tensor(stop_ids, device=device)) & mask.bool()).any(-1)
            parts.append(Rollouts(enc["input_ids"], enc["attention_mask"], completions, mask, texts, ended.cpu()))
            counted.finish(max_new_tokens)
    return concat_rollouts(parts, tokenizer.pad_token_id)


@contextlib.contextmanager
def generate_from_nothing(model):
    """While generating, the model's generation_config is a blank one: transformers fills every setting that
    generate's own config leaves unset from it, so a checkpoint declaring num_beams, min_new_tokens,
    bad_words_ids or a repetition penalty would otherwise change how minies decodes (and what it scores)."""
    declared = model.generation_config
    model.generation_config = GenerationConfig()
    try:
        yield
    finally:
        model.generation_config = declared


def tokens_bar(rows, max_new_tokens):
    """A bar of the tokens generated, shown only when generating takes more than a few seconds (a real model
    on a CPU) and only on the main process: a long generation shows life, a short one prints nothing."""
    return tqdm(total=rows * max_new_tokens, desc="generating", unit="tok", unit_scale=True, leave=False,
                delay=5, dynamic_ncols=True, disable=not distributed.is_main())


class BarTokens(StoppingCriteria):
    """Moves the tokens bar by one token per row at every decoding step; stops nothing. A row that ends early
    counts as generating up to max_new_tokens, so that the bar's total is right when the call is done."""

    def __init__(self, bar, rows):
        self.bar, self.rows, self.steps = bar, rows, 0

    def __call__(self, input_ids, scores, **kwargs):
        self.steps += 1
        self.bar.update(self.rows)
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    def finish(self, max_new_tokens):
        self.bar.update(self.rows * max(0, max_new_tokens - self.steps))


def concat_rollouts(parts, pad_id):
    """One Rollouts from several (micro-batches can differ in prompt and completion width), padded to
    common widths the way generate pads: prompts on the left, completions on the right."""
    width_p = max(r.prompt_ids.shape[1] for r in parts)
    width_c = max(max(r.completion_ids.shape[1] for r in parts), 1)
    return Rollouts(torch.cat([pad_left(r.prompt_ids, width_p, pad_id) for r in parts]),
                    torch.cat([pad_left(r.prompt_mask, width_p, 0) for r in parts]),
                    torch.cat([pad_right(r.completion_ids, width_c, pad_id) for r in parts]),
                    torch.cat([pad_right(r.completion_mask, width_c, 0) for r in parts]),
                    [t for r in parts for t in r.texts], torch.cat([r.ended for r in parts]))


def pad_left(x, width, value):
    return torch.nn.functional.pad(x, (width - x.shape[1], 0), value=value)


def pad_right(x, width, value):
    return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)


# A pass over completions holds a few [rows, completion, vocabulary] fp32 tensors at once (logits, log-probs,
# under autograd what backward keeps), so every pass (completion_logprobs) takes as many rows as keep one of
# them under this size. A real model's vocabulary is large: Qwen2.5's 151,936 tokens make 256 rows of 512
# tokens 80 GB per tensor.
LOGITS_BYTES = 2**30


def logits_rows(width, vocab_size, most):
    """Rows per pass over completions `width` tokens wide: at most `most`, and no more than keep their fp32
    logits within LOGITS_BYTES (at least one)."""
    return max(1, min(most, LOGITS_BYTES // (4 * width * vocab_size)))


def completion_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature=1.0,
                        with_entropy=False, chunk=64):
    """Log-probability of each completion token under `model` at `temperature`, and optionally the
    full-vocabulary entropy of the next-token distribution at each completion position.

    Rows are processed `chunk` at a time, or fewer: as many as logits_rows allows, so that no pass holds
    more than LOGITS_BYTES of [rows, completion, vocabulary] logits. Gradients flow when called with grad
    enabled; then every chunk's graph is kept until backward, so a caller that trains on more rows than
    one chunk cuts them into micro-batches of logits_rows rows itself (GRPO does).
    """
    chunk = logits_rows(completion_ids.shape[1], getattr(model, "module", model).config.vocab_size, chunk)
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
