"""Reproduce the founding papers' findings on the shipped model (docs/papers.md).

    python -m bench.reproduce --quick            # a smoke run of every stage: under a minute on one core
    python -m bench.reproduce --out results      # the full run: 20 min on 2 cores (plan and estimate printed first)
    python -m bench.reproduce --task countdown --out results/countdown    # the same on Countdown: 21 min
    python -m bench.reproduce --quick --task examples/add_a_digit.py      # on a task of your own (docs/tasks.md)

On Countdown, a problem may have several correct expressions, so the final evaluations also count the
distinct correct ones that the samples find per solved problem (Score.solution, minies/evaluate.py), and
the report sets them against how many each problem has.

ES, GRPO, GRPO-hot (GRPO sampling its training rollouts at --hot-temperature, 1.2) and C3PO train for
seeds 0..S-1 on an equal budget of generated tokens, and so do GRPO→ES and ES→GRPO (half the budget in
each stage, the second starting from the first's final checkpoint). Then every final model and the
start model are evaluated on held-out problems with n samples each at temperature 1, GRPO-hot's too
(pass@k curves), the ES and GRPO updates are sparsified (how much of the gain do the largest 1-50% of
the updated entries keep?), drift is measured per layer type, and entropy, malformed rate, reward, ES
population diversity and the zero-advantage rescue of C3PO against GRPO and against GRPO-hot (and of
GRPO-hot against GRPO: does sampling hotter do what C3PO does?), in total and quarter by quarter of
training, are read from the runs' logs. The diversity claim (a more diverse ES population gives a higher
pass@k) is tested by two more ES runs per seed at a smaller and a larger σ (--diversity-sigmas): σ sets
how far the members spread, so across all ES runs the rank correlation between the population's mean
JS diversity over training and the final pass@k says whether diversity and coverage move together. Writes
<out>/results.json, <out>/results.md and PNG plots (bench/report.py); the runs themselves stay in
<out>/runs.

Equal token budget. Every run generates --tokens training tokens (bench/budget.py: in two pieces, the second
sized by the tokens per step the first measured; a default ES step is 32 members × prompts, a GRPO step 16
prompts × 8). Every run ends within about half a step of the budget; results.json records each run's exact
count.

ES scores 32 prompts per step here instead of its tuned 256 (--es-prompts): one step of 32 members ×
256 prompts generates ~45k tokens, as much as 64 GRPO steps, so at a budget that fits in an hour ES
would take 3 or 4 steps. With 32 prompts it takes eight times as many for the same tokens.
"""
import argparse
import dataclasses
import json
import os
import time
from collections import namedtuple
from dataclasses import dataclass

import numpy as np
import torch

import train
from bench import report
from bench.budget import read_log, train_to_budget
from minies import UserError
from minies.cli import ArgumentParser, run_script
from minies.runtime import checkpoint, set_up_process
from minies.analysis import drift, rank_correlation, rescue_counts, sparsified
from minies.config import add_arguments, from_args, option, option_of
from minies.evaluate import evaluate
from minies.models import default_device, default_model, load_config, load_model, load_tokenizer
from minies.recipes import prompt_style_for
from minies.tasks import TaskOptions, get_task, is_task_file, task_name

SEQUENTIAL = (("grpo", "es"), ("es", "grpo"))
KEEP_FRACTIONS = (0.0, 0.01, 0.05, 0.10, 0.50, 1.0)  # 0 is the start model and 1 the trained one, exactly
HELDOUT_SAMPLES = 4  # samples per problem of train.py's evaluations during training (entropy, malformed series)
# (method, baseline) pairs of the zero-advantage rescue; the same seed gives both the same prompts.
RESCUE_PAIRS = (("c3po", "grpo"), ("c3po", "grpo-hot"), ("grpo-hot", "grpo"))
BUDGET_FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)  # where the summary reads the held-out malformed series

