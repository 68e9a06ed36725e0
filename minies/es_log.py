"""The log row of an ES step: what the population's rollouts show beyond the rewards the update uses.

ES.step calls step_log once, after its update, on every rank, with what the step measured and counted; the log only
reads it, and nothing here feeds back into the algorithm. The row holds the members' rewards, how far their spread
stands above the noise of measuring one member (fitness_snr), how differently they answer (js_diversity,
minies/analysis.py), the share of truncated completions, with in-place 8-bit scoring the share of int8 weights the
perturbations clamp, the update's norm, the drift ‖θ − θ0‖, and the step's speed.
"""
import time

import numpy as np
import torch

from minies.runtime import distributed
from minies.analysis import answer_outcome, js_diversity


def step_log(rollouts, rewards, z, update_norm, drift, int8_clamps, started, scored):
    """`rollouts`: {n: ScoredRollouts} of this rank's members; `rewards`: every member's mean reward R_n; `z`:
    their normalized values; `update_norm`: ‖Δθ‖; `drift`: ‖θ − θ0‖; `int8_clamps`: with int8 weights scored
    in place, (the int8 elements this rank's perturbed writes clamped to ±127, the int8 elements each member
    writes), else None; `started`, `scored`: the time.time() at which the step started and this rank's
    scoring ended. Sums over ranks (an all-reduce and a gather), so every rank calls it."""
    errors = torch.zeros(len(rewards), dtype=torch.float64)  # standard error of each member's mean reward
    counts = torch.zeros(3, dtype=torch.float64)  # over this rank's members: tokens, truncated, clamped int8
    for n, r in rollouts.items():
        per_prompt = r.rewards
        errors[n] = per_prompt.std() / np.sqrt(len(per_prompt))
        counts += torch.tensor([r.lengths.sum(), r.truncated.sum(), 0.0], dtype=torch.float64)
    counts[2] = int8_clamps[0] if int8_clamps else 0
    for x in (errors, counts):
        distributed.all_reduce_sum(x)
    outcomes = {n: [answer_outcome(s) for s in r.scores] for n, r in rollouts.items()}
    outcomes = {n: o for part in distributed.all_gather_objects(outcomes) for n, o in part.items()}
    tokens, truncated, clamped = counts.tolist()
    completions = sum(len(o) for o in outcomes.values())
    row = {
        "reward_mean": float(rewards.mean()), "reward_max": float(rewards.max()),
        "reward_min": float(rewards.min()), "reward_std": float(rewards.std()),
        # Spread of the members' fitness over the noise of measuring one member's fitness:
        # below ~1 the ranking is mostly noise (use more prompts or a larger σ).
        "fitness_snr": float(rewards.std() / max(errors.numpy().mean(), 1e-12)),
        "all_tied": bool(not z.any()),
        # How differently the members answer, seen through the verifier (0: all alike, 1: all differ).
        "js_diversity": js_diversity([[[label] for label in outcomes[n]] for n in sorted(outcomes)])
        if len(outcomes) > 1 else 0.0,
        "truncated_rate": truncated / completions,  # cut off at max_new_tokens: a reasoning trace cut short
        **({"int8_clamped": clamped / (len(rewards) * int8_clamps[1])} if int8_clamps else {}),
        "update_norm": update_norm, "drift": drift,
        "seconds_per_member": (scored - started) / max(len(rollouts), 1),  # on this rank
    }
    row["tokens_per_second"] = tokens / max(time.time() - started, 1e-9)  # all ranks together
    row["tokens"] = int(tokens)
    return row

