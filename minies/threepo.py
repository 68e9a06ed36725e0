"""3PO, Perturbed Parameter Policy Optimization (Venkatkrishna, Daheim, Gurevych et al.; docs/papers.md, "3PO").

GRPO explores only through token sampling, and temperature only rescales the logits. 3PO also explores
in weight space: IVON (minies/ivon.py) keeps a posterior N(θ, diag(s²)) over the trained weights,
s = 1/sqrt(λ·(h+δ)), and rollouts are generated at weight samples θ̂ = θ + s⊙u drawn from it. The loss
is GRPO's (minies/grpo.py) with one pass per batch, so its token ratio is 1 and its gradient is the
policy gradient. That gradient ĝ is taken at a weight sample θ̂ = θ + d; IVON turns it into the step on θ
and, through f = ĝ⊙d/s², into its Hessian estimate h, which sets how far later samples explore.

    B3PO  θ̂ ~ q;  G rollouts per prompt at θ̂;  A within each group;  ĝ = ∇L_GRPO(θ̂);  IVON step
    M3PO  for m = 1..M:  θ̂_m ~ q;  G rollouts per prompt at θ̂_m;  A within that sample's groups;
              ĝ_m = ∇L_GRPO(θ̂_m)   (p.grad starts from zero for every sample)
          one IVON step with ĝ = (1/M)·Σ_m ĝ_m and f = (1/M)·Σ_m ĝ_m⊙d_m/s²
    C3PO  the G rollouts of each prompt come in K chunks of G/K, chunk k generated at θ̂_k ~ q;
          A over the whole pooled group of G;  then a fresh θ̂_0 ~ q, and for rollout i of chunk k
              w_i = exp(Σ_t [log π_θ̂0(y_it) − log π_θ̂k(y_it)])      (sum over the completion tokens)
              w_i ← 0 if w_i ∉ [keep_min, keep_max], else min(w_i, truncate)      (paper: 0.5, 2, 2)
          ĝ = ∇L_GRPO(θ̂_0) with A_i replaced by w_i·A_i;  IVON step

Where the paper leaves room, minies chooses (why: docs/papers.md, "3PO"):
- w_i is the full likelihood ratio of the completion, exp(Σ_t Δ_t), not the geometric mean exp(mean_t Δ_t).
- w_i replaces GRPO's token ratio rather than stacking on it (that ratio is 1: π_old is the fresh sample),
  and carries no gradient: the loss is linear in A, so w_i·A_i weights sequence i's policy gradient by w_i.
- A dropped rollout (w_i = 0) stays in the normalizers (B, Σ|o_i|) and in its group's advantages.
- log π_θ̂k is recomputed right after chunk k is generated, log π_θ̂0 in the same mode: w = 1 if θ̂_0 = θ̂_k.
- Chunk k holds completions k·G/K .. (k+1)·G/K − 1 of every group (K must divide G).
- M3PO clips each sample's gradient to --max-grad-norm before IVON averages them.
- A step's weight samples depend on its seed only: every process draws the same θ̂, and --resume repeats them.

Why these defaults: docs/tuning.md.
"""
from dataclasses import dataclass

import numpy as np
import torch

from minies import UserError
from minies.runtime import distributed
from minies.config import option
from minies.citations import THREEPO
from minies.grpo import GRPO, PolicyGradientConfig, step_log
from minies.ivon import IVON
from minies.rollout import concat_rollouts, pad_right


@dataclass
class ThreePOConfig(PolicyGradientConfig):
    """GRPO's flags but its optimizer's: 3PO trains with IVON and takes one IVON step per batch, after the
    gradients at all of the step's weight samples (so it has no --optim and no --updates-per-batch)."""
    # GRPO's flag, IVON's meaning and default.
    lr: float = option(1.0, "IVON learning rate; each weight moves by at most lr·(h0+δ)·clip_radius per step",
                       check="positive", source=THREEPO)
    # IVON (docs/papers.md), at the paper's values; the shipped models' recipes widen clip_radius (docs/tuning.md).
    ess: float = option(1e9, "IVON effective sample size λ: larger means a narrower posterior", check="positive",
                        source=THREEPO)
    hess_init: float = option(1e-3, "IVON initial Hessian h0; the posterior std starts at 1/sqrt(ess·h0) = 1e-3",
                              check="positive", source=THREEPO)
    beta1: float = option(0.9, "IVON momentum of the gradient", check="fraction", source=THREEPO)
    beta2: float = option(0.9999, "IVON momentum of the Hessian estimate", check="fraction", source=THREEPO)
    weight_decay: float = option(1e-6, "IVON weight decay δ (also the prior precision in s)", check="non_negative",
                                 source=THREEPO)
    clip_radius: float = option(1e-3, "IVON clips each coordinate of (m + δθ)/(h + δ) to ±clip_radius",
                                check="positive_or_inf", source=THREEPO)
    rescale_lr: bool = option(True, "IVON multiplies lr by h0 + δ, so that the first steps are SGD with rate lr "
                              "where nothing is clipped", source=THREEPO)