# Planning constants per task: seconds per unit of work on the task's shipped model with one thread on a
# loaded 2-core CPU (a GRPO, GRPO-hot or C3PO step; one ES member's fixed cost and its cost per prompt; one
# evaluation sample). They only size the plan printed first and the first piece of each run (the second
# piece is sized from the measured tokens per step). A C3PO step is planned at the slow end of its range.
Costs = namedtuple("Costs", "grpo c3po es_member es_prompt eval_sample")
PLAN_SECONDS = {"arithmetic": Costs(grpo=0.35, c3po=2.0, es_member=0.055, es_prompt=0.00058, eval_sample=0.002),
                "countdown": Costs(grpo=1.3, c3po=3.0, es_member=0.08, es_prompt=0.0025, eval_sample=0.003)}


@dataclass
class ReproduceConfig:
    task: str = option("arithmetic", "the task, of generated problems: arithmetic, countdown (the claims are the "
                       "same on both, and countdown adds the coverage of the solution space), or a task file "
                       "path/to/task.py (docs/tasks.md; planned at arithmetic's costs)", type=task_name)
    model: str = option(None, "the start model: hub id or local directory (default: the shipped model for --task)")
    out: str = option("results", "output directory (results.json, results.md, plots, runs/)")
    prompt_style: str = option_of(TaskOptions, "prompt_style")
    quick: bool = option(False, "a smoke run: 1 seed, a tiny budget, few problems (changes the defaults below)")
    seeds: int = option(3, "seeds 0..S-1 for every method", check="positive")
    tokens: int = option(160_000, "generated training tokens per run, the same for every method", check="positive")
    es_population: int = option(32, "ES members per step", check="positive")
    es_prompts: int = option(32, "ES prompts per step (its tuned default is 256; see the module docstring)",
                             check="positive")
    hot_temperature: float = option(1.2, "GRPO-hot's sampling temperature for its training rollouts (the "
                                    "baseline that explores by sampling hotter; its held-out evaluations stay "
                                    "at temperature 1, like every run's)", check="positive")
    diversity_sigmas: str = option("0.004,0.016", "comma-separated σ of extra ES runs (\"es-sigma<σ>\") for "
                                   "the diversity-pass@k link, beside ES's default σ; '' for none")
    problems: int = option(300, "held-out problems for the final evaluations", check="positive")
    samples: int = option(32, "samples per problem for the final pass@k curves", check="positive")
    sparsity_samples: int = option(8, "samples per problem for pass@1 of the sparsified models", check="positive")
    eval_problems: int = option(100, "held-out problems for the evaluations during training (entropy series)",
                                check="positive")
    evals_per_run: int = option(8, "evaluations during each training stage", check="positive")


# Countdown's completions are ~10 tokens against arithmetic's ~4, and its model is 4× larger: a smaller
# budget, fewer held-out problems and evaluations keep the full run within an hour on 2 cores.
TASK_DEFAULTS = {"countdown": {"tokens": 100_000, "problems": 200, "eval_problems": 100, "evals_per_run": 4}}
QUICK = {"seeds": 1, "tokens": 6000, "es_population": 8, "es_prompts": 16, "diversity_sigmas": "0.016",
         "problems": 20, "samples": 8, "sparsity_samples": 4, "eval_problems": 10, "evals_per_run": 2}


def parse_args(argv):
    # Two passes, as in train.py: --quick changes the other flags' defaults (explicit flags still win).
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--quick", action="store_true")
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    pre.add_argument("--task", default=ReproduceConfig.task)
    add_arguments(parser, ReproduceConfig, "reproduce")
    known = pre.parse_known_args(argv)[0]
    parser.set_defaults(**TASK_DEFAULTS.get(known.task, {}))
    if known.quick:
        parser.set_defaults(**QUICK)
    cfg = from_args(ReproduceConfig, parser.parse_args(argv))  # the ranges are checked while parsing
    if cfg.task not in PLAN_SECONDS and not is_task_file(cfg.task):
        raise UserError(f"--task {cfg.task}: bench.reproduce runs on generated problems: arithmetic, countdown or a "
                        "task file path/to/task.py")
    cfg.model = cfg.model or default_model(cfg.task)
    es_sigmas(cfg)  # a malformed --diversity-sigmas fails here, before anything runs
    return cfg


