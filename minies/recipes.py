"""Named recipes: a set of train.py settings in one flag, `train.py --recipe NAME`.

Two kinds. The papers' recipes set the hyper-parameters, data regime, prompt and reward a paper ran with, each
value with where it comes from (`docs/papers.md`, "Recipes", prints them all; "minies' choice" marks a value
the source does not give). They were chosen for models of 0.5B-7B parameters. The shipped models' recipes
(`tiny`, `tiny-countdown`, `tiny-qiu`) hold what was tuned on those models (docs/tuning.md); a model names its own recipe
in its config.json (`"minies_recipe": "tiny"`), and train.py and eval.py apply it when the model is used.

Defaults, weakest first: the flags' own (the dataclasses'), the model's recipe, --recipe; flags given on the
command line win over all. A recipe sets --algo to its first algorithm; values for flags an algorithm does not
have are skipped. config.json records the values a run actually used, and train.py prints a recipe's.
"""
import contextlib
import os
import textwrap
from dataclasses import asdict, dataclass, field

from minies import UserError
from minies.cli import typed_flags
from minies.citations import DSM, MINIES, QIU, THREEPO
from minies.gguf import cached_gguf, is_gguf, packaged_file, packaged_recipe
from minies.models import load_config

ALGOS = ("es", "grpo", "b3po", "m3po", "c3po")


@dataclass(frozen=True)
class Recipe:
    summary: str  # one line for --help
    algos: tuple  # the algorithms it is for; the first is the --algo it implies
    values: dict  # flag (field) name -> (value, where the value comes from)
    per_algo: dict = field(default_factory=dict)  # algorithm -> {flag: (value, source)}, over `values`

    def settings(self, algo, task=None):
        """{flag: value} of this recipe for `algo`; for a `task` (None: the recipe's own) other than the one the
        recipe names, without its task-level values (TASK_LEVEL), which would ask one task's prompts of another."""
        values = {**self.values, **self.per_algo.get(algo, {})}
        if task is not None and values.get("task", (task,))[0] != task:
            values = {name: value for name, value in values.items() if name not in TASK_LEVEL}
        return {name: value for name, (value, _) in values.items()}


# The settings that belong to a recipe's task: with --task another, the flags' own defaults apply instead.
TASK_LEVEL = {"task", "prompt_style", "reward", "data", "train_problems", "max_new_tokens", "eval_problems"}


TUNED = "tuned on the shipped model (docs/tuning.md)"
# The shipped Qiu-format model's data file, in Qiu et al.'s format (qiu_rows(2200, seed=0), scripts/make_tiny.py).
QIU_DATA = os.path.join(os.path.dirname(__file__), "assets", "tiny-qiu", "countdown.json")

SMOLLM2 = "calibrated on SmolLM2-135M-Instruct (docs/real-models.md)"
# Where the SmolLM2 runs' times were measured (docs/results.md, section 5: each command run twice, its range).
SMOLLM2_CHECK = "bench.smollm2's ES check (docs/results.md)"
SMOLLM2_TIME = "100 steps and their evaluations took, on both cores of a 2-core CPU that other programs shared,"

# What the shipped models were tuned with (docs/tuning.md), where it differs from the papers' values that the
# flags default to: the three shipped recipes start from it.
SHIPPED_TUNED = {
    "es": {"population": (32, TUNED), "sigma": (8e-3, TUNED), "alpha": (1e-2, TUNED),
           "prompts_per_step": (256, TUNED), "antithetic": (True, f"{TUNED}: mirrored pairs halve the noise's variance"),
           "normalize": ("rank", f"{TUNED}: robust to a few members' outlying rewards"),
           "steps": (140, f"{TUNED}: where its held-out accuracy levels off (docs/results.md)")},
    "grpo": {"lr": (1e-4, TUNED), "prompts": (16, TUNED), "group_size": (8, TUNED)},
    **{algo: {"prompts": (16, TUNED), "group_size": (8, TUNED),
              "clip_radius": (0.1, f"{TUNED}: 1e-3 moves a 1M-parameter model too little")}
       for algo in ("b3po", "m3po", "c3po")},
}