@dataclass
class M3POConfig(ThreePOConfig):
    samples: int = option(2, "M: weight samples per step, each generating its own groups for the same prompts",
                          check="count")


@dataclass
class C3POConfig(ThreePOConfig):
    chunks: int = option(2, "K: each group's G completions come in K chunks, each generated at its own weight sample",
                         check="count", source=f"{THREEPO}: the headline run's N = 2")
    ratio_truncate: float = option(2.0, "truncate the sequence importance ratio at this", check="positive",
                                   source=THREEPO)
    ratio_keep_min: float = option(0.5, "drop rollouts whose sequence importance ratio is below this",
                                   check="non_negative", source=THREEPO)
    ratio_keep_max: float = option(2.0, "drop rollouts whose sequence importance ratio is above this",
                                   check="positive_or_inf", source=THREEPO)


def weight_seeds(seed, count):
    """Seeds of a step's `count` weight samples: a function of the step's seed only, hence the same
    on every process and after --resume."""
    return [int(s) for s in np.random.default_rng(seed).integers(0, 2**62, count)]


def sequence_weights(logps, behavior_logps, mask, truncate=2.0, keep_min=0.5, keep_max=2.0):
    """Importance weights [B] of completions sampled under the behavior policy, for the policy whose
    log-probs are `logps` ([B, T] each, mask [B, T] on the completion tokens): the sequence ratio
    w = exp(Σ_t mask·(logp − behavior_logp)), 0 where it leaves [keep_min, keep_max], else min(w, truncate).
    Also returns log w."""
    log_ratio = ((logps - behavior_logps) * mask).sum(-1)
    ratio = log_ratio.exp()
    kept = (ratio >= keep_min) & (ratio <= keep_max)
    return torch.where(kept, ratio.clamp(max=truncate), torch.zeros_like(ratio)), log_ratio


class ThreePO(GRPO):
    """What the three variants share: IVON over GRPO's trained parameters (all weights, or the LoRA
    adapters), through GRPO's optimizer hook, and GRPO's update reduced to one pass of its policy
    gradient, ĝ, left in p.grad at the weights in place: IVON collects it on leaving `sampled_params`
    and steps once the gradients at all of the step's weight samples are in."""

    def __init__(self, model, tokenizer, task, config, chat_template=True, compile_decoding=True):
        std = (config.ess * (config.hess_init + config.weight_decay)) ** -0.5
        if not std <= 1:
            raise UserError(f"--ess {config.ess:g} with --hess-init {config.hess_init:g}: IVON's posterior std "
                            f"1/sqrt(λ·(h0 + δ)) is {std:.3g}, so its weight samples would be noise (the paper's is "
                            "1e-3); raise --ess or --hess-init")
        super().__init__(model, tokenizer, task, config, chat_template, compile_decoding)

    def make_optimizer(self, params):
        """IVON, which keeps fp32 masters of half-precision parameters in its own state (minies/ivon.py)."""
        c = self.config
        return IVON(params, lr=c.lr, ess=c.ess, hess_init=c.hess_init, beta1=c.beta1, beta2=c.beta2,
                    weight_decay=c.weight_decay, clip_radius=c.clip_radius, rescale_lr=c.rescale_lr)

    def posterior_stats(self):
        return {"s_mean": self.optimizer.mean_std(), "hess_mean": self.optimizer.mean_hess()}


class B3PO(ThreePO):
    """One weight sample per step: rollouts and gradient both at θ̂."""

    default_steps = 200  # about as long as GRPO's: one generation and one backward per step

    def step(self, problems, seed):
        (weight_seed,) = weight_seeds(seed, 1)
        with self.optimizer.sampled_params(train=True, seed=weight_seed):  # θ̂ ~ q, in place of θ
            rollouts, scores = self.sample(problems, seed)  # G rollouts per prompt at θ̂
            advantages = self.advantages(scores.rewards)  # A within each group
            log = step_log(scores, self.policy_gradient(rollouts, advantages))  # ĝ = ∇L_GRPO(θ̂)
        # Leaving the block put θ back and gave IVON ĝ and ĝ⊙d/s²: its step on θ and its Hessian estimate.
        self.optimizer.step()
        return {**log, **self.posterior_stats()}


class M3PO(ThreePO):
    """M weight samples per step, each with its own rollouts for the same prompts; one IVON step on the
    average of their gradients."""

    default_steps = 200  # M = 2: twice B3PO's time per step

    def step(self, problems, seed):
        M, logs = self.config.samples, []
        for m, weight_seed in enumerate(weight_seeds(seed, M)):
            with self.optimizer.sampled_params(train=True, seed=weight_seed):  # θ̂_m ~ q; p.grad starts at 0
                rollouts, scores = self.sample(problems, seed * M + m)  # G rollouts per prompt at θ̂_m
                advantages = self.advantages(scores.rewards)  # A within this sample's groups
                gradient_log = self.policy_gradient(rollouts, advantages)  # ĝ_m = ∇L_GRPO(θ̂_m)
                logs.append(step_log(scores, gradient_log))
            # On leaving the block IVON adds ĝ_m and ĝ_m⊙d_m/s² to the step's averages and puts θ back.
        self.optimizer.step()  # one IVON step with ĝ = (1/M)·Σ_m ĝ_m and f = (1/M)·Σ_m ĝ_m⊙d_m/s²
        return {**average_logs(logs), **self.posterior_stats()}


