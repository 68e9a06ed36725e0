"""GRPO (Shao et al. 2024) as commonly implemented (TRL's GRPOTrainer), in plain PyTorch.

Each step samples G completions for each of P prompts from the current policy π_old, scores them, and
takes the group-relative advantages A_i and the clipped surrogate loss (minies/grpo_loss.py):

    ratio = exp(logp − logp_old)
    l_it  = −min(ratio·A_i, clip(ratio, 1 − ε_low, 1 + ε_high)·A_i) + β·KL_it

with μ optimizer steps per batch. π_old is the policy before the first of them, so its log-probs
are the first pass's, detached: at the first pass ratio = 1 and the loss value is ~0, but its
gradient is the policy gradient (docs/papers.md, "GRPO").

A batch is cut into micro-batches whose gradients accumulate, and with torchrun the prompts are
shared between processes under DistributedDataParallel. Every normalizer of the loss (B, Σ|o_i|) is the
whole batch's, over all micro-batches and ranks, so the sum of the parts' losses is the loss of the
batch and the gradient does not depend on how it was cut.

A bfloat16 or float16 model is trained through fp32 masters (minies/runtime/masters.py): AdamW and its state act
on fp32 copies of the weights, and the model holds their rounding. A model loaded in 8-bit cannot be
trained directly: LoRA adapters (minies/lora.py) are trained beside the frozen int8 weights, the
reference policy is the base with the adapters switched off, and checkpoints hold the merged float model.
"""
import contextlib
import copy
import dataclasses
import statistics
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import record_function

from minies import UserError, lora
from minies.runtime import distributed
from minies.config import option, refuse_large_step
from minies.analysis import answer_outcome, js_diversity
from minies.citations import DSM, THREEPO
from minies.grpo_pass import OldLogps, PassLog, batch_counts, micro_batches
from minies.grpo_loss import AGGREGATIONS, group_advantages, grpo_loss
from minies.runtime.guard import check_finite
from minies.runtime.masters import MasterWeights
from minies.models import model_device
from minies.rollout import completion_logprobs, generate, logits_rows


@dataclass
class PolicyGradientConfig:
    """The flags GRPO and 3PO share: the batch, the loss, clipping and LoRA. GRPOConfig adds GRPO's
    optimizer; ThreePOConfig (minies/threepo.py) adds IVON's."""
    # The defaults are the 3PO paper's RL stage (GRPO its baseline); the shipped models' recipes hold what was
    # tuned on them.
    prompts: int = option(32, "prompts per step (P), over all processes", check="count", source=THREEPO)
    group_size: int = option(16, "completions per prompt (G)", check="count", source=f"{THREEPO}: G = 8 to 16")
    temperature: float = option(1.0, "sampling temperature; log-probs are taken at the same temperature",
                                check="temperature")
    lr: float = option(1e-6, "learning rate", check="positive",
                       source=f"{THREEPO}'s GRPO baseline (AdamW); {DSM}, §4.2")
    micro_batch: int = option(64, "completions per forward/backward, at most (fewer when their logits would pass "
                              "1 GiB: minies/rollout.py); gradients accumulate over the batch", check="count")
    epsilon_low: float = option(0.2, "clip the token ratio below at 1 - epsilon_low", check="probability",
                                source=THREEPO)
    epsilon_high: float = option(0.2, "clip the token ratio above at 1 + epsilon_high", check="clip", source=THREEPO)
    beta: float = option(0.0, "weight of the KL penalty to the initial policy (0: no reference is kept)",
                         check="non_negative", source=f"{THREEPO}: no KL")
    scale_rewards: str = option("group", "divide advantages by the group's reward std, the batch's, or nothing "
                                "(Dr. GRPO)", choices=["group", "batch", "none"])
    loss_aggregation: str = option("grpo", "grpo: mean per sequence then over sequences; dapo: mean over tokens; "
                                   "dr_grpo: sum / (B * max_new_tokens)", choices=list(AGGREGATIONS))
    max_grad_norm: float = option(1.0, "clip the gradient norm to this (inf: no clipping)", check="positive_or_inf",
                                  source=THREEPO)
    gradient_checkpointing: bool = option(False, "recompute activations in the backward pass to save memory")
    lora_rank: int = option(0, "train LoRA adapters of this rank on a frozen base; 0: train all weights "
                            "(a model loaded in 8-bit needs > 0)", check="non_negative")
    lora_alpha: float = option(16.0, "LoRA scale numerator: the adapters' output is multiplied by alpha / rank",
                               check="positive")
    lora_targets: str = option("q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
                               "comma-separated names of the linear layers that get adapters")


