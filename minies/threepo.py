"""3PO, Perturbed Parameter Policy Optimization (Venkatkrishna, Daheim, Gurevych et al.; PAPERS.md 1B).

GRPO explores only through token sampling, and temperature only rescales the logits. 3PO also explores
in weight space: IVON (minies/ivon.py) keeps a posterior N(θ, diag(σ²)) over the trained weights,
σ = 1/sqrt(λ·(h+δ)), and rollouts are generated at weight samples θ̂ = θ + σ⊙u drawn from it. The loss
is GRPO's (minies/grpo.py) with one update per batch, so its token ratio is 1 and its gradient is the
policy gradient. That gradient ĝ is taken at a weight sample θ̂ = θ + d; IVON turns it into the step on θ
and, through f = ĝ⊙d/σ², into its Hessian estimate h, which sets how far later samples explore.

    B3PO  θ̂ ~ q;  G rollouts per prompt at θ̂;  A within each group;  ĝ = ∇L_GRPO(θ̂);  IVON step
    M3PO  for m = 1..M:  θ̂_m ~ q;  G rollouts per prompt at θ̂_m;  A within that sample's groups;
              ĝ_m = ∇L_GRPO(θ̂_m)   (p.grad starts from zero for every sample);
          one IVON step with ĝ = (1/M)·Σ_m ĝ_m and f = (1/M)·Σ_m ĝ_m⊙d_m/σ²
    C3PO  the G rollouts of each prompt come in N chunks of G/N, chunk n generated at θ̂_n ~ q;
          A over the whole pooled group of G;  then a fresh θ̂_0 ~ q, and for rollout i of chunk n
              w_i = exp(Σ_t [log π_θ̂0(y_it) − log π_θ̂n(y_it)])      (sum over the completion tokens)
              w_i ← 0 if w_i ∉ [keep_min, keep_max], else min(w_i, truncate)      (paper: 0.5, 2, 2)
          ĝ = ∇L_GRPO(θ̂_0) with A_i replaced by w_i·A_i;  IVON step

Where the paper leaves room, minies chooses:
- The sequence ratio is the full likelihood ratio exp(Σ_t Δ_t) of the completion, not the per-token
  geometric mean exp(mean_t Δ_t): it is the weight that makes the chunk's rollouts unbiased for the
  fresh sample, and the sum is what the [0.5, 2] window bounds. Completions are short and two posterior
  samples differ by ~σ, so the sum stays moderate; the mean would be a length-normalised, biased weight.
- It replaces GRPO's token ratio rather than stacking on it: GRPO's π_old is the fresh sample itself
  (its log-probs, detached), so the token ratio is 1 and its clipping never acts; the loss is linear in
  A, so passing w_i·A_i weights each sequence's policy gradient by w_i. w carries no gradient.
- A dropped rollout gets weight 0 but stays in the normalisers (B, Σ|o_i|) and in its group's
  advantages: the step shrinks when much is dropped instead of amplifying what is left.
- With the paper's window the truncation at 2 only acts at the window's edge; it matters when the
  window is widened (--ratio-keep-max inf gives plain truncated importance sampling).
- The behaviour log-probs log π_θ̂n are recomputed by a forward pass at θ̂_n right after its chunk is
  generated, and log π_θ̂0 by a no-grad pass at θ̂_0 in the same mode, so w is exactly 1 when θ̂_0 = θ̂_n.
- Chunk n holds completions n·G/N .. (n+1)·G/N − 1 of every group (G must be divisible by N).
- Each sample's gradient is clipped to --max-grad-norm before IVON averages it (M3PO).

Seeds: the weight samples of a step are drawn from seeds that depend only on the step's seed, so every
process draws the same θ̂ (and --resume repeats them); token sampling is seeded per sample, per chunk
and per process, so it differs wherever they differ.

Distributed (torchrun): exactly GRPO's split. Each process gets its share of the prompts and does all
M samples / N chunks for them; gradients are averaged by DDP inside each sample. The weight samples
must agree across processes: the gradient averaged over processes is the gradient at one θ̂, and
IVON's Hessian sample pairs it with that θ̂'s d. IVON's step is then the same on every process, so the
means stay identical without being communicated.

With --load-in-8bit, GRPO's LoRA adapters are the trained parameters: IVON's posterior is over them.

Defaults: the paper's IVON values (λ 1e9, h0 1e-3, β1 0.9, β2 0.9999, δ 1e-6), which give σ ≈ 1e-3
(the weights here are ~0.03), but not its lr and clip_radius. With rescale_lr and h ≈ h0 the step is
lr·m̂, SGD with momentum, clipped per weight at lr·(h0+δ)·clip_radius. The paper clips at 1e-3, i.e. for
almost every weight, which makes the step a sign-descent one of 1·1e-3·1e-3 = 1e-6 per weight, its
GRPO's AdamW lr. minies keeps that bound at GRPO's lr here (1·1e-3·0.1 = 1e-4), but with lr = 1 only
the 10-30% of weights with the largest momenta reach it; weights with a weak, noisy gradient move
less, as under Adam. On the tiny model the sign-descent setting (lr 100, clip 1e-3) learned half as
fast and let pass@16 collapse (83% -> 55-72%); σ = 3e-3 cost rollout accuracy and learned more slowly.
With β2 = 0.9999, h (and so σ) moves little in a run of a few hundred steps, and at σ = 1e-3 C3PO's
importance weights stay close to 1 (|log w| ≈ 0.05; about 0.05% of rollouts dropped).
"""
from dataclasses import dataclass