def es_sigmas(cfg):
    """{method: σ} of the ES-only methods: "es" at ES's default σ and "es-sigma<σ>" for --diversity-sigmas."""
    try:
        sigmas = [float(s) for s in cfg.diversity_sigmas.split(",") if s.strip()]
    except ValueError:
        sigmas = [0.0]
    if not all(s > 0 for s in sigmas):
        raise UserError(f"--diversity-sigmas {cfg.diversity_sigmas!r}: give positive numbers separated by commas")
    default = train.parse_args(["--algo", "es", "--task", cfg.task, "--model", cfg.model])[1].sigma  # the model's own
    return {"es": default, **{f"es-sigma{s:g}": s for s in sigmas}}


def method_flags(cfg):
    """{method: train.py's flags for a stage of it}: its --algo, and ES's population and prompts per
    step, GRPO-hot's temperature or a diversity run's σ; everything else is train.py's default."""
    es = ["--algo", "es", "--population", cfg.es_population, "--prompts-per-step", cfg.es_prompts]
    flags = {"es": es, "grpo": ["--algo", "grpo"], "grpo-hot": ["--algo", "grpo", "--temperature", cfg.hot_temperature],
             "c3po": ["--algo", "c3po"]}
    flags.update({method: es + ["--sigma", sigma] for method, sigma in es_sigmas(cfg).items() if method != "es"})
    return {method: f + ["--task", cfg.task] for method, f in flags.items()}


def is_es(cfg, method):
    return method_flags(cfg)[method][1] == "es"


def rollouts_per_step(cfg, method):
    if is_es(cfg, method):
        return cfg.es_population * cfg.es_prompts
    grpo = train.parse_args(["--algo", "grpo", "--task", cfg.task, "--model", cfg.model])[1]  # the model's own
    return grpo.prompts * grpo.group_size  # for GRPO, GRPO-hot and C3PO alike


def step_seconds(cfg, method):
    costs = PLAN_SECONDS.get(cfg.task, PLAN_SECONDS["arithmetic"])
    if is_es(cfg, method):
        return cfg.es_population * (costs.es_member + costs.es_prompt * cfg.es_prompts)
    return costs.c3po if method == "c3po" else costs.grpo


# label: "es", ..., "grpo-es"; run: label and seed; name: the stage's run directory under runs/;
# after: the stage whose final checkpoint this one starts from (None: the start model).
Stage = namedtuple("Stage", "label run name method seed tokens steps after")