def shipped(per_algo):
    """A shipped model's per-algorithm values: SHIPPED_TUNED, then its own (`per_algo`) over them."""
    return {algo: {**SHIPPED_TUNED.get(algo, {}), **per_algo.get(algo, {})} for algo in ALGOS}


RECIPES = {
    "qiu2025": Recipe(
        "ES as in Qiu et al. 2025 on Countdown: their data regime (a fixed set of 200 problems, scored every "
        "iteration), raw prompt, reward and hyper-parameters",
        ("es",),
        {"task": ("countdown", f"{QIU} (the paper's Countdown experiment)"),
         "prompt_style": ("qiu", f"{QIU}data/countdown.json: `context`, fed without a chat template"),
         "reward": ("qiu", f"{QIU}countdown_task.py: reward_function, answer + 0.1·format"),
         "train_problems": (200, "README: --data_sample 200; the first 200 rows of countdown.json"),
         "prompts_per_step": (200, "every member is scored on all 200 training problems"),
         "max_new_tokens": (1024, f"{QIU}es_fine-tuning_countdown.py: max_new_tokens"),
         "population": (30, f"{QIU}es_fine-tuning_countdown.py: POPULATION_SIZE"),
         "sigma": (1e-3, f"{QIU}es_fine-tuning_countdown.py: SIGMA"),
         "alpha": (5e-4, f"{QIU}es_fine-tuning_countdown.py: ALPHA, with 1/N in the update"),
         "normalize": ("zscore", f"{QIU}es_fine-tuning_countdown.py: (r − mean) / (std + 1e-8)"),
         "antithetic": (False, f"{QIU}es_fine-tuning_countdown.py: every member's seed drawn on its own"),
         "params": (".*", f"{QIU}es_fine-tuning_countdown.py: every named parameter is perturbed"),
         "mode": ("inplace", f"{QIU}es_fine-tuning_countdown.py: the weights are perturbed in place"),
         "greedy": (True, f"{QIU}es_fine-tuning_countdown.py: do_sample = False"),
         "steps": (500, f"{QIU}es_fine-tuning_countdown.py: NUM_ITERATIONS")}),
    "3po": Recipe(
        "C3PO (or B3PO, M3PO) as in the 3PO paper: IVON λ=1e9, h0=1e-3, lr 1 rescaled, clip radius 1e-3, "
        "32 prompts × G=16 (C3PO: 2 chunks), GRPO clip 0.2, no KL; on GSM8K",
        ("c3po", "b3po", "m3po"),
        {"ess": (1e9, THREEPO), "hess_init": (1e-3, THREEPO), "beta1": (0.9, THREEPO), "beta2": (0.9999, THREEPO),
         "weight_decay": (1e-6, THREEPO), "lr": (1.0, THREEPO), "rescale_lr": (True, THREEPO),
         "clip_radius": (1e-3, THREEPO), "max_grad_norm": (1.0, THREEPO), "prompts": (32, THREEPO),
         "group_size": (16, f"{THREEPO}: G = 8 to 16"), "chunks": (2, f"{THREEPO}: the headline run's N = 2"),
         "epsilon_low": (0.2, THREEPO), "epsilon_high": (0.2, THREEPO), "beta": (0.0, f"{THREEPO}: no KL"),
         "task": ("gsm8k", f"{MINIES}: the paper trains 7B models on competition math"),
         "prompt_style": ("instruct", MINIES),
         "max_new_tokens": (512, f"{MINIES}: GSM8K's solutions fit well within it"),
         "temperature": (1.0, f"{MINIES}: sampling from the policy itself"),
         "steps": (234, f"{MINIES}: one pass over GSM8K's 7,473 training problems, 32 a step")}),
    "deepseekmath": Recipe(
        "GRPO as in DeepSeekMath (Shao et al. 2024): lr 1e-6, KL β=0.04, G=64, 1,024 completions a step, one "
        "update per batch, up to 1,024 tokens; on GSM8K",
        ("grpo",),
        {"lr": (1e-6, f"{DSM}, §4.2"), "beta": (0.04, f"{DSM}, §4.2: the KL coefficient"),
         "group_size": (64, f"{DSM}, §4.2: 64 outputs per question"),
         "prompts": (16, f"{DSM}, §4.2: a training batch of 1,024 outputs, 64 per question"),
         "updates_per_batch": (1, f"{DSM}, §4.2: a single update after each exploration stage"),
         "scale_rewards": ("group", f"{DSM}, §4.1.2: rewards normalized by the group's mean and std"),
         "loss_aggregation": ("grpo", f"{DSM}, §4.1.1, Eq. 3: the mean over tokens, then over outputs"),
         "max_new_tokens": (1024, f"{DSM}, §4.2: a max length of 1,024"),
         "epsilon_low": (0.2, f"{MINIES}: PPO's clip range; the paper does not give ε"),
         "epsilon_high": (0.2, f"{MINIES}: PPO's clip range; the paper does not give ε"),
         "task": ("gsm8k", f"{DSM}, §4.2 trains on GSM8K and MATH questions; minies takes GSM8K's"),
         "prompt_style": ("instruct", MINIES),
         "temperature": (1.0, f"{MINIES}: the paper does not give it"),
         "steps": (467, f"{MINIES}: one pass over GSM8K's 7,473 training problems, 16 a step")}),
    "tiny": Recipe(
        "the shipped model's own (minies/assets/tiny): terse prompts; ES in place on its embeddings and first block",
        ALGOS,
        {"prompt_style": ("terse", "the shipped model was trained on terse questions (docs/tiny-model.md)")},
        shipped({"es": {"params": (r"embed_tokens|layers\.0\.", "nearly all of its reward gradient lies there "
                                   "(docs/tiny-model.md)"),
                        "mode": ("inplace", "the mode its settings were tuned and its results measured in")}})),
    "tiny-countdown": Recipe(
        "the shipped Countdown model's own (minies/assets/tiny-countdown): terse Countdown; ES in place on all "
        "weights, α 0.03 on 64 prompts for 50 steps",
        ALGOS,
        {"task": ("countdown", "the task it was trained on"),
         "prompt_style": ("terse", "the shipped model was trained on terse questions (docs/tiny-model.md)")},
        shipped({"es": {"params": (".*", TUNED), "mode": ("inplace", TUNED), "alpha": (0.03, TUNED),
                        "prompts_per_step": (64, f"{TUNED}: a Countdown prompt costs ~4x an arithmetic one"),
                        "steps": (50, f"{TUNED}: where ES peaks")},
                 "m3po": {"steps": (150, f"{TUNED}: to learn within ~10 minutes on 2 cores")},
                 "c3po": {"steps": (200, f"{TUNED}: to learn within ~10 minutes on 2 cores")}})),
    "tiny-qiu": Recipe(
        "the shipped Qiu-format model's own (minies/assets/tiny-qiu): Qiu et al.'s data regime, raw prompt, "
        "envelope and reward, with ES's settings tuned on it",
        ALGOS,
        {"task": ("countdown", f"{QIU} (the paper's Countdown experiment)"),
         "prompt_style": ("qiu", f"{QIU}data/countdown.json: `context`, which the model was trained on"),
         "reward": ("qiu", f"{QIU}countdown_task.py: reward_function, answer + 0.1·format"),
         "data": (QIU_DATA, "2,200 rows in Qiu et al.'s format (minies.tasks.qiu_rows, seed 0), beside the model"),
         "train_problems": (200, "README: --data_sample 200; the first 200 rows, the rest held out"),
         "max_new_tokens": (72, f"{MINIES}: the model's trace and answer take at most ~70 tokens"),
         "eval_problems": (500, f"{MINIES}: the first 500 of the 2,000 held-out rows, for speed on a CPU "
                                "(eval.py reads all 2,000)")},
        shipped({"es": {"params": (".*", TUNED), "mode": ("inplace", TUNED), "alpha": (0.01, TUNED),
                        "prompts_per_step": (200, "Qiu et al.: every member is scored on all 200 training problems"),
                        "steps": (12, f"{TUNED}: where held-out accuracy stops rising"),
                        "eval_every": (4, f"{MINIES}: a step scores 6,400 completions; an evaluation every ~3 "
                                          "minutes")},
                 "c3po": {"steps": (200, f"{MINIES}: to finish within ~12 minutes on 2 cores")}})),
    "smollm2": Recipe(
        "SmolLM2-135M-Instruct's own (--model smollm2-135m): sums of two numbers in 0..99 as equations it "
        "completes, the papers' hyper-parameters where a CPU hour allows them",
        ALGOS,
        {"task": ("arithmetic", SMOLLM2),
         "prompt_style": ("equation", f"{SMOLLM2}: 0% of its instruct answers are in the answer tag; as equations "
                                      "it starts at pass@1 13%, pass@8 38%"),
         "eval_problems": (200, f"{MINIES}: 200 held-out problems, not all 500, to keep a CPU run's 10 evaluations "
                                "short"),
         "final_samples": (8, f"{MINIES}: pass@1 and pass@8 before and after, as calibrated"),
         "eval_every": (10, f"{MINIES}: a curve of 10 points")},
        {"es": {"mode": ("lowrank", f"{SMOLLM2_CHECK}: at equal tokens rank 1 learned as much as in place "
                                    "(pass@1 11.0 against 11.2%) in 26 s a step against 90 s"),
                "sigma": (0.003, f"{SMOLLM2_CHECK}: of σ × α around Qiu et al.'s, the only one with no tied step "
                                 "and the highest pass@1 (12.2% against 10.8–11.2%)"),
                "alpha": (0.002, f"{SMOLLM2_CHECK}: as σ"),
                "prompts_per_step": (16, f"{MINIES}: 30 members × 16 prompts a step (lowrank)"),
                "steps": (100, f"{MINIES}: {SMOLLM2_TIME} 49–58 min")},
         "grpo": {"prompts": (8, f"{MINIES}: 8 prompts × G=8 a step"),
                  "group_size": (8, "3PO paper: G = 8 to 16"),
                  "lr": (1e-5, f"{MINIES}: Adam moves each weight ~1e-5 a step; 1e-6 would leave it near the start in 100 steps"),
                  "steps": (100, f"{MINIES}: {SMOLLM2_TIME} 22–25 min")},
         **{algo: {"prompts": (8, f"{MINIES}: 8 prompts × G=8 a step"),
                   "group_size": (8, "3PO paper: G = 8 to 16"),
                   "clip_radius": (1e-2, f"{MINIES}: each weight moves at most lr·h0·1e-2 = 1e-5 a step, "
                                        "as GRPO's"),
                   "steps": (100, f"{MINIES}: {SMOLLM2_TIME} 35–36 min with C3PO")}
            for algo in ("b3po", "m3po", "c3po")}}),
}