import numpy as np
import torch

from minies import UserError, distributed
from minies.config import option
from minies.grpo import GRPO, GRPOConfig
from minies.ivon import IVON
from minies.rollout import Rollouts, completion_logprobs


@dataclass
class ThreePOConfig(GRPOConfig):
    # Redefined GRPO fields (same flags, 3PO's meaning and defaults).
    lr: float = option(1.0, "IVON learning rate; each weight moves by at most lr·(h0+δ)·clip_radius per step",
                       check="positive")
    optim: str = option("ivon", "optimizer: 3PO trains with IVON", choices=["ivon"])
    updates_per_batch: int = option(1, "optimizer steps per batch: 3PO takes one IVON step", choices=[1],
                                    check="positive")
    # IVON (PAPERS.md section 4). The paper's values, except lr and clip_radius: see the module docstring.
    ess: float = option(1e9, "IVON effective sample size λ: larger means a narrower posterior", check="positive")
    hess_init: float = option(1e-3, "IVON initial Hessian h0; the posterior std starts at 1/sqrt(ess·h0) = 1e-3",
                              check="positive")
    beta1: float = option(0.9, "IVON momentum of the gradient", check="fraction")
    beta2: float = option(0.9999, "IVON momentum of the Hessian estimate", check="fraction")
    weight_decay: float = option(1e-6, "IVON weight decay δ (also the prior precision in σ)", check="non_negative")
    clip_radius: float = option(0.1, "IVON clips each coordinate of (m + δθ)/(h + δ) to ±clip_radius",
                                check="positive_or_inf")
    rescale_lr: bool = option(True, "IVON multiplies lr by h0 + δ, so that the first steps are SGD with rate lr "
                              "where nothing is clipped")


@dataclass
class M3POConfig(ThreePOConfig):
    samples: int = option(2, "M: weight samples per step, each generating its own groups for the same prompts",
                          check="positive")


@dataclass
class C3POConfig(ThreePOConfig):
    chunks: int = option(2, "N: each group's G completions come in N chunks, each generated at its own weight sample",
                         check="positive")
    ratio_truncate: float = option(2.0, "truncate the sequence importance ratio at this", check="positive")
    ratio_keep_min: float = option(0.5, "drop rollouts whose sequence importance ratio is below this",
                                   check="non_negative")
    ratio_keep_max: float = option(2.0, "drop rollouts whose sequence importance ratio is above this",
                                   check="positive_or_inf")


