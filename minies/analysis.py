"""Measurements behind the claims of the founding papers (docs/papers.md), shared by bench/ and tests.

Paper A says ES keeps a *diverse* population and so a higher pass@k than GRPO, changes every weight but
owes its gain to a few large updates, and paper B says 3PO *rescues* prompts on which GRPO's whole group
fails. The papers publish no code, so the exact definitions are pinned down here, one per function.
"""
import math
import re
from collections import Counter

import numpy as np
import torch

from minies.metrics import average_ranks, mean_pass_at_k
from minies.runtime.spilled import TensorsInMemory

LAYER_TYPES = ("embedding", "attention", "mlp", "norm", "other")
DRIFT_CHUNK = 2**18  # elements per chunk of squared_distance(): 1 MB of fp32, cache-sized
# First match wins. Norms come before attention because "post_attention_layernorm" names a norm, and
# Qwen3's "self_attn.q_norm" is one too; the output head counts as an (output) embedding.
_LAYER_PATTERNS = (("embedding", re.compile(r"embed|lm_head|\bwte\b|\bwpe\b")),
                   ("norm", re.compile(r"norm|\bln_")),
                   ("attention", re.compile(r"attn|attention")),
                   ("mlp", re.compile(r"mlp|feed_forward")))


def answer_outcome(score):
    """What the verifier saw in one completion, from its task.score(...), as a hashable label: "correct";
    "malformed" (the task could read no answer); or, for a wrong answer, the answer the task read
    (Score.answer), so that two wrong completions count as the same outcome exactly when their answers read
    the same. Every task is judged by its own verifier, reading where it reads."""
    if score.correct:
        return "correct"
    return "malformed" if score.malformed else score.answer


def _entropy_bits(counts):
    total = sum(counts)
    return -sum(c / total * math.log2(c / total) for c in counts if c)


def js_diversity(outcomes):
    """Verifier-projected generalized Jensen–Shannon diversity of a population, in [0, 1].

    outcomes[n][j] is the list of outcome labels (answer_outcome) of member n on prompt j: one per
    sample, a single one under greedy decoding. For prompt j, member n's distribution p_n over labels
    is the empirical one (label counts / number of samples), and with equal member weights

        JS_j = H(mean_n p_n) − mean_n H(p_n)        (Shannon entropies in bits)

    which is 0 when every member has the same distribution and at most log2(N), reached when the
    members' supports are disjoint. Returns mean_j JS_j / log2(N). Members may have different numbers
    of samples; every member must cover the same prompts. Needs N >= 2 (one member has no diversity
    to normalize).
    """
    members = len(outcomes)
    if members < 2:
        raise ValueError(f"js_diversity needs at least 2 members, got {members}")
    prompts = len(outcomes[0])
    if prompts == 0 or any(len(m) != prompts for m in outcomes):
        raise ValueError("every member needs outcomes on the same, non-empty list of prompts")
    total = 0.0
    if all(len(m[j]) == 1 for m in outcomes for j in range(prompts)):  # greedy: each p_n is one label, H(p_n) = 0
        for j in range(prompts):
            total += _entropy_bits(Counter(m[j][0] for m in outcomes).values())
        return max(0.0, total / prompts / math.log2(members))
    for j in range(prompts):
        distributions = [Counter(m[j]) for m in outcomes]
        if any(not d for d in distributions):
            raise ValueError(f"prompt {j}: every member needs at least one outcome")
        mixture = Counter()
        for d in distributions:
            size = sum(d.values())
            for label, count in d.items():
                mixture[label] += count / size / members
        within = sum(_entropy_bits(d.values()) for d in distributions) / members
        total += _entropy_bits(mixture.values()) - within
    return max(0.0, total / prompts / math.log2(members))  # max: rounding can leave -1e-17


def pass_at_k_curve(correct_counts, n, ks=None):
    """{k: pass@k} from each problem's number of correct samples out of n, with the unbiased
    estimator averaged over problems (minies.metrics). ks defaults to the powers of two up to n;
    values of k above n are left out (pass@k needs k samples)."""
    if ks is None:
        ks = [2 ** i for i in range(n.bit_length())]
    return {k: mean_pass_at_k(correct_counts, n, k) for k in ks if 1 <= k <= n}


def layer_type(name):
    """"embedding", "attention", "mlp", "norm" or "other", from a Qwen2/Llama-style parameter name."""
    for kind, pattern in _LAYER_PATTERNS:
        if pattern.search(name):
            return kind
    return "other"


def _check_same_names(theta0, theta):
    if set(theta0) != set(theta):
        raise ValueError(f"the two weight dicts differ in names: {sorted(set(theta0) ^ set(theta))[:5]}")