@dataclass
class GRPOConfig(PolicyGradientConfig):
    optim: str = option("adamw", "optimizer: torch AdamW, or bitsandbytes' 8-bit AdamW (either on fp32 masters "
                        "of half-precision weights)", choices=["adamw", "adamw8bit"])
    updates_per_batch: int = option(1, "optimizer steps on each batch of completions (μ)", check="count",
                                    source=f"{THREEPO}; {DSM}, §4.2: one update per batch")


class Scores(NamedTuple):
    """Per completion [P, G], over the whole batch (all ranks)."""
    rewards: torch.Tensor
    correct: torch.Tensor
    malformed: torch.Tensor
    lengths: torch.Tensor  # completion tokens
    truncated: torch.Tensor  # 1 where the completion hit max_new_tokens without EOS
    diversity: torch.Tensor  # [P]: how differently each group's G completions answer (group_diversity)


class GRPO:
    """GRPO's step (module docstring), its parts marked with torch.profiler ranges (grpo.generate, grpo.verify,
    grpo.logprobs, grpo.loss_backward, grpo.optimizer) for bench/grpo.py."""

    default_steps = 200  # sized for the shipped model (what it gives: docs/results.md)
    resolved = {}  # GRPO and 3PO run their flags as given: nothing left to resolve

    def __init__(self, model, tokenizer, task, config, chat_template=True, compile_decoding=True):
        check_config(model, config)
        self.model, self.tokenizer, self.task, self.config = model, tokenizer, task, config
        self.chat_template, self.compile_decoding = chat_template, compile_decoding
        self.prompts_per_step = config.prompts
        if config.lora_rank > 0:
            lora.add_adapters(model, config.lora_rank, config.lora_alpha, config.lora_targets.split(","))
        # The reference policy for the KL term: under LoRA the base with its adapters off; otherwise a
        # frozen copy of the initial weights; with beta = 0, nothing.
        self.reference = None
        if config.beta > 0 and config.lora_rank == 0:
            self.reference = copy.deepcopy(model).requires_grad_(False)
        if config.gradient_checkpointing:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = self.make_optimizer(self.params)
        # A decoder's buffers (rotary tables) are constants: no need to broadcast them before each forward.
        self.policy = (DistributedDataParallel(model, forward_sync_buffers=False) if distributed.world_size() > 1
                       else model)

    def make_optimizer(self, params):
        """The optimizer of the trained parameters: 3PO's hook, where ThreePO puts IVON. GRPO's is AdamW (or
        bitsandbytes' 8-bit AdamW) on fp32 masters of half-precision parameters (minies/runtime/masters.py); a
        float32 parameter, such as a LoRA adapter, is its own master."""
        if self.config.optim == "adamw8bit":
            import bitsandbytes as bnb
            adamw = bnb.optim.AdamW8bit
        else:
            adamw = torch.optim.AdamW
        return MasterWeights(params, lambda masters: adamw(masters, lr=self.config.lr, weight_decay=0.0))

    def step(self, problems, seed):
        """Sample, score and update on `problems` (the same list on every rank); returns the log."""
        rollouts, scores = self.sample(problems, seed)  # G completions per prompt from π_old, and their rewards
        advantages = self.advantages(scores.rewards)  # A_i within each group
        return step_log(scores, self.update(rollouts, advantages))

    def update(self, rollouts, advantages):
        """μ optimizer steps on this rank's rollouts with their advantages [rows], all against the same
        π_old; returns their log: each statistic averaged over the steps (the entropy is π_old's)."""
        old, logs = OldLogps(), []
        for _ in range(self.config.updates_per_batch):
            logs.append(self.policy_gradient(rollouts, advantages, old))  # ∇L_GRPO in p.grad, clipped
            with record_function("grpo.optimizer"):
                self.optimizer.step()
        return {key: statistics.fmean(log[key] for log in logs if key in log) for key in logs[0]}

    # The pieces of a step, also used by 3PO (minies/threepo.py) ------------------------------------

    def policy_gradient(self, rollouts, advantages, old=None):
        """Leave ∇L_GRPO of this rank's rollouts with their advantages [rows] in p.grad, clipped to
        --max-grad-norm; returns the pass's log over all ranks: the loss, the fractions of tokens clipped,
        the KL when β > 0, the gradient's norm before clipping and, on the first pass, π_old's entropy.

        For each micro-batch (as many completions as rollout.logits_rows allows): log-probs, the loss
        against π_old, backward; the gradients add up. `old` keeps what stays fixed over the μ passes on one
        batch (OldLogps): the first pass, given an empty one or none, fills it."""
        cfg, mask = self.config, rollouts.completion_mask
        old = OldLogps() if old is None else old
        first = not old.policy
        counts = batch_counts(mask, self.task.max_new_tokens)  # the whole batch's, over all ranks
        batches = micro_batches(len(mask), logits_rows(mask.shape[1], self.model.config.vocab_size, cfg.micro_batch))
        # transformers checkpoints activations only in train mode; the models here have no dropout.
        self.model.train(cfg.gradient_checkpointing)
        if first:
            old.reference = self.reference_logps(rollouts, batches)
        log = PassLog(with_kl=cfg.beta > 0, with_entropy=first)
        self.model.zero_grad(set_to_none=True)
        for i, rows in enumerate(batches):
            with self.gradient_sync(last=i == len(batches) - 1):
                logps, entropy = self.logps(self.policy, rollouts, rows, with_entropy=first)
                with record_function("grpo.loss_backward"):
                    loss, stats = grpo_loss(logps, old.policy_logps(i, logps), advantages[rows], mask[rows],
                                            epsilon_low=cfg.epsilon_low, epsilon_high=cfg.epsilon_high,
                                            aggregation=cfg.loss_aggregation, ref_logps=old.reference[i],
                                            beta=cfg.beta, **counts)
                    # The loss is normalized by the whole batch's counts, so the batch's gradient is the sum
                    # over ranks; DDP averages, hence the factor.
                    (loss * distributed.world_size()).backward()
            log.add(loss, stats, mask[rows], entropy)
        self.model.eval()
        check_finite("the loss", log.loss)  # before any optimizer (AdamW, or IVON in 3PO) takes a step
        with record_function("grpo.optimizer"):
            grad_norm = check_finite("the gradient norm",
                                     torch.nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm).item())
        return log.over_ranks(counts["num_tokens"], grad_norm)

    def gradient_sync(self, last):
        """The context of a micro-batch's backward: under DDP, gradients are all-reduced on the last
        micro-batch only; the others accumulate locally."""
        return contextlib.nullcontext() if last or self.policy is self.model else self.policy.no_sync()

    def sample(self, problems, seed):
        """G completions for each of this rank's prompts from the current policy (the sampling policy
        π_old), each group's side by side, and the whole batch's Scores."""
        rollouts = self.generate(self.prompts(problems), seed * distributed.world_size() + distributed.rank())
        return rollouts, self.verify(problems, rollouts)

    def prompts(self, problems):
        """The prompt strings of this rank's rollouts: its share of `problems`, each repeated G times."""
        return self.task.prompts(self.tokenizer, self.rollout_problems(problems), self.chat_template)

    def rollout_problems(self, problems):
        """The problem of each of this rank's rollouts: its share of `problems`, each repeated G times (a
        group's completions side by side)."""
        G = self.config.group_size
        return [problems[i] for i in distributed.shard(list(range(len(problems)))) for _ in range(G)]

    @record_function("grpo.generate")
    def generate(self, prompts, seed):
        """One completion per prompt string from the weights as they are now (a group's prompt runs once where
        decoding is eager: minies/runtime/decoding.py)."""
        self.model.eval()
        return generate(self.model, self.tokenizer, prompts, self.task.max_new_tokens, self.config.temperature,
                        seed=seed, share_prompts=True, compile_decoding=self.compile_decoding)

    @record_function("grpo.verify")
    def verify(self, problems, rollouts):
        """Scores [P, G] of the whole batch: every rank gets them all, for batch-std scaling and the log."""
        mine = distributed.shard(list(range(len(problems))))
        scores = [self.task.score(text, p) for p, text in zip(self.rollout_problems(problems), rollouts.texts)]
        per_completion = torch.tensor([[s.reward, s.correct, s.malformed] for s in scores], dtype=torch.float64)
        per_completion = torch.cat([per_completion, rollouts.lengths[:, None].double(),
                                    rollouts.truncated[:, None].double()], 1)
        table = torch.zeros(len(problems), self.config.group_size, per_completion.shape[1], dtype=torch.float64)
        table[mine] = per_completion.view(len(mine), self.config.group_size, -1)
        diversity = torch.zeros(len(problems), dtype=torch.float64)
        diversity[mine] = group_diversity(scores, self.config.group_size)
        return Scores(*distributed.all_reduce_sum(table).unbind(-1), distributed.all_reduce_sum(diversity))

    def advantages(self, rewards):
        """This rank's rows of the batch's group advantages (rewards [P, G], on the host), in its rollouts'
        order, on the model's device, where the loss uses them."""
        mine = distributed.shard(list(range(len(rewards))))
        return group_advantages(rewards, self.config.scale_rewards)[mine].flatten().float().to(model_device(self.model))

    @record_function("grpo.logprobs")
    def logps(self, model, rollouts, rows, with_entropy=False):
        """Log-probs [rows, C] of the completion tokens under `model` (and their entropies, else None)."""
        out = completion_logprobs(model, rollouts.prompt_ids[rows], rollouts.prompt_mask[rows],
                                  rollouts.completion_ids[rows], rollouts.completion_mask[rows],
                                  self.config.temperature, with_entropy=with_entropy, chunk=self.config.micro_batch)
        return out if with_entropy else (out, None)

    def reference_logps(self, rollouts, batches):
        """Per micro-batch, the reference policy's log-probs for the KL term (None each when β = 0).
        On the CPU, bitsandbytes computes in float in train mode and in int8 in eval mode, so these are
        computed in the policy's mode: equal weights give a KL of exactly 0."""
        if self.config.beta == 0:
            return [None] * len(batches)
        reference = self.model if self.reference is None else self.reference
        with torch.no_grad(), lora.adapters_disabled(self.model):
            return [self.logps(reference, rollouts, rows)[0] for rows in batches]

    def state_dict(self):
        """The trained weights (the adapters alone under LoRA) and the optimizer's state, which holds the
        fp32 masters of half-precision weights."""
        weights = {name: p.detach() for name, p in self.model.named_parameters() if p.requires_grad}
        return {"weights": weights, "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state):
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, value in state["weights"].items():
                params[name].copy_(value)
        self.optimizer.load_state_dict(state["optimizer"])

    def model_to_save(self):
        """The model as a plain checkpoint: adapters merged into dequantized weights under LoRA."""
        return lora.merged_model(self.model) if self.config.lora_rank > 0 else self.model


def check_config(model, config):
    """The one-line errors of a GRPO or 3PO run that its flags' own checks (minies/config.py) cannot make."""
    world = distributed.world_size()
    if config.group_size < 2:
        raise UserError("--group-size must be at least 2: advantages compare completions within a group")
    if config.prompts < world:
        raise UserError(f"--prompts {config.prompts}: need one prompt per process ({world})")
    if any(p.dtype == torch.int8 for p in model.parameters()) and config.lora_rank == 0:
        raise UserError("a model loaded in 8-bit cannot be trained directly: pass --lora-rank (e.g. 16)")
    unused = [f.name for f in dataclasses.fields(config) if f.name in ("lora_alpha", "lora_targets")
              and getattr(config, f.name) != f.default]
    if unused and config.lora_rank == 0:
        raise UserError(f"--{unused[0].replace('_', '-')} shapes LoRA adapters, which --lora-rank 0 does not add; "
                        "pass --lora-rank (e.g. 16) or drop it")
    refuse_large_step({"--prompts": config.prompts, "--group-size": config.group_size})


def group_diversity(scores, group_size):
    """Per group, the verifier-projected JS diversity of its G completions (minies/analysis.py), each completion a
    member with one outcome: the entropy of the group's outcomes over log2(G). It is ES's js_diversity of its
    population (minies/es_log.py) for a group of samples, which paper A compares with it."""
    labels = [answer_outcome(s) for s in scores]
    return torch.tensor([js_diversity([[[label]] for label in labels[i:i + group_size]])
                         for i in range(0, len(labels), group_size)], dtype=torch.float64)


def step_log(scores, update_log):
    """A step's log row: the batch's rewards and lengths around the update's log."""
    rewards, correct = scores.rewards, scores.correct
    return {"reward_mean": rewards.mean().item(), "reward_std": rewards.std().item(),
            "accuracy": correct.mean().item(), "malformed": scores.malformed.mean().item(),
            "zero_std_groups": rewards.eq(rewards[:, :1]).all(1).double().mean().item(),
            # Per prompt, in order: runs with the same --seed see the same prompts, so this pairs them.
            "groups_solved": correct.gt(0).any(1).int().tolist(),
            "group_diversity": scores.diversity.mean().item(),  # ES logs its population's, js_diversity
            **update_log, "length_mean": scores.lengths.mean().item(), "length_max": scores.lengths.max().item(),
            "truncated_rate": scores.truncated.mean().item(), "tokens": int(scores.lengths.sum().item())}