def weight_seeds(seed, count):
    """Seeds of a step's `count` weight samples: a function of the step's seed only, hence the same
    on every process and after --resume."""
    return [int(s) for s in np.random.default_rng(seed).integers(0, 2**62, count)]


def sequence_weights(logps, behaviour_logps, mask, truncate=2.0, keep_min=0.5, keep_max=2.0):
    """Importance weights [B] of completions sampled under the behaviour policy, for the policy whose
    log-probs are `logps` ([B, T] each, mask [B, T] on the completion tokens): the sequence ratio
    w = exp(Σ_t mask·(logp − behaviour_logp)), 0 where it leaves [keep_min, keep_max], else min(w, truncate).
    Also returns log w."""
    log_ratio = ((logps - behaviour_logps) * mask).sum(-1)
    ratio = log_ratio.exp()
    kept = (ratio >= keep_min) & (ratio <= keep_max)
    return torch.where(kept, ratio.clamp(max=truncate), torch.zeros_like(ratio)), log_ratio


@dataclass
class ChunkedRollouts(Rollouts):
    chunk: torch.Tensor  # [B] the weight sample (chunk) each rollout was generated at
    behaviour_logps: torch.Tensor  # [B, C] log-probs of the completion tokens under that sample


def concat_rollouts(parts, pad_id):
    """One Rollouts from several generate calls, padded to common widths the way generate pads:
    prompts on the left, completions on the right."""
    width_p = max(r.prompt_ids.shape[1] for r in parts)
    width_c = max(r.completion_ids.shape[1] for r in parts)

    def left(x, value):
        return torch.nn.functional.pad(x, (width_p - x.shape[1], 0), value=value)

    def right(x, value):
        return torch.nn.functional.pad(x, (0, width_c - x.shape[1]), value=value)

    return Rollouts(torch.cat([left(r.prompt_ids, pad_id) for r in parts]),
                    torch.cat([left(r.prompt_mask, 0) for r in parts]),
                    torch.cat([right(r.completion_ids, pad_id) for r in parts]),
                    torch.cat([right(r.completion_mask, 0) for r in parts]),
                    [t for r in parts for t in r.texts])


class ThreePO(GRPO):
    """What the three variants share: IVON over GRPO's trained parameters (all weights, or the LoRA
    adapters), and GRPO's update reduced to its gradient, since IVON steps only after the gradient at
    a weight sample has been collected (on leaving `sampled_params`)."""

    def __init__(self, model, tokenizer, task, config, chat_template=True):
        super().__init__(model, tokenizer, task, config, chat_template)
        c = config
        # Replaces the AdamW that GRPO built (it holds no state before its first step).
        self.optimizer = IVON(self.params, lr=c.lr, ess=c.ess, hess_init=c.hess_init, beta1=c.beta1,
                              beta2=c.beta2, weight_decay=c.weight_decay, clip_radius=c.clip_radius,
                              rescale_lr=c.rescale_lr)

    def update(self, rollouts, advantages):
        return super().update(rollouts, advantages, step=False)

    def posterior_stats(self):
        return {"sigma_mean": self.optimizer.mean_std(), "hess_mean": self.optimizer.mean_hess()}


class B3PO(ThreePO):
    """One weight sample per step: rollouts and gradient both at θ̂. (M3PO is this with M samples.)"""

    samples = 1
    default_steps = 200  # about as long as GRPO's: one generation and one backward per step

    def step(self, problems, seed):
        parts = []
        for m, weight_seed in enumerate(weight_seeds(seed, self.samples)):
            # GRPO's whole step at θ̂_m: rollouts, rewards, advantages within this sample's groups, and
            # (through update above) the gradient, which IVON collects when the sample is put back.
            with self.optimizer.sampled_params(train=True, seed=weight_seed):
                parts.append(super().step(problems, seed * self.samples + m))
        self.optimizer.step()
        # The log averages the samples' statistics; the token count is their total, and a prompt counts as
        # solved when any sample's group solved it.
        stats = {key: float(np.mean([p[key] for p in parts])) for key in parts[0] if key != "groups_solved"}
        stats["tokens"] = sum(p["tokens"] for p in parts)
        stats["groups_solved"] = [max(solved) for solved in zip(*(p["groups_solved"] for p in parts))]
        return {**stats, **self.posterior_stats()}


