"""Evolution Strategies (Salimans et al. 2017; Qiu et al. 2025, "ES at scale") with seeded in-place noise.

One step, with N members, noise scale σ and step size α (docs/papers.md, "ES"):

    for n = 1..N:   θ_n = θ + σ·ε_n          ε_n ~ N(0, I), regenerated from (seed_n, tensor index)
                    R_n = mean reward of the model θ_n on the step's prompts
    z = normalize(R)                          centered ranks or z-scores (--normalize)
    θ ← θ + α · (1/N) · Σ_n z_n ε_n          (1/σ is folded into α)

No noise is stored: each ε_n is regenerated from its seed, once to perturb and once for the update.
Mirrored pairs (--antithetic) ε_{2k+1} = −ε_{2k} cancel the even part of the reward landscape from the
estimate, and a pair's two update terms merge into one, (z_{2k} − z_{2k+1})·ε_{2k}. Centered ranks
ignore how far apart the rewards are (one outlier member cannot dominate); z-scores keep it.
The model's weights are only ever written from fp32 masters, clean = cast(master) and perturbed =
cast(master + σ·ε), so restoring is bit-exact in every dtype, 8-bit included (minies/perturbed.py).

Two modes (--mode). `inplace` writes each member's weights into the model and scores the members one
after another (ES.score). `lowrank` (EGGROLL, minies/eggroll.py) adds rank-r noise in the forward pass,
so several members generate in one batch; its update goes into the same masters. `auto` picks lowrank
when a generate call holds two members or more (minies/runtime/placement.py), else in place, and in place
when --params names no weight matrix.

Distributed: member n is scored on rank n mod P; the N rewards are summed with one all-reduce and every
rank applies the same update, so the replicas stay identical without exchanging weights.

The step's log row is minies/es_log.py's. What makes the step fast and what it keeps in memory (the
step's noise kept on a CPU, where the masters live): docs/speed.md.
"""
import re
import time
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import numpy as np
import torch

from torch.profiler import record_function

from minies import UserError, lora
from minies.runtime import distributed
from minies.config import option, refuse_large_step
from minies.analysis import squared_distance
from minies.eggroll import LowRankPopulation, matrix_modules
from minies.es_log import step_log
from minies.metrics import average_ranks
from minies.models import int8_row_scales, model_device
from minies.perturbed import PerturbedTensor, StepNoise
from minies.runtime.placement import choose_mode, master_device
from minies.runtime.spilled import SpilledTensors, TensorsInMemory
from minies.citations import QIU
from minies.rollout import encode, generate


@dataclass
class ESConfig:
    # The defaults are Qiu et al.'s (their code); the shipped models' recipes hold what was tuned on them.
    population: int = option(30, "members per step (N); even when antithetic", check="count",
                             source=f"{QIU}es_fine-tuning_countdown.py: POPULATION_SIZE")
    sigma: float = option(1e-3, "noise scale σ of the perturbations", check="positive",
                          source=f"{QIU}es_fine-tuning_countdown.py: SIGMA")
    alpha: float = option(5e-4, "step size α (1/σ folded in)", check="positive",
                          source=f"{QIU}es_fine-tuning_countdown.py: ALPHA, with 1/N in the update")
    prompts_per_step: int = option(200, "prompts every member is scored on (the same for all members)",
                                   check="count", source="Qiu et al. 2025: --data_sample 200, all scored every step")
    antithetic: bool = option(False, "mirrored pairs +ε / −ε",
                              source=f"{QIU}es_fine-tuning_countdown.py: every member's seed drawn on its own")
    normalize: str = option("zscore", "reward normalization across members", choices=["rank", "zscore"],
                            source=f"{QIU}es_fine-tuning_countdown.py: (r − mean) / (std + 1e-8)")
    params: str = option(".*", "regex: perturb only the parameters whose name matches ('.*': all; the shipped "
                         "model's recipe names its embeddings and first block)", check="regex",
                         source=f"{QIU}es_fine-tuning_countdown.py: every named parameter is perturbed")
    greedy: bool = option(True, "score members with greedy decoding (else sampled at --temperature)",
                          source=f"{QIU}es_fine-tuning_countdown.py: do_sample = False")
    temperature: float = option(1.0, "sampling temperature when not greedy", check="temperature")
    micro_batch: int = option(1024, "sequences per generate call (lowrank: members per call = this // prompts)",
                              check="count")
    mode: str = option("auto", "inplace: perturb the weights, one member at a time; lowrank: EGGROLL, "
                       "rank-r noise added in the forward pass, many members per batch (minies/eggroll.py); auto: "
                       "the faster of the two for the batch shape (minies/runtime/placement.py), said at start when "
                       "it is lowrank: another estimator than full-rank in place, which on SmolLM2 learned as much "
                       "at equal tokens in under a third of the time (docs/real-models.md#es-mode)",
                       choices=["auto", "inplace", "lowrank"])
    rank: int = option(1, "rank r of each member's perturbation A·Bᵀ/√r in lowrank mode", check="count")
    master_device: str = option("auto", "where the fp32 master weights live when the model is on CUDA: cpu (pinned "
                                "host memory), cuda, or auto: cuda when they fit (master_device); on a CPU: cpu",
                                choices=["auto", "cpu", "cuda"])


