"""Evolution Strategies (Salimans et al. 2017; Qiu et al. 2025, "ES at scale") with seeded in-place noise.

One step, with N members, noise scale σ and step size α (docs/papers.md, "ES"):

    for n = 1..N:   θ_n = θ + σ·ε_n          ε_n ~ N(0, I), regenerated from (seed_n, tensor index)
                    R_n = mean reward of the model θ_n on the step's prompts
    z = normalise(R)                          centred ranks (default) or z-scores
    θ ← θ + α · (1/N) · Σ_n z_n ε_n          (1/σ is folded into α)

Antithetic sampling uses mirrored pairs ε_{2k+1} = −ε_{2k}, which cancels the even part of the
reward landscape from the estimate. No noise needs storing: every ε_n is regenerated from its seed,
once to perturb and once for the update (where a mirrored pair's two terms merge into one, (z_{2k} −
z_{2k+1})·ε_{2k}), one parameter tensor at a time, on that tensor's device. On a CPU, where drawing ε
costs more than everything else a write does, a step keeps each ε it drew in host memory when all of the
step's noise fits in 1 GiB, so each is drawn once per step, not three times, and in the background
while the member before is scored (StepNoise, minies/perturbed.py); every result is the same either way.

Exact restore and lossless updates: each perturbed tensor keeps an fp32 master copy, and the model's
tensor is only ever written from it (clean = cast(master), perturbed = cast(master + σ·ε)), in bf16 and
in 8-bit alike; minies/perturbed.py explains why and how.

Two ways to score the population (--mode). `inplace` (above) writes each member's weights into the
model and scores the members one after another. `lowrank` (EGGROLL, minies/eggroll.py) never modifies
the weights while scoring: each member's noise is a rank-r matrix added in the forward pass, so several
members generate together in one batch; the update is the same as in place, into the same fp32 masters
(a float32 weight is its own master there: lowrank never writes perturbed values into the model).
`--mode auto` (the default) picks the faster one for the batch shape (minies/placement.py): lowrank
when a generate call holds two members or more, else in place. Lowrank perturbs only the weight
matrices that --params names, so auto stays in place when --params names none. The shipped models and
the qiu2025 recipe name `inplace`, the mode their settings were tuned and their results measured in.

Distributed: member n is scored on rank n mod P (a static split, so runs are reproducible); the N
rewards are summed with one all-reduce; every rank then applies the same update to its own replica, so
the weights stay identical without ever being communicated.
"""
import re
import time
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from minies import UserError, distributed
from minies.analysis import answer_outcome, js_diversity
from minies.config import option
from minies.eggroll import LowRankPopulation, matrix_modules
from minies.evaluate import score_rollouts
from minies.guard import check_finite
from minies.metrics import average_ranks
from minies.models import model_device
from minies.perturbed import PerturbedTensor, StepNoise, noise
from minies.placement import choose_mode, master_device
from minies.rollout import encode, generate


@dataclass
class ESConfig:
    population: int = option(32, "members per step (N); even when antithetic", check="positive")
    sigma: float = option(8e-3, "noise scale σ of the perturbations", check="positive")
    alpha: float = option(1e-2, "step size α (1/σ folded in)", check="positive")
    prompts_per_step: int = option(256, "prompts every member is scored on (the same for all members)",
                                   check="positive")
    antithetic: bool = option(True, "mirrored pairs +ε / −ε")
    normalize: str = option("rank", "reward normalisation across members", choices=["rank", "zscore"])
    params: str = option(".*", "regex: perturb only the parameters whose name matches ('.*': all; the shipped "
                         "model's recipe names its embeddings and first block)")
    greedy: bool = option(True, "score members with greedy decoding (else sampled at --temperature)")
    temperature: float = option(1.0, "sampling temperature when not greedy", check="positive")
    micro_batch: int = option(1024, "sequences per generate call (lowrank: members per call = this // prompts)",
                              check="positive")
    mode: str = option("auto", "inplace: perturb the weights, one member at a time; lowrank: EGGROLL, "
                       "rank-r noise added in the forward pass, many members per batch (minies/eggroll.py); auto: "
                       "the faster of the two for the batch shape (minies/placement.py)",
                       choices=["auto", "inplace", "lowrank"])
    rank: int = option(1, "rank r of each member's perturbation A·Bᵀ/√r in lowrank mode", check="positive")
    master_device: str = option("auto", "where the fp32 master weights live when the model is on CUDA: cpu (pinned "
                                "host memory), cuda, or auto: cuda when they fit (master_device); on a CPU: cpu",
                                choices=["auto", "cpu", "cuda"])