def prompt_style_for(style, config, task=None):
    """`style` itself, or for "auto" the prompt style of the recipe the model names for itself (`minies_recipe` in
    its config.json: RECIPES above) when it is for `task` (None: any), else "instruct", the style of any
    instruction-tuned model."""
    if style != "auto":
        return style
    recipe = RECIPES.get(getattr(config, "minies_recipe", None))
    settings = recipe.settings(None, task) if recipe else {}
    return settings.get("prompt_style", "instruct")


def own_recipe(model):
    """The name of the recipe a local model directory names for itself (`minies_recipe` in its config.json), or a
    packaged model's (minies/gguf.py, by its name or its file's path), or None. Hub ids get none here: parsing
    flags (and --help) never waits on the network, and a model whose config cannot be read gets none either, for
    loading it later to say why. A GGUF file is read through its converted directory only when that exists already:
    parsing flags never converts one."""
    if packaged_recipe(model) is not None:
        return packaged_recipe(model)
    model = packaged_file(model)  # a packaged model's name stands for its GGUF file
    path = cached_gguf(model) if is_gguf(model) else os.path.expanduser(model)
    if path is None or not os.path.isdir(path):
        return None
    try:
        name = getattr(load_config(path), "minies_recipe", None)
    except UserError:
        return None
    if name is not None and (not isinstance(name, str) or name not in RECIPES):
        raise UserError(f"{model}: its config.json names minies_recipe {name!r}, which is not one of "
                        f"{', '.join(RECIPES)}; fix or remove that entry")
    return name