def average_logs(logs):
    """One log row for several samples' rows: the mean of each statistic, the total token count, and a
    prompt counts as solved when any sample's group solved it."""
    out = {key: float(np.mean([log[key] for log in logs])) for key in logs[0] if key != "groups_solved"}
    out["tokens"] = sum(log["tokens"] for log in logs)
    out["groups_solved"] = [max(solved) for solved in zip(*(log["groups_solved"] for log in logs))]
    return out


class C3PO(ThreePO):
    """Each group generated in K chunks at K weight samples; the gradient at a fresh one, reweighted."""

    default_steps = 300  # a step costs a little more than GRPO's: K + 1 extra no-grad forward passes

    def __init__(self, model, tokenizer, task, config, chat_template=True, compile_decoding=True):
        if config.group_size % config.chunks:
            raise UserError(f"--chunks {config.chunks}: must divide --group-size {config.group_size}")
        if config.ratio_keep_min > config.ratio_keep_max:
            raise UserError(f"--ratio-keep-min {config.ratio_keep_min:g} is above --ratio-keep-max "
                            f"{config.ratio_keep_max:g}: no rollout would be kept")
        super().__init__(model, tokenizer, task, config, chat_template, compile_decoding)

    def step(self, problems, seed):
        cfg = self.config
        *chunk_seeds, fresh_seed = weight_seeds(seed, cfg.chunks + 1)
        # The G rollouts of each prompt come in K chunks, chunk k generated at θ̂_k ~ q.
        rank_seed = seed * distributed.world_size() + distributed.rank()
        rollouts, _, behavior_logps = self.sample_chunks(self.prompts(problems), rank_seed, chunk_seeds)
        scores = self.verify(problems, rollouts)
        advantages = self.advantages(scores.rewards)  # A over each whole pooled group of G
        with self.optimizer.sampled_params(train=True, seed=fresh_seed):  # a fresh θ̂_0 ~ q
            # w_i = exp(Σ_t [log π_θ̂0(y_it) − log π_θ̂k(y_it)]), 0 outside [keep_min, keep_max], truncated
            weights, log_ratio = sequence_weights(self.token_logps(rollouts), behavior_logps,
                                                  rollouts.completion_mask.float(), cfg.ratio_truncate,
                                                  cfg.ratio_keep_min, cfg.ratio_keep_max)
            update_log = self.policy_gradient(rollouts, advantages * weights)  # ĝ = ∇L_GRPO(θ̂_0) with w_i·A_i
        self.optimizer.step()  # IVON, as in B3PO
        kept, count, abs_log = distributed.all_reduce_sum(torch.tensor(
            [weights.gt(0).sum().item(), len(weights), log_ratio.abs().sum().item()], dtype=torch.float64)).tolist()
        update_log.update(ratio_kept=kept / count, log_ratio_abs=abs_log / count)
        return {**step_log(scores, update_log), **self.posterior_stats()}

    def sample_chunks(self, prompts, seed, chunk_seeds):
        """Rollouts of `prompts` (each group's G copies side by side) whose chunk k, completions
        k·G/K .. (k+1)·G/K − 1 of every group, is generated at the weight sample of chunk_seeds[k].
        Returns them in the prompts' order with each one's chunk [B] and behavior log-probs [B, C]
        (under its own sample, computed right after its chunk is generated)."""
        G, K = self.config.group_size, self.config.chunks
        chunk = torch.arange(len(prompts)) % G // (G // K)
        rows, parts, behavior = [], [], []
        for k in range(K):
            rows.append(chunk.eq(k).nonzero().flatten())
            with self.optimizer.sampled_params(train=False, seed=chunk_seeds[k]):
                parts.append(self.generate([prompts[i] for i in rows[-1]], seed * K + k))
                behavior.append(self.token_logps(parts[-1]))
        joined = concat_rollouts(parts, self.tokenizer.pad_token_id)
        behavior = torch.cat([pad_right(b, joined.completion_ids.shape[1], 0.0) for b in behavior])
        order = torch.cat(rows).argsort()  # row j of the joined rollouts is prompt torch.cat(rows)[j]
        return joined.select(order), chunk, behavior[order]

    def token_logps(self, rollouts):
        """Log-probs [B, C] of the completion tokens under the weights in place, without grad."""
        with torch.no_grad():
            return self.logps(self.model, rollouts, slice(None))[0]