def drift(theta0, theta):
    """L2 norm of θ − θ0, in total and per layer type: {"total": ..., "embedding": ..., ...}.

    theta0 and theta map parameter names to tensors of equal shapes. Each tensor must appear once: pass
    dict(model.named_parameters()), not a state_dict, in which tied weights (embedding and output head)
    appear under two names and would count twice. The differences are taken in float64, as the weights may
    be of any dtype.
    """
    _check_same_names(theta0, theta)
    squares = {kind: squared_distance(TensorsInMemory(theta0[n] for n in theta0 if layer_type(n) == kind),
                                      [theta[n] for n in theta0 if layer_type(n) == kind], torch.float64)
               for kind in LAYER_TYPES}
    return {"total": math.sqrt(sum(squares.values())), **{k: math.sqrt(v) for k, v in squares.items()}}


@torch.no_grad()
def squared_distance(theta0, theta, dtype=torch.float32):
    """‖θ − θ0‖² over the paired tensors of `theta0` and the list `theta`, as a float: drift's, and that of
    ES's log (minies/es.py). Each difference is taken where θ is, in `dtype`, a chunk of DRIFT_CHUNK elements
    at a time, written into one reused buffer and squared there: a whole tensor's difference would be a
    temporary as large as the tensor (docs/speed.md). The chunks' sums are added in float64. θ0's chunks
    stream to θ's device (asynchronously from pinned memory), and the caller waits once, for the total.
    The dtypes differ by use: ES's log runs every step on its fp32 masters, so in float32 where they live;
    drift runs once, on weights of any dtype, so in float64. `theta0` gives its tensors as chunks: a
    TensorsInMemory, or a SpilledTensors (ES's θ0 on a CPU) read back from its file a chunk at a time
    (minies/runtime/spilled.py)."""
    squares, buffer = [], None
    for i, t in enumerate(theta):
        if buffer is None or buffer.device != t.device:
            buffer = torch.empty(DRIFT_CHUNK, dtype=dtype, device=t.device)
        for chunk, chunk0 in zip(t.reshape(-1).split(DRIFT_CHUNK), theta0.chunks(i, DRIFT_CHUNK)):
            difference = torch.sub(chunk.to(dtype), chunk0.to(t.device, dtype, non_blocking=True),
                                   out=buffer[:chunk.numel()])
            squares.append(difference.mul_(difference).sum())
    return float(torch.stack(squares).double().sum()) if squares else 0.0


def sparsified(theta0, theta, keep_fraction):
    """θ0 + (θ − θ0) with only the globally largest-magnitude `keep_fraction` of the update's entries kept.

    Over all tensors together, the round(keep_fraction · entries) entries with the largest |θ − θ0|
    take their value from θ and every other entry keeps θ0's (taking the value, rather than adding the
    masked difference, makes keep_fraction 1 return θ exactly). Ties in |θ − θ0| go to the entry that
    comes first with tensors in sorted name order and entries in row-major order, so the result does
    not depend on the dicts' order. Returns a new name -> tensor dict in θ's dtypes.
    """
    if not 0.0 <= keep_fraction <= 1.0:
        raise ValueError(f"keep_fraction {keep_fraction}: must be in [0, 1]")
    _check_same_names(theta0, theta)
    names = sorted(theta0)
    magnitude = torch.cat([(theta[n].double() - theta0[n].double()).abs().flatten() for n in names])
    keep = round(keep_fraction * magnitude.numel())
    chosen = torch.zeros(magnitude.numel(), dtype=torch.bool, device=magnitude.device)
    chosen[torch.sort(magnitude, descending=True, stable=True).indices[:keep]] = True
    out, offset = {}, 0
    for n in names:
        mask = chosen[offset:offset + theta0[n].numel()].view(theta0[n].shape)
        out[n] = torch.where(mask, theta[n], theta0[n].to(theta[n].dtype))
        offset += theta0[n].numel()
    return out


def rescue_counts(solved_method, solved_baseline):
    """Paired zero-advantage rescue (paper B): (rescued, lost) over prompts seen by both runs.

    solved_x[j] is 1 (or True) when run x's group for prompt j had at least one correct completion, 0
    when the whole group failed: then no completion has a positive advantage for being right (only the
    format bonus can still separate wrong from malformed ones), so the prompt teaches nothing about
    correctness. rescued counts prompts the method solved where the baseline's whole group failed; lost
    the reverse.
    The two lists must pair up: the same prompts in the same order (same --seed and prompts per step).
    """
    if len(solved_method) != len(solved_baseline):
        raise ValueError(f"cannot pair {len(solved_method)} prompts with {len(solved_baseline)}")
    rescued = sum(1 for m, b in zip(solved_method, solved_baseline) if m and not b)
    lost = sum(1 for m, b in zip(solved_method, solved_baseline) if b and not m)
    return rescued, lost


def rank_correlation(x, y):
    """Spearman's rank correlation of two equally long sequences: the Pearson correlation of their
    average ranks (ties share their mean rank), in [−1, 1]; None when either sequence is constant or
    has fewer than 2 values, where no correlation is defined."""
    if len(x) != len(y):
        raise ValueError(f"cannot correlate {len(x)} values with {len(y)}")
    if len(x) < 2:
        return None
    rx, ry = average_ranks(x), average_ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])