def recipe_defaults(names, algo, fields, task=None):
    """The defaults that the recipes `names` (weakest first; None skipped) set for `algo` (None: the values for
    every algorithm only) and `task` (Recipe.settings), restricted to the flags in `fields`."""
    out = {}
    for name in filter(None, names):
        out.update({k: v for k, v in RECIPES[name].settings(algo, task).items() if k in fields})
    return out


def recipe_origins(names, algo, fields, task=None):
    """{flag: "recipe NAME"} for the flags in `fields` whose default a recipe of `names` sets (the strongest)."""
    return {k: f"recipe {name}" for name in filter(None, names) for k in RECIPES[name].settings(algo, task)
            if k in fields}


def set_by_recipe(argv, recipes, algo, cfg, *more):
    """{setting: "recipe NAME"} for each setting of `cfg` (and the configs `more`) whose value a recipe gave, where
    the command line gave none."""
    typed, settings = typed_flags(argv), {key: value for c in (cfg, *more) for key, value in asdict(c).items()}
    return {key: origin for key, origin in recipe_origins(recipes, algo, settings, cfg.task).items()
            if key not in typed}


@contextlib.contextmanager
def naming_recipes(cfg, by_recipe):
    """A UserError raised in the block, with "(from recipe NAME)" after each flag it names that a recipe set:
    the user typed no such flag, and the recipe is what to change."""
    try:
        yield
    except UserError as e:
        message = str(e)
        for key, origin in by_recipe.items():
            given = f"--{key.replace('_', '-')} {getattr(cfg, key, None)}"
            message = message.replace(given, f"{given} (from {origin})", 1)
        raise UserError(message) from None


