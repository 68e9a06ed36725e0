"""GRPO's objective, as pure functions of tensors: the group-relative advantages and the clipped surrogate
loss with its three aggregations (minies/grpo.py runs them on a batch of rollouts).

Advantages come from the group of each prompt (no value model):

    A_i = (r_i − mean_group(r)) / (std + 1e-4)      std: the group's, the batch's, or 1 (Dr. GRPO)

and the policy minimizes, per completion token t of completion i,

    ratio = exp(logp − logp_old)
    l_it  = −min(ratio·A_i, clip(ratio, 1 − ε_low, 1 + ε_high)·A_i) + β·KL_it
    KL_it = exp(ref − logp) − (ref − logp) − 1      (k3 estimator; with β = 0 no reference is kept)

aggregated over the batch by one of
    grpo:    (1/B) Σ_i (1/|o_i|) Σ_t l_it          mean per sequence, then over sequences
    dapo:    Σ_it l_it / Σ_i |o_i|                  mean over all tokens of the batch
    dr_grpo: Σ_it l_it / (B · max_new_tokens)       a constant normalizer, no length bias

When a call sees only part of a batch (a micro-batch, one rank's share), it is given the whole batch's
normalizers (B, Σ|o_i|), so that the parts' losses and gradients add up to the batch's.
"""
import torch

AGGREGATIONS = ("grpo", "dapo", "dr_grpo")


def group_advantages(rewards, scale="group", eps=1e-4):
    """Advantages [P, G] from rewards [P, G]: each reward minus its group's mean, divided by the
    group's std ("group"), the whole batch's ("batch"), or nothing ("none", Dr. GRPO).
    A group whose rewards all tie carries no signal: its advantages are exactly 0 (never NaN)."""
    advantages = rewards - rewards.mean(1, keepdim=True)
    if scale == "group":
        advantages = advantages / (rewards.std(1, keepdim=True) + eps)
    elif scale == "batch":
        advantages = advantages / (rewards.std() + eps)
    tied = rewards.eq(rewards[:, :1]).all(1, keepdim=True)
    return advantages.masked_fill(tied, 0.0)


def grpo_loss(logps, old_logps, advantages, mask, *, epsilon_low=0.2, epsilon_high=0.2, aggregation="grpo",
              ref_logps=None, beta=0.0, num_sequences=None, num_tokens=None, max_len=None):
    """The clipped surrogate loss of a batch of completions (module docstring), and its statistics.

    logps: [B, T] log-probs of the completion tokens under the policy being trained (with grad);
    old_logps: [B, T] the same under the sampling policy; advantages: [B]; mask: [B, T], 1 on the
    tokens to train (EOS included); ref_logps: [B, T] under the reference policy, for the KL term.

    When the call sees only part of a batch (a micro-batch, one rank's share), pass the whole batch's
    num_sequences and num_tokens (completion tokens): then the parts' losses and gradients add up to
    the batch's. max_len is dr_grpo's constant (max_new_tokens). Each defaults to this call's batch.

    Returns (loss, stats); stats are floats over this call's tokens: the fractions of tokens whose
    ratio is clipped below (A < 0) or above (A > 0), which get no gradient, and the mean KL.
    """
    mask = mask.to(logps.dtype)
    A = advantages[:, None].to(logps.dtype)
    ratio = torch.exp(logps - old_logps)
    clipped = ratio.clamp(1 - epsilon_low, 1 + epsilon_high)
    per_token = -torch.min(ratio * A, clipped * A)  # l_it, its KL term added when a reference is given
    if ref_logps is not None:
        delta = ref_logps - logps
        kl = torch.exp(delta) - delta - 1  # KL_it, the k3 estimator
        per_token = per_token + beta * kl
    # The aggregation: a weight per token, from the whole batch's normalizers where given.
    num_sequences = len(mask) if num_sequences is None else num_sequences
    num_tokens = mask.sum() if num_tokens is None else num_tokens
    max_len = mask.shape[1] if max_len is None else max_len
    loss = (per_token * token_weights(mask, aggregation, num_sequences, num_tokens, max_len)).sum()

    with torch.no_grad():
        tokens = mask.sum().clamp(min=1)
        stats = {"clip_low": float(((ratio < 1 - epsilon_low) & (A < 0) & mask.bool()).sum() / tokens),
                 "clip_high": float(((ratio > 1 + epsilon_high) & (A > 0) & mask.bool()).sum() / tokens)}
        if ref_logps is not None:
            stats["kl"] = float((kl * mask).sum() / tokens)
    return loss, stats


def token_weights(mask, aggregation, num_sequences, num_tokens, max_len):
    """Each token's weight in the batch loss [B, T] under one of the aggregations (module docstring)."""
    if aggregation == "grpo":
        return mask / mask.sum(1, keepdim=True).clamp(min=1) / num_sequences
    if aggregation == "dapo":
        return mask / num_tokens
    if aggregation == "dr_grpo":
        return mask / (num_sequences * max_len)
    raise ValueError(f"aggregation {aggregation!r}: choose one of {', '.join(AGGREGATIONS)}")