def member_seeds(step_seed, population, antithetic):
    """(seed, sign) of each member; the seeds depend only on the step's seed."""
    rng = np.random.default_rng(step_seed)
    if antithetic:
        if population % 2:
            raise UserError(f"--population {population}: must be even with --antithetic")
        return [(int(s), sign) for s in rng.integers(0, 2**62, population // 2) for sign in (1.0, -1.0)]
    return [(int(s), 1.0) for s in rng.integers(0, 2**62, population)]


def normalize_rewards(rewards, how):
    """Centred ranks in [−0.5, 0.5] (ties share their mean rank) or z-scores; all zeros when all tie."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.std() == 0:
        return np.zeros_like(r)
    if how == "zscore":
        return (r - r.mean()) / r.std()
    return average_ranks(r) / (len(r) - 1) - 0.5


class Fitness(NamedTuple):
    """The population's scores in one step, over all ranks."""
    rewards: np.ndarray  # [N] mean reward of each member
    errors: np.ndarray  # [N] standard error of each member's mean reward
    outcomes: dict  # member -> per-prompt outcome labels (minies.analysis.answer_outcome)
    tokens: int  # generated tokens
    truncated_rate: float  # share of completions cut off at max_new_tokens (no EOS): a reasoning trace cut short
    int8_clamped: float  # per member, the share of int8 weights clamped at ±127 by the perturbation (else nan)
    seconds_per_member: float  # on this rank


def population_log(fitness, z, num_problems):
    """The log's view of a population: its rewards, how far their spread stands above the noise of
    measuring one member, and how differently the members answer."""
    rewards, outcomes = fitness.rewards, fitness.outcomes
    return {
        "reward_mean": float(rewards.mean()), "reward_max": float(rewards.max()),
        "reward_min": float(rewards.min()), "reward_std": float(rewards.std()),
        # Spread of the members' fitness over the noise of measuring one member's fitness:
        # below ~1 the ranking is mostly noise (use more prompts or a larger σ).
        "fitness_snr": float(rewards.std() / max(fitness.errors.mean(), 1e-12)),
        "all_tied": bool(not z.any()),
        # How differently the members answer, seen through the verifier (0: all alike, 1: all differ).
        "js_diversity": js_diversity([[[outcomes[n][j]] for j in range(num_problems)] for n in sorted(outcomes)])
        if len(outcomes) > 1 else 0.0,
        "truncated_rate": fitness.truncated_rate,
        **({} if np.isnan(fitness.int8_clamped) else {"int8_clamped": fitness.int8_clamped}),
    }


DRIFT_CHUNK = 2**18  # elements per chunk of ES.drift: 1 MB of fp32, cache-sized


class ES:
    resume_from_base = False  # checkpoints hold the trained model itself
    default_steps = 140  # sized for the shipped model (what it gives: docs/results.md)

    def __init__(self, model, tokenizer, task, config, chat_template=True):
        self.model, self.tokenizer, self.task, self.cfg = model, tokenizer, task, config
        self.chat_template = chat_template
        self.prompts_per_step = config.prompts_per_step
        member_seeds(0, config.population, config.antithetic)  # a bad --population fails now, not after an evaluation
        owner = {id(p): m for m in model.modules() for p in m.parameters(recurse=False)}
        pattern = re.compile(config.params)
        chosen = [(i, name, p) for i, (name, p) in enumerate(model.named_parameters()) if pattern.search(name)]
        device = model_device(model)
        masters = master_device(config.master_device, device, sum(p.numel() for _, _, p in chosen))
        config.master_device = masters.type
        self.tensors = [PerturbedTensor(i, name, p, owner[id(p)], masters) for i, name, p in chosen]
        if config.mode == "auto":  # resolved here, so config.json records the mode that ran
            # In place when --params names no weight matrix: lowrank would have nothing to perturb.
            config.mode = "inplace" if not matrix_modules(model, self.tensors) else choose_mode(
                config.prompts_per_step, -(-config.population // distributed.world_size()), config.micro_batch)
        self.lowrank, self.population = config.mode == "lowrank", None
        if self.lowrank:
            self.population = LowRankPopulation(model, self.tensors, config.rank, noise)
            self.tensors = self.population.tensors
            for t in self.tensors:
                t.share_param()  # before θ0 is copied below: the masters' copies are freed first
        if not self.tensors:
            in_mode = " that lowrank mode perturbs (weights of Linear and embedding layers)" if self.lowrank else ""
            raise UserError(f"--params {config.params!r} matches no parameter of the model{in_mode}")
        # θ0 for the drift log, in host memory (pinned when the masters are on CUDA: drift() streams it there)
        self.theta0 = [torch.empty(t.master.shape, pin_memory=masters.type == "cuda").copy_(t.master)
                       for t in self.tensors]
        # In place: each member's ε, kept for the step when that pays (minies/perturbed.py).
        seeds = config.population // 2 if config.antithetic else config.population
        self.noise = None if self.lowrank else StepNoise(self.tensors, seeds, device)
        for p in model.parameters():
            p.requires_grad_(False)  # ES never needs gradients; this also keeps generate cheap

    def format(self, problems):
        """The prompts of `problems`, chat-formatted and tokenized (rollout.encode): once per step, as every
        member is scored on them (per member, they would cost several per cent of its scoring)."""
        return encode(self.tokenizer, self.task.prompts(self.tokenizer, problems, self.chat_template))

    @torch.no_grad()
    def score(self, problems, prompts, seed, micro_batch=None):
        """Per-prompt rewards of the model as it is now on `problems` (`prompts`: their ES.format),
        per-prompt truncation flags, the number of generated tokens, and per-prompt outcome labels
        (minies.analysis.answer_outcome) for the population's diversity."""
        r = generate(self.model, self.tokenizer, prompts, self.task.max_new_tokens, self.cfg.temperature,
                     greedy=self.cfg.greedy, micro_batch=micro_batch or self.cfg.micro_batch, seed=seed)
        scores = score_rollouts(self.task, problems, r.texts)
        outcomes = [answer_outcome(score) for score in scores]
        truncated = r.truncated.numpy()
        return np.array([s.reward for s in scores]), truncated, int(r.lengths.sum()), outcomes

    @torch.no_grad()
    def step(self, problems, seed):
        """One ES step (module docstring): score the members, normalise their rewards, update."""
        members = member_seeds(seed, self.cfg.population, self.cfg.antithetic)
        start = time.time()
        fitness = self.score_population(members, problems, seed)  # R_n of every member, over all ranks
        z = normalize_rewards(fitness.rewards, self.cfg.normalize)
        update_norm = self.update(members, z)
        (self.population.drawn if self.lowrank else self.noise).clear()  # a step's noise is never needed again
        return {**population_log(fitness, z, len(problems)), "update_norm": update_norm, "drift": self.drift(),
                "seconds_per_member": fitness.seconds_per_member,
                "tokens_per_second": fitness.tokens / max(time.time() - start, 1e-9),  # all ranks together
                "tokens": fitness.tokens}

    def score_population(self, members, problems, seed):
        """Every member's mean reward on `problems` (this rank scores its share; one all-reduce), with
        what population_log needs."""
        rewards = torch.zeros(len(members), dtype=torch.float64)
        errors = torch.zeros(len(members), dtype=torch.float64)  # standard error of each member's mean reward
        # Sums over this rank's members: generated tokens, truncated completions, clamped int8 weights.
        counts = torch.zeros(3, dtype=torch.float64)
        int8 = [t for t in self.tensors if t.int8]
        for t in int8:
            t.clamped = 0
        start = time.time()
        mine = distributed.shard(list(range(len(members))))
        outcomes = {}
        prompts = self.format(problems)
        for n, per_prompt, truncated, count, labels in self.score_members(members, mine, problems, prompts, seed):
            rewards[n], errors[n] = per_prompt.mean(), per_prompt.std() / np.sqrt(len(per_prompt))
            counts += torch.tensor([count, truncated.sum(), 0.0], dtype=torch.float64)
            outcomes[n] = labels
        counts[2] = sum(t.clamped for t in int8)
        seconds_per_member = (time.time() - start) / max(len(mine), 1)
        for x in (rewards, errors, counts):
            distributed.all_reduce_sum(x)
        outcomes = {n: o for part in distributed.all_gather_objects(outcomes) for n, o in part.items()}
        tokens, truncated, clamped = counts.tolist()
        # Only in-place scoring writes perturbed int8 weights; lowrank adds its noise in the forward pass.
        int8_weights = sum(t.param.numel() for t in int8)
        int8_clamped = clamped / (len(members) * int8_weights) if int8 and not self.lowrank else float("nan")
        return Fitness(rewards.numpy(), errors.numpy(), outcomes, int(tokens),
                       truncated / (len(members) * len(problems)), int8_clamped, seconds_per_member)

    def update(self, members, z):
        """θ ← θ + α·(1/N)·Σ_n z_n·ε_n (ε_n signed: −ε of its pair for a mirrored member), on each perturbed
        tensor's fp32 master, then the model's tensor is rewritten from it. Returns the update's norm."""
        # The sum as (seed, coefficient) terms. An optimisation: a mirrored pair shares its seed, hence its ε,
        # so its two terms merge into one, (z_2k − z_2k+1)·ε_2k, and each ε is regenerated once, not twice.
        terms = {}
        for (member_seed, sign), zn in zip(members, z):
            terms[member_seed] = terms.get(member_seed, 0.0) + float(sign * zn)
        terms = [(member_seed, c) for member_seed, c in terms.items() if c]
        if not terms:  # every reward tied: no signal, no step
            return 0.0
        update_sq, scale = 0.0, self.cfg.alpha / len(members)
        for t in self.tensors:
            if self.lowrank:  # Σ c·A·Bᵀ/√r as one matmul into the master (eggroll.py)
                update_sq += self.population.add_update(t, terms, scale)
            else:
                delta = scale * self.direction(t, terms).to(t.master.device)  # Σ c·ε, from the seeds
                check_finite(f"the update of {t.name}", delta)  # before it reaches the master
                t.master += delta
                update_sq += float(delta.pow(2).sum())
            t.clean()
        return update_sq ** 0.5

    def drift(self):
        """‖θ − θ0‖ over the perturbed tensors, a chunk at a time: a whole tensor's difference would be a
        temporary as large as the tensor, allocated and freed every step (a 0.5B model's embedding: 0.5 GB;
        its drift took 2 s a step that way, 0.2 s in chunks); a chunk's stays in cache. Computed where the
        masters are: on CUDA θ0's chunks stream to the device, and the step waits once, for the total."""
        distances = []
        for t, t0 in zip(self.tensors, self.theta0):
            for chunk, chunk0 in zip(t.master.reshape(-1).split(DRIFT_CHUNK), t0.reshape(-1).split(DRIFT_CHUNK)):
                distances.append(torch.dist(chunk, chunk0.to(chunk.device, non_blocking=True)))
        return float(torch.stack(distances).double().pow(2).sum()) ** 0.5

    def score_members(self, members, mine, problems, prompts, seed):
        """Yield (n, per-prompt rewards, per-prompt truncation flags, generated tokens, per-prompt outcomes)
        for each member n in `mine`.
        Common random numbers: every member is scored on the same prompts with the same sampling seed."""
        if not self.lowrank:  # in place: write θ + σ·ε_n into the model, one member at a time
            for i, n in enumerate(mine):
                member_seed, sign = members[n]
                for t in self.tensors:  # ε from the step's cache when it keeps them, else drawn by perturbed()
                    eps = self.noise(member_seed, t) if self.noise.cached else None
                    t.perturbed(member_seed, sign, self.cfg.sigma, eps=eps)
                if i + 1 < len(mine):
                    self.noise.prefetch(members[mine[i + 1]][0])  # the next member's ε, while this one is scored
                yield (n, *self.score(problems, prompts, seed))
            for t in self.tensors:
                t.clean()
            return
        # lowrank: k members per generate call, as k·P rows; the weights themselves stay clean.
        # (When sampling, a row's random draws depend on its place in the batch, so only greedy scoring
        # gives every member exactly the same sampling noise.)
        per_call = max(1, self.cfg.micro_batch // len(problems))
        for start in range(0, len(mine), per_call):
            group = mine[start:start + per_call]
            with self.population.members([members[n] for n in group], self.cfg.sigma):
                batch = {name: value.repeat(len(group), 1) for name, value in prompts.items()}  # member-major
                per_row, truncated, count, labels = self.score(problems * len(group), batch, seed,
                                                               micro_batch=len(group) * len(problems))
            for j, n in enumerate(group):
                rows = slice(j * len(problems), (j + 1) * len(problems))
                yield n, per_row[rows], truncated[rows], count / len(group), labels[rows]

    def direction(self, t, terms):
        """Σ c·ε_seed over the (seed, c) terms for one tensor, in fp32, regenerating each ε from its seed."""
        dev = t.param.device
        total = torch.zeros(t.param.shape, dtype=torch.float32, device=dev)
        for seed, c in terms:
            total.add_(self.noise(seed, t), alpha=c)
        return total

    def state_dict(self):
        return {"master": [t.master.cpu() for t in self.tensors], "theta0": self.theta0}

    def load_state_dict(self, state):
        for t, master, t0, saved_t0 in zip(self.tensors, state["master"], self.theta0, state["theta0"]):
            t.master.copy_(master)
            t0.copy_(saved_t0)
            t.clean()

    def model_to_save(self):
        return self.model