def describe():
    """The recipes as lines for --help."""
    return "\n".join(textwrap.fill(f"--algo {'|'.join(r.algos)}: {r.summary}", 100, initial_indent=f"  {name:<15} ",
                                   subsequent_indent=" " * 18) for name, r in RECIPES.items())


def defaults_table(configs):
    """The flags whose defaults come from a paper, as Markdown table rows (docs/papers.md holds them): `configs`
    maps a label (the algorithms) to their config dataclass."""
    import dataclasses

    return "\n".join(f"| {label} | `--{f.name.replace('_', '-')}` | {f.default} | {f.metadata['source']} |"
                     for label, config in configs.items() for f in dataclasses.fields(config) if f.metadata.get("source"))


def table(name):
    """A recipe's values and their sources as Markdown table rows (docs/papers.md holds them all)."""
    recipe = RECIPES[name]
    rows = [("", key, value, source) for key, (value, source) in recipe.values.items()]
    rows += [(algo, key, value, source) for algo, values in recipe.per_algo.items()
             for key, (value, source) in values.items()]
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # paths print relative to the checkout
    rows = [(algo, key, os.path.relpath(value, repo) if isinstance(value, str) and os.path.isabs(value) else value,
             source) for algo, key, value, source in rows]
    return "\n".join(f"| {algo or 'all'} | `--{key.replace('_', '-')}` | {value} | {source} |"
                     for algo, key, value, source in rows)