def make_plan(cfg, mean_length):
    """The training stages, in order, and the estimated seconds of the whole reproduction. A stage's
    steps are estimated from its rollouts per step and the start model's mean completion length."""
    stages = []

    def add(label, seed, name, method, tokens, after=None):
        steps = max(1, round(tokens / (rollouts_per_step(cfg, method) * mean_length)))
        stages.append(Stage(label, f"{label}-seed{seed}", name, method, seed, tokens, steps, after))

    for seed in range(cfg.seeds):
        for method in method_flags(cfg):
            add(method, seed, f"{method}-seed{seed}", method, cfg.tokens)
        for first, second in SEQUENTIAL:
            run = f"{first}-{second}-seed{seed}"
            add(f"{first}-{second}", seed, f"{run}/1-{first}", first, cfg.tokens // 2)
            add(f"{first}-{second}", seed, f"{run}/2-{second}", second, cfg.tokens - cfg.tokens // 2,
                after=f"{run}/1-{first}")
    finals = cfg.seeds * (1 + len(method_flags(cfg)) + len(SEQUENTIAL))
    samples = (finals * cfg.problems * cfg.samples
               + cfg.seeds * 2 * len(KEEP_FRACTIONS) * cfg.problems * cfg.sparsity_samples
               + len(stages) * (cfg.evals_per_run + 2) * cfg.eval_problems * HELDOUT_SAMPLES)
    training = sum(s.steps * step_seconds(cfg, s.method) for s in stages)
    return stages, training + samples * PLAN_SECONDS.get(cfg.task, PLAN_SECONDS["arithmetic"]).eval_sample


def print_plan(cfg, stages, total_seconds, mean_length):
    print(f"plan: {cfg.tokens} generated tokens per run, seeds 0..{cfg.seeds - 1}; steps estimated from the start "
          f"model's mean completion length, {mean_length:.2f} tokens")
    for s in stages:
        seconds = s.steps * step_seconds(cfg, s.method)
        print(f"  {s.name:<22} {s.tokens:>8} tokens  ~{s.steps:>5} steps  ~{seconds:5.0f} s")
    print(f"  estimated total, evaluations included: {total_seconds / 60:.0f} min", flush=True)


def train_stage(cfg, runs_dir, stage, model):
    """Train one stage to its token budget (bench/budget.py) from `model`; returns its run directory."""
    flags = method_flags(cfg)[stage.method] + ["--model", model, "--seed", stage.seed,
             "--prompt-style", cfg.prompt_style, "--save-every", 10**9,
             "--eval-every", max(1, stage.steps // cfg.evals_per_run),
             "--eval-problems", cfg.eval_problems, "--eval-samples", HELDOUT_SAMPLES,
             "--final-samples", HELDOUT_SAMPLES]
    run_dir = os.path.join(runs_dir, stage.name)
    train_to_budget(run_dir, flags, stage.tokens, stage.steps)
    return run_dir


def stage_record(run_dir, tokens_before):
    """A stage's totals and series, with tokens counted from the start of its whole run."""
    rows = read_log(run_dir)
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)

    def series(key):
        return [[tokens_before + r["tokens"], r[key]] for r in rows if key in r]

    def heldout_series(key, summary_key):
        """train.py's evaluations during training, with its before and after evaluations at the ends."""
        points = series(key) + [[tokens_before + rows[-1]["tokens"], summary["after"][summary_key]]]
        if tokens_before == 0:  # a second stage's "before" is its first stage's "after"
            points.insert(0, [0, summary["before"][summary_key]])
        return points

    return {"steps": rows[-1]["step"], "tokens": rows[-1]["tokens"], "reward": series("reward_mean"),
            "heldout_entropy": heldout_series("heldout_entropy", "entropy"),
            "heldout_malformed": heldout_series("heldout_malformed", "malformed_rate"),
            "train_malformed": series("malformed"),  # GRPO and C3PO's training rollouts, at their temperature
            "js_diversity": series("js_diversity"),
            "groups_solved": [r["groups_solved"] for r in rows if "groups_solved" in r]}


def weights(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def load_weights(path, replace=None):
    """The model at `path`, with its parameters overwritten by `replace` (name -> tensor) if given."""
    model = load_model(path)
    if replace is not None:
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(replace[name])
    return model


def heldout(cfg, tok, model, seed, n):
    """Held-out metrics on the test split of `seed`'s task: the split the runs of that seed never
    trained on (train.py draws its training problems outside it), with pass@k for k = 1, 2, 4, .. n."""
    task = get_task(cfg.task, seed=seed, prompt_style=prompt_style_for(cfg.prompt_style, model.config))
    ks = [2 ** i for i in range(n.bit_length())]
    return evaluate(model, tok, task, task.test_problems()[:cfg.problems], n=n, ks=ks, seed=0)


def solution_space(cfg):
    """How many distinct correct solutions the held-out problems have (mean over seeds' splits), and the share
    of problems with two or more: the room there is for a method to find different ones."""
    style, counts = prompt_style_for(cfg.prompt_style, load_config(cfg.model)), []
    for seed in range(cfg.seeds):
        task = get_task(cfg.task, seed=seed, prompt_style=style)
        counts += [task.solution_count(p) for p in task.test_problems()[:cfg.problems]]
    return {"mean": float(np.mean(counts)), "multi": float(np.mean([c > 1 for c in counts]))}


def mean_std(values):
    """Mean and sample standard deviation (ddof 1; 0 for one value) of the values that are not None."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"mean": float(np.mean(values)), "std": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
            "n": len(values)}


def gain_kept(value, start, full):
    """The fraction of a trained model's gain over the start model that a sparsified model keeps;
    None when training gained nothing (the ratio would be meaningless)."""
    return (value - start) / (full - start) if full > start else None


SERIES = ("reward", "heldout_entropy", "heldout_malformed", "train_malformed", "js_diversity", "groups_solved")


def train_all(cfg, stages, runs_dir):
    """Run every stage; returns {run: record} with the run's totals, series and final checkpoint."""
    run_dirs, runs = {}, {}
    for stage in stages:
        model = cfg.model if stage.after is None else checkpoint.latest(run_dirs[stage.after])
        began = time.time()
        run_dirs[stage.name] = train_stage(cfg, runs_dir, stage, model)
        run = runs.setdefault(stage.run, {"method": stage.label, "seed": stage.seed, "stages": [], "tokens": 0,
                                          "steps": 0, "seconds": 0.0, **{key: [] for key in SERIES}})
        record = stage_record(run_dirs[stage.name], run["tokens"])
        run["stages"].append({"method": stage.method, "steps": record["steps"], "tokens": record["tokens"]})
        for key in SERIES:
            run[key] += record[key]
        run["tokens"] += record["tokens"]
        run["steps"] += record["steps"]
        run["seconds"] += time.time() - began
        run["checkpoint"] = checkpoint.latest(run_dirs[stage.name])
    return runs


def sparsity_ablation(cfg, tok, theta0, run):
    """{keep fraction: pass@1, greedy accuracy and the share of each one's gain kept} of the run's
    final model with only the largest `keep` of its update entries applied."""
    theta = weights(load_weights(run["checkpoint"]))
    points = {keep: heldout(cfg, tok, load_weights(cfg.model, sparsified(theta0, theta, keep)), run["seed"],
                            cfg.sparsity_samples) for keep in KEEP_FRACTIONS}
    metrics = ("pass@1", "greedy_accuracy")
    return {str(keep): {**{k: m[k] for k in metrics},
                        **{f"{k}_gain_kept": gain_kept(m[k], points[0.0][k], points[1.0][k]) for k in metrics}}
            for keep, m in points.items()}


def rescue(method_run, baseline_run):
    """A method's zero-advantage rescue against a baseline from their logged groups_solved, step by step
    over the steps both runs took (the same --seed gives both the same prompts at every step): totals,
    and "quarters", the counts in each quarter of those steps (steps [first, last], 1-based)."""
    paired = min(len(method_run["groups_solved"]), len(baseline_run["groups_solved"]))
    method, baseline = (run["groups_solved"][:paired] for run in (method_run, baseline_run))
    ends = [round(paired * f) for f in BUDGET_FRACTIONS]
    quarters = []
    for first, last in zip(ends, ends[1:]):
        rescued, lost = rescue_counts(*([x for step in run[first:last] for x in step] for run in (method, baseline)))
        quarters.append({"steps": [first + 1, last], "rescued": rescued, "lost": lost})
    baseline = [x for step in baseline for x in step]
    return {"steps": paired, "prompts": len(baseline), "rescued": sum(q["rescued"] for q in quarters),
            "lost": sum(q["lost"] for q in quarters), "baseline_failed": baseline.count(0), "quarters": quarters}


def mean_diversity(run):
    return float(np.mean([d for _, d in run["js_diversity"]]))


def diversity_link(cfg, runs, start):
    """Every ES-only run's σ, mean JS diversity over training, final pass@k and its gain over the start
    model on the same seed's held-out split ("gain_pass@k"), and across those runs the rank correlation
    of diversity with each gain (None where undefined). Gains, not levels: each seed evaluates on its own
    split, whose difficulty would otherwise swamp the differences between runs."""
    sigmas = es_sigmas(cfg)
    points = []
    for name, run in runs.items():
        if run["method"] in sigmas and run["js_diversity"]:
            passes = {k: v for k, v in run["eval"].items() if k.startswith("pass@")}
            points.append({"run": name, "sigma": sigmas[run["method"]], "js_diversity_mean": mean_diversity(run),
                           **passes, **{f"gain_{k}": v - start[run["seed"]][k] for k, v in passes.items()}})
    ks = [k for k in points[0] if k.startswith("pass@")] if points else []
    return {"runs": points, "rank_correlation": {
        k: rank_correlation([p["js_diversity_mean"] for p in points], [p[f"gain_{k}"] for p in points]) for k in ks}}


def main(argv=None):
    cfg = parse_args(argv)
    set_up_process(default_device())  # every process-wide setting, as train.py makes them (minies/runtime)
    runs_dir = os.path.join(cfg.out, "runs")
    if os.path.exists(runs_dir):
        raise UserError(f"{runs_dir} already exists; pass another --out or delete it")
    wall = time.time()
    tok = load_tokenizer(cfg.model)
    start_model = load_weights(cfg.model)
    theta0 = weights(start_model)
    start = {seed: heldout(cfg, tok, start_model, seed, cfg.samples) for seed in range(cfg.seeds)}
    stages, estimate = make_plan(cfg, start[0]["mean_length"])
    print_plan(cfg, stages, estimate, start[0]["mean_length"])

    runs = train_all(cfg, stages, runs_dir)
    for name, run in runs.items():
        print(f"evaluating {name}", flush=True)
        model = load_weights(run["checkpoint"])
        run["eval"] = heldout(cfg, tok, model, run["seed"], cfg.samples)
        run["drift"] = drift(theta0, weights(model))
    sparsity = {}
    for name, run in runs.items():
        if run["method"] in ("es", "grpo"):
            print(f"sparsifying {name}", flush=True)
            sparsity[name] = sparsity_ablation(cfg, tok, theta0, run)

    results = {"config": dataclasses.asdict(cfg), "estimated_seconds": estimate, "solution_space": solution_space(cfg),
               "start": {f"seed{seed}": m for seed, m in start.items()}, "runs": runs, "sparsity": sparsity,
               "rescue": {f"{m}-vs-{b}": {f"seed{seed}": rescue(runs[f"{m}-seed{seed}"], runs[f"{b}-seed{seed}"])
                                          for seed in range(cfg.seeds)} for m, b in RESCUE_PAIRS},
               "diversity_link": diversity_link(cfg, runs, start), "summary": summarize(start, runs, sparsity),
               "seconds": time.time() - wall}
    os.makedirs(cfg.out, exist_ok=True)
    with open(os.path.join(cfg.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    report.write_markdown(results, os.path.join(cfg.out, "results.md"))
    plots = report.plot(results, cfg.out)
    print(f"wrote {cfg.out}/results.json, results.md and {len(plots)} plots in {results['seconds'] / 60:.1f} min "
          f"(estimated {estimate / 60:.0f} min)")


def malformed_over_training(run):
    """The held-out malformed rate at BUDGET_FRACTIONS of the run's tokens (keys "malformed_at<fraction>"),
    linearly interpolated between train.py's evaluations, and the training rollouts' mean malformed rate
    over the last 10% of the budget ("train_malformed_last"; only where the run's end logged one)."""
    tokens, rates = zip(*run["heldout_malformed"])
    row = {f"malformed_at{f}": float(np.interp(f * run["tokens"], tokens, rates)) for f in BUDGET_FRACTIONS}
    last = [rate for t, rate in run["train_malformed"] if t >= 0.9 * run["tokens"]]
    if last:
        row["train_malformed_last"] = float(np.mean(last))
    return row


def summarize(start, runs, sparsity):
    """{method: {metric: mean ± std over seeds}} of the final evaluations, tokens, steps, drift, the
    malformed rate over training, the last logged ES diversity and the sparsified models' metrics (keys
    "sparse<keep>_<metric>"); the start model is the method "start"."""
    rows = {"start": list(start.values())}
    for name, run in runs.items():
        row = {**run["eval"], "tokens": run["tokens"], "steps": run["steps"], "seconds": run["seconds"],
               **{f"drift_{kind}": value for kind, value in run["drift"].items()}, **malformed_over_training(run)}
        if run["js_diversity"]:
            row["js_diversity_last"] = run["js_diversity"][-1][1]
            row["js_diversity_mean"] = mean_diversity(run)
        for keep, metrics in sparsity.get(name, {}).items():
            row.update({f"sparse{keep}_{key}": value for key, value in metrics.items()})
        rows.setdefault(run["method"], []).append(row)
    summary = {}
    for method, seeds in rows.items():
        keys = dict.fromkeys(k for r in seeds for k, v in r.items() if isinstance(v, (int, float)))
        summary[method] = {key: mean_std([r.get(key) for r in seeds]) for key in keys}
    return summary


if __name__ == "__main__":
    run_script(main)