def check_config(config):
    """Refuse, once and before anything is built, a population ES cannot rank and a step too large to run."""
    if config.population < 2:
        raise UserError(f"--population {config.population}: ES ranks members against each other; it needs at least 2")
    if config.antithetic and config.population % 2:
        raise UserError(f"--population {config.population}: must be even with --antithetic")
    refuse_large_step({"--population": config.population, "--prompts-per-step": config.prompts_per_step})


def member_seeds(step_seed, population, antithetic):
    """(seed, sign) of each member; the seeds depend only on the step's seed."""
    rng = np.random.default_rng(step_seed)
    if antithetic:
        return [(int(s), sign) for s in rng.integers(0, 2**62, population // 2) for sign in (1.0, -1.0)]
    return [(int(s), 1.0) for s in rng.integers(0, 2**62, population)]


def normalize_rewards(rewards, how):
    """Centered ranks in [−0.5, 0.5] (ties share their mean rank) or z-scores; all zeros when all tie. Ties are
    equal values, not a zero std: the mean of N equal rewards such as 0.1 rounds, their std is then ~1e-17, and
    every z-score would be −1 or +1, a full step in a random direction."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.max() == r.min():
        return np.zeros_like(r)
    if how == "zscore":
        return (r - r.mean()) / r.std()
    return average_ranks(r) / (len(r) - 1) - 0.5


class ScoredRollouts(NamedTuple):
    """Completions of the step's prompts, one row each, as the task's verifier scored them."""
    scores: list  # task.score(completion, problem): Score(reward, correct, malformed, answer, ...)
    truncated: np.ndarray  # cut off at max_new_tokens, without an end token
    lengths: np.ndarray  # generated tokens

    @property
    def rewards(self):
        """[rows] the rewards, in float64."""
        return np.array([s.reward for s in self.scores])

    def split(self, k):
        """k ScoredRollouts of as many rows each: the member-major blocks of a batch that held k members."""
        rows = len(self.scores) // k
        return [ScoredRollouts(*(field[j * rows:(j + 1) * rows] for field in self)) for j in range(k)]


def mean_rewards(rollouts, population):
    """[population] mean reward R_n of each member: `rollouts` ({n: ScoredRollouts}) holds this rank's
    members, the other ranks' are summed in by one all-reduce."""
    rewards = torch.zeros(population, dtype=torch.float64)
    for n, r in rollouts.items():
        rewards[n] = r.rewards.mean()
    return distributed.all_reduce_sum(rewards).numpy()


def perturbed_tensors(model, config):
    """A PerturbedTensor for each parameter --params names, and where their fp32 masters live: where
    --master-device says, auto resolved (runtime/placement.master_device)."""
    owner = {id(p): m for m in model.modules() for p in m.parameters(recurse=False)}
    pattern = re.compile(config.params)
    chosen = [(i, name, p) for i, (name, p) in enumerate(model.named_parameters()) if pattern.search(name)]
    masters = master_device(config.master_device, model_device(model), sum(p.numel() for _, _, p in chosen))
    return [PerturbedTensor(i, name, p, owner[id(p)], masters) for i, name, p in chosen], masters.type


def resolve_mode(config, model, tensors):
    """The mode that runs: --mode, or for auto lowrank when a generate call holds two members or more
    (runtime/placement.choose_mode), but in place when --params names no weight matrix, as lowrank would have
    nothing to perturb."""
    if config.mode != "auto":
        return config.mode
    return "inplace" if not matrix_modules(model, tensors) else choose_mode(
        config.prompts_per_step, -(-config.population // distributed.world_size()), config.micro_batch)


class ES:
    """ES's step (module docstring), its parts marked with torch.profiler ranges (es.rollout, es.update)
    for bench/es.py."""

    default_steps = 500  # Qiu et al. 2025's NUM_ITERATIONS; the shipped models' recipes set their own

    def __init__(self, model, tokenizer, task, config, chat_template=True, compile_decoding=True):
        check_config(config)  # a bad --population fails now, not after an evaluation
        self.model, self.tokenizer, self.task, self.config = model, tokenizer, task, config
        self.chat_template, self.compile_decoding = chat_template, compile_decoding
        self.prompts_per_step = config.prompts_per_step
        tensors, masters = perturbed_tensors(model, config)
        # What --mode auto and --master-device auto resolved to: config.json records them (train.py).
        self.resolved = {"mode": resolve_mode(config, model, tensors), "master_device": masters}
        # Built before θ0 is copied: the float32 masters lowrank shares with the params are freed first.
        self.lowrank = LowRankPopulation(model, tensors, config.rank) if self.resolved["mode"] == "lowrank" else None
        self.tensors = self.lowrank.tensors if self.lowrank else tensors
        if not self.tensors:
            in_mode = " that lowrank mode perturbs (weights of Linear and embedding layers)" if self.lowrank else ""
            raise UserError(f"--params {config.params!r} matches no parameter of the model{in_mode}")
        # An optional speed layer: in place on a CPU, the step's ε kept once drawn (minies/perturbed.py).
        seeds = config.population // 2 if config.antithetic else config.population
        self.step_noise = None if self.lowrank else StepNoise.when_it_pays(self.tensors, seeds, model_device(model))
        # θ0 for the drift log and the checkpoints: with the masters on CUDA, in pinned host memory (the drift
        # streams it there); with them on the host, in a temporary file (minies/runtime/spilled.py)
        if masters == "cuda":
            self.theta0 = TensorsInMemory(torch.empty(t.master.shape, pin_memory=True).copy_(t.master)
                                          for t in self.tensors)
        else:
            self.theta0 = SpilledTensors([t.master for t in self.tensors])
        model.requires_grad_(False)  # ES never needs gradients; this also keeps generate cheap

    @torch.no_grad()
    def step(self, problems, seed):
        """One ES step (module docstring): score the members, normalize their rewards, update. Returns the
        step's log row (minies/es_log.py)."""
        members = member_seeds(seed, self.config.population, self.config.antithetic)
        started = time.time()
        rollouts, int8_clamps = self.score(members, problems, seed)  # this rank's share: {n: ScoredRollouts}
        scored = time.time()
        rewards = mean_rewards(rollouts, len(members))  # R_n of every member, over all ranks
        z = normalize_rewards(rewards, self.config.normalize)
        update_norm = self.update(members, z)
        for kept in (self.lowrank, self.step_noise):  # forget the step's noise: the next step's seeds differ
            if kept:
                kept.end_step()
        with record_function("es.drift"):
            drift = squared_distance(self.theta0, [t.master for t in self.tensors]) ** 0.5  # ‖θ − θ0‖
        return step_log(rollouts, rewards, z, update_norm, drift, int8_clamps, started, scored)

    def score(self, members, problems, seed):
        """({n: ScoredRollouts} of each member n in this rank's share, its int8 clamps for the log). In place:
        each member in turn, θ + sign·σ·ε written into the model, then scored; θ written back after the last.
        Common random numbers: every member is scored on the same prompts with the same sampling seed."""
        mine = [(n, members[n]) for n in distributed.shard(list(range(len(members))))]
        prompts = self.tokenize_prompts(problems)
        if self.lowrank:  # k members per generate call, each row block at its own θ + sign·σ·E (minies/eggroll.py)
            rollout = partial(self.rollout, problems, prompts, seed)  # rollout(copies, micro_batch)
            return dict(self.lowrank.score_members(mine, self.config.sigma, rollout, len(problems),
                                                   self.config.micro_batch)), None
        rollouts, clamped = {}, 0
        for i, (n, (member_seed, sign)) in enumerate(mine):
            for t in self.tensors:  # perturb: cast(master + sign·σ·ε), counting the int8 elements clamped to ±127
                clamped += t.write_perturbed(member_seed, sign, self.config.sigma, self.step_noise)
            if self.step_noise and i + 1 < len(mine):  # draw the next member's ε while this one is scored
                _, (next_seed, _) = mine[i + 1]
                self.step_noise.prefetch(next_seed)
            # score: the member generates alone (its weights are the model's), in calls of --micro-batch rows
            rollouts[n] = self.rollout(problems, prompts, seed, 1, self.config.micro_batch)[0]
        # Restore, once: each member's weights were written from the masters, not added to the member's before.
        for t in self.tensors:
            t.write_clean()
        int8 = sum(t.param.numel() for t in self.tensors if t.int8)  # the int8 elements each member writes
        return rollouts, ((clamped, int8) if int8 else None)

    @record_function("es.update")
    def update(self, members, z):
        """θ ← θ + α·(1/N)·Σ_n z_n·ε_n (ε_n signed: −ε of its pair for a mirrored member), on each
        perturbed tensor's fp32 master, then the model's tensor is rewritten from it. Returns the update's norm."""
        # The sum as (seed, coefficient) terms. An optimization: a mirrored pair shares its seed, hence its ε,
        # so its two terms merge into one, (z_2k − z_2k+1)·ε_2k, and each ε is regenerated once, not twice.
        terms = {}
        for (member_seed, sign), zn in zip(members, z):
            terms[member_seed] = terms.get(member_seed, 0.0) + float(sign * zn)
        terms = [(member_seed, c) for member_seed, c in terms.items() if c]
        if not terms:  # every reward tied: no signal, no step
            return 0.0
        update_sq, scale = 0.0, self.config.alpha / len(members)
        for t in self.tensors:  # master += scale·Σ c·ε (lowrank: Σ c·E, one matmul), each returning ‖that‖²
            update_sq += self.lowrank.add_update(t, terms, scale) if self.lowrank else t.add_update(
                terms, scale, self.step_noise)
            t.write_clean()
        return update_sq ** 0.5

    def tokenize_prompts(self, problems):
        """The prompts of `problems`, chat-formatted and tokenized (rollout.encode): once per step, as every
        member is scored on them."""
        return encode(self.tokenizer, self.task.prompts(self.tokenizer, problems, self.chat_template))

    @torch.no_grad()
    @record_function("es.rollout")  # these ranges, with perturbed.py's and eggroll.py's, are bench/es_profile.py's
    def rollout(self, problems, prompts, seed, copies, micro_batch):
        """The model's completions of `copies` copies of `problems` (`prompts`: their tokenize_prompts), stacked
        member-major, in generate calls of `micro_batch` rows, each scored by the task: one ScoredRollouts per
        copy, at the weights ES.score has set for it (written into the model, or hooked)."""
        batch = {name: value.repeat(copies, 1) for name, value in prompts.items()}
        r = generate(self.model, self.tokenizer, batch, self.task.max_new_tokens, self.config.temperature,
                     greedy=self.config.greedy, micro_batch=micro_batch, seed=seed,
                     # lowrank decodes eagerly: compiled decoding pads a call's rows to a bucket, which would shift
                     # the member blocks its hooks perturb (minies/runtime/decoding.py)
                     compile_decoding=self.compile_decoding and self.lowrank is None)
        with record_function("es.verify"):
            scores = [self.task.score(text, problem) for problem, text in zip(problems * copies, r.texts)]
        return ScoredRollouts(scores, r.truncated.numpy(), r.lengths.numpy()).split(copies)

    def state_dict(self):
        """The fp32 masters and θ0, and the row scales of int8 weights (an update can raise them), which with the
        masters make the model exactly: --resume writes them into the start model."""
        return {"master": [t.master.cpu() for t in self.tensors], "theta0": list(self.theta0),
                "row_scales": [int8_row_scales(t.module).cpu() if t.int8 else None for t in self.tensors]}

    def load_state_dict(self, state):
        for i, (t, master, saved_t0, scales) in enumerate(zip(self.tensors, state["master"], state["theta0"],
                                                              state["row_scales"])):
            t.master.copy_(master)
            self.theta0.write(i, saved_t0)
            if scales is not None:
                int8_row_scales(t.module).copy_(scales)
            t.write_clean()

    def model_to_save(self):
        """The model; with 8-bit weights its dequantized float copy, which any from_pretrained loads (as 8-bit
        again with --load-in-8bit)."""
        int8 = any(p.dtype == torch.int8 for p in self.model.parameters())
        return lora.merged_model(self.model) if int8 else self.model
