"""Named recipes: a paper's hyper-parameters in one flag, `train.py --recipe NAME`.

A recipe sets the defaults of the flags it names (and --algo, to its first algorithm); flags given on the
command line still win, and config.json records the values a run actually used. The values come from the
papers and their public code (docs/papers.md); they were chosen for models of 0.5B-7B parameters, not for
the shipped tiny model, whose own defaults are the flags' defaults.
"""
import textwrap
from dataclasses import dataclass


@dataclass(frozen=True)
class Recipe:
    algos: tuple  # the algorithms it is for; the first is the --algo it implies
    values: dict  # field (flag) name -> value; fields an algorithm does not have are skipped
    source: str


RECIPES = {
    "qiu2025": Recipe(
        ("es",),
        {"population": 30, "sigma": 1e-3, "alpha": 5e-4, "normalize": "zscore", "antithetic": False,
         "params": ".*", "mode": "inplace", "greedy": True, "steps": 500},
        "ES as in Qiu et al. 2025: N=30, σ=1e-3, α=5e-4, z-scored rewards, no mirrored pairs, full-rank noise "
        "on all weights (in place), greedy scoring, 500 iterations"),
    "3po": Recipe(
        ("c3po", "b3po", "m3po"),
        {"ess": 1e9, "hess_init": 1e-3, "beta1": 0.9, "beta2": 0.9999, "weight_decay": 1e-6, "lr": 1.0,
         "rescale_lr": True, "clip_radius": 1e-3, "max_grad_norm": 1.0, "prompts": 32, "group_size": 16,
         "chunks": 2, "epsilon_low": 0.2, "epsilon_high": 0.2, "beta": 0.0, "updates_per_batch": 1},
        "IVON as in the 3PO paper: λ=1e9, h0=1e-3, β1=0.9, β2=0.9999, δ=1e-6, lr 1 rescaled, clip radius 1e-3, "
        "grad clip 1, 32 prompts × G=16 (C3PO: N=2 chunks), GRPO clip 0.2, no KL"),
    "deepseekmath": Recipe(
        ("grpo",),
        {"lr": 1e-6, "beta": 0.04, "group_size": 64, "prompts": 16, "epsilon_low": 0.2, "epsilon_high": 0.2,
         "scale_rewards": "group", "loss_aggregation": "grpo", "updates_per_batch": 1},
        "GRPO as in DeepSeekMath (Shao et al. 2024): lr 1e-6, KL β=0.04, G=64, 1024 completions a step, "
        "clip 0.2, one update per batch"),
}


def describe():
    """The recipes as lines for --help."""
    return "\n".join(textwrap.fill(f"--algo {'|'.join(r.algos)}: {r.source}", 100, initial_indent=f"  {name:<13} ",
                                   subsequent_indent=" " * 16) for name, r in RECIPES.items())