class M3PO(B3PO):
    default_steps = 200  # M = 2: twice B3PO's time per step

    def __init__(self, model, tokenizer, task, config, chat_template=True):
        if config.samples < 1:
            raise UserError(f"--samples {config.samples}: need at least one weight sample")
        super().__init__(model, tokenizer, task, config, chat_template)
        self.samples = config.samples


class C3PO(ThreePO):
    """Each group generated in N chunks at N weight samples; the gradient at a fresh one, reweighted."""

    default_steps = 300  # a step costs a little more than GRPO's: N + 1 extra no-grad forward passes

    def __init__(self, model, tokenizer, task, config, chat_template=True):
        if config.chunks < 1 or config.group_size % config.chunks:
            raise UserError(f"--chunks {config.chunks}: must be >= 1 and divide --group-size {config.group_size}")
        super().__init__(model, tokenizer, task, config, chat_template)
        self.seeds = None  # this step's N chunk samples and the fresh one, last

    def step(self, problems, seed):
        self.seeds = weight_seeds(seed, self.config.chunks + 1)
        stats = super().step(problems, seed)  # GRPO's step, through sample and update below
        self.optimizer.step()
        return {**stats, **self.posterior_stats()}

    def logps(self, rollouts):
        with torch.no_grad():
            return completion_logprobs(self.model, rollouts.prompt_ids, rollouts.prompt_mask, rollouts.completion_ids,
                                       rollouts.completion_mask, self.config.temperature, chunk=self.config.micro_batch)

    def sample(self, prompts, seed):
        """The rollouts of GRPO's prompt list (each group's G copies side by side), chunk n of every
        group generated at weight sample θ̂_n, back in the list's order, with their chunk and their
        behaviour log-probs."""
        G, N = self.config.group_size, self.config.chunks
        chunk = torch.arange(len(prompts)) % G // (G // N)
        rows, parts, behaviour = [], [], []
        for n in range(N):
            rows.append(chunk.eq(n).nonzero().flatten())
            with self.optimizer.sampled_params(train=False, seed=self.seeds[n]):
                parts.append(super().sample([prompts[i] for i in rows[-1]], seed * N + n))
                behaviour.append(self.logps(parts[-1]))
        joined = concat_rollouts(parts, self.tokenizer.pad_token_id)
        width = joined.completion_ids.shape[1]
        behaviour = torch.cat([torch.nn.functional.pad(b, (0, width - b.shape[1])) for b in behaviour])
        order = torch.cat(rows).argsort()  # row j of the joined rollouts is prompt torch.cat(rows)[j]
        return ChunkedRollouts(joined.prompt_ids[order], joined.prompt_mask[order], joined.completion_ids[order],
                               joined.completion_mask[order], [joined.texts[i] for i in order.tolist()],
                               chunk, behaviour[order])

    def update(self, rollouts, advantages):
        cfg = self.config
        with self.optimizer.sampled_params(train=True, seed=self.seeds[-1]):  # the fresh sample θ̂_0
            mask = rollouts.completion_mask.float()
            weights, log_ratio = sequence_weights(self.logps(rollouts), rollouts.behaviour_logps, mask,
                                                  cfg.ratio_truncate, cfg.ratio_keep_min, cfg.ratio_keep_max)
            stats = super().update(rollouts, advantages * weights)
        kept, count, abs_log = distributed.all_reduce_sum(torch.tensor(
            [weights.gt(0).sum().item(), len(weights), log_ratio.abs().sum().item()], dtype=torch.float64)).tolist()
        return {**stats, "ratio_kept": kept / count, "log_ratio_abs": abs_log / count}
