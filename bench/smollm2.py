"""The founding papers' claims on a real model, SmolLM2-135M-Instruct (docs/results.md section 5).

    OMP_NUM_THREADS=1 python -m bench.smollm2 --out results/smollm2     # hours; run it again after any stop
    python -m bench.smollm2 --quick --out /tmp/smollm2-quick            # every stage at toy size on the shipped model

Every piece of work leaves a file behind it, and a run of the command does only the pieces whose files are
missing: a stopped run (a kill, a full disk, the end of a session) goes on where it was when the command is given
again, and a training run stopped mid-way continues from its last checkpoint (train.py --resume: bit-identical to an
unbroken run). Set OMP_NUM_THREADS, and keep it: a sampled run repeats to the last bit only at a fixed thread count
(minies/runtime/threads.py), a run resumed at another count parts from an unbroken one, and results/smollm2 was
made at 1 (results.json records the count). `--only` splits the work between processes, e.g. one for the ES
check and one for GRPO and C3PO on a 2-core machine; two processes given the same evaluation piece share it, each
file computed by one of them.

The pieces, in order:
1. The start model on seed 0's held-out split (--problems × --samples, and greedily): evals/start-seed0.json; its
   mean completion length sizes every run. The other seeds' splits come with the final evaluations (4).
2. ES's estimators at an equal budget of generated training tokens (seed 0): in place (full rank, Qiu et al.'s
   N, σ, α), lowrank at rank 1 and at --es-check-rank, and a σ × α check around Qiu et al.'s values at half the
   budget (lowrank, rank 1), with no evaluation between the first and the last. Held-out pass@1 against tokens and
   wall time from each run's log.
3. ES (in --es-mode, at the recipe's σ and α), GRPO and C3PO for seeds 0..S-1 at the same --tokens.
4. Every final model on its seed's held-out split, as the start model (evals/<run>.json), and on --transfer-numbers
   sums (evals/<run>-transfer.json): does a trained model keep a skill it was not trained on? And its drift from the
   start model, ‖θ − θ0‖ (evals/<run>-drift.json): large drift without forgetting?
5. Functional sparsity: seed 0's ES and GRPO models with only the largest x% of |θ − θ0| applied.
6. Sequential training: GRPO for half the budget, then ES for the other half from GRPO's model (seed 0).
7. The calibration: the start model at --calibration-levels, as at the chosen level (1).
8. Temperature against weight noise (bench/weight_noise.py): the start model's accuracy and answer diversity at
   --temperatures and at --noise-scales.
Then results.json, results.md and the plots are written from the files (bench/smollm2_report.py).
"""
import argparse
import json
import os
import time
from dataclasses import asdict, dataclass

import train
from bench import weight_noise
from bench.budget import is_trained, train_to_budget, write_json
from bench.reproduce import KEEP_FRACTIONS, load_weights, weights
from minies import UserError
from minies.cli import ArgumentParser, check_writable, run_script
from minies.analysis import drift, sparsified
from minies.config import add_arguments, checked, from_args, option
from minies.evaluate import evaluate
from minies.models import default_device, load_config, load_model, load_tokenizer
from minies.recipes import own_recipe, prompt_style_for, recipe_defaults
from minies.runtime import checkpoint, set_up_process
from minies.runtime.run_lock import lock_file, release
from minies.tasks import get_task

METHODS = ("es", "grpo", "c3po")
QIU_SIGMA, QIU_ALPHA = 0.001, 0.0005  # Qiu et al.'s σ and α, which the ES check runs at (the recipe may differ)
PIECES = ("es-check", *METHODS, "sequential", "calibration", "noise", "evals", "sparsity")


@dataclass
class SmolConfig:
    model: str = option("smollm2-135m", "the start model (its own recipe applies to every run)")
    out: str = option("results/smollm2", "output directory: evals/, runs/, es-check/, results.json, results.md, plots")
    numbers: list = option((3,), "the task level: numbers per sum (docs/results.md: where coverage can collapse)",
                           nargs="+", type=checked(int, "numbers"))
    high: int = option(9, "the task level: the largest number, inclusive", check="number_value")
    seeds: int = option(3, "seeds 0..S-1 for every method", check="positive")
    tokens: int = option(20_000, "generated training tokens per run, the same for every method", check="positive")
    es_mode: str = option("lowrank", "ES's estimator in the seeded runs (the ES check measures both)",
                          choices=["inplace", "lowrank"])
    es_prompts: int = option(8, "ES prompts per step (30 members each)", check="positive")
    es_check_rank: int = option(8, "the larger rank of the ES check", check="positive")
    es_check_grid: str = option("0.001:0.002,0.003:0.0005,0.003:0.002",
                                "σ:α pairs of the short ES runs beside Qiu et al.'s 0.001:0.0005; '' for none")
    problems: int = option(200, "held-out problems of the final evaluations", check="positive")
    samples: int = option(64, "samples per problem of the final evaluations (pass@k up to k = samples)",
                          check="positive")
    eval_problems: int = option(200, "held-out problems of the evaluations during training", check="positive")
    eval_samples: int = option(4, "samples per problem of the evaluations during training", check="positive")
    evals_per_run: int = option(4, "evaluations during each training run", check="positive")
    transfer_numbers: int = option(2, "the other task level (numbers per sum, in 0..99) each final model is "
                                   "evaluated on", check="positive")
    transfer_samples: int = option(8, "samples per problem on the other task level", check="positive")
    sparsity_samples: int = option(8, "samples per problem of the sparsified models", check="positive")
    calibration_levels: list = option(("2:99", "2,3:20", "3:20"), "other task levels the start model is evaluated "
                                      "at, as the chosen one (numbers per sum, comma-separated : the largest number)",
                                      nargs="+", type=str)
    temperatures: list = option((0.6, 0.8, 1.0, 1.2, 1.4, 1.6), "sampling temperatures of the temperature against "
                                "weight noise comparison (bench/weight_noise.py)", nargs="+",
                                type=checked(float, "temperature"))
    noise_scales: list = option((0.002, 0.004, 0.008, 0.016), "weight noise scales s of that comparison", nargs="+",
                                type=checked(float, "positive"))
    noise_samples: int = option(16, "answers per problem at each temperature and each noise scale", check="positive")
    only: str = option("", "comma-separated pieces this process does besides the start model's evaluation on "
                       "seed 0 (calibration, es-check, es, grpo, c3po, sequential, evals, sparsity, noise); '' for all")
    quick: bool = option(False, "every piece at toy size on the shipped model (changes the defaults above)")


QUICK = {"model": "minies/assets/tiny", "seeds": 1, "tokens": 1500, "es_prompts": 2, "problems": 8, "samples": 4,
         "eval_problems": 8, "eval_samples": 2, "evals_per_run": 2, "transfer_samples": 2, "sparsity_samples": 2,
         "es_check_grid": "0.003:0.002", "high": 20, "calibration_levels": ["2:40"], "temperatures": [0.6, 1.6],
         "noise_scales": [0.01], "noise_samples": 2}


def parse_args(argv):
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--quick", action="store_true")
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, SmolConfig, "smollm2")
    if pre.parse_known_args(argv)[0].quick:
        parser.set_defaults(**QUICK)
    cfg = from_args(SmolConfig, parser.parse_args(argv))
    grid(cfg), levels(cfg)  # a malformed --es-check-grid or level fails here, before anything runs
    unknown = set(filter(None, cfg.only.split(","))) - set(PIECES)
    if unknown:
        raise UserError(f"--only {cfg.only}: no piece {', '.join(sorted(unknown))}; the pieces are {', '.join(PIECES)}")
    return cfg


def levels(cfg):
    """{name: (numbers, high)} of --calibration-levels."""
    try:
        parsed = {}
        for level in cfg.calibration_levels:
            numbers, high = level.split(":")
            parsed[f"calibration-{level.replace(':', '-').replace(',', '+')}"] = ([int(x) for x in numbers.split(",")],
                                                                                  int(high))
        return parsed
    except ValueError:
        raise UserError(f"--calibration-levels {' '.join(cfg.calibration_levels)}: give levels as NUMBERS:HIGH, e.g. "
                        "2:99 or 2,3:20") from None


def grid(cfg):
    """[(σ, α)] of --es-check-grid."""
    try:
        pairs = [tuple(float(x) for x in pair.split(":")) for pair in cfg.es_check_grid.split(",") if pair.strip()]
    except ValueError:
        pairs = [()]
    if not all(len(p) == 2 and p[0] > 0 and p[1] > 0 for p in pairs):
        raise UserError(f"--es-check-grid {cfg.es_check_grid!r}: give positive σ:α pairs separated by commas")
    return pairs


def wanted(cfg, piece):
    return not cfg.only or piece in cfg.only.split(",")


def task_flags(cfg):
    return ["--numbers", *cfg.numbers, "--high", cfg.high]


def make_task(cfg, seed, numbers=None, high=None):
    """The task at the chosen level (or `numbers`, `high`), asked in the prompt style of the model's own recipe, as
    train.py and eval.py ask it (a packaged model names its recipe by its name, not in its config)."""
    style = recipe_defaults([own_recipe(cfg.model)], None, {"prompt_style"}).get("prompt_style", "auto")
    style = prompt_style_for(style, load_config(cfg.model))
    return get_task("arithmetic", seed=seed, prompt_style=style, numbers=list(numbers or cfg.numbers),
                    high=cfg.high if high is None else high)


def eval_file(cfg, name):
    return os.path.join(cfg.out, "evals", f"{name}.json")


def saved(path, compute, wait=False):
    """The JSON at `path`, computed and written first if it is missing: the unit of resumption. Processes that
    share the work (--only) never compute one file twice: while one holds the file's lock (the kernel's, dropped
    by a kill), another skips the file and gets None, or with `wait` waits for it."""
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        lock = lock_file(path + ".lock", wait)
        if lock is None:
            print(f"note: another process is computing {path}: skipped here")
            return None
        try:
            if not os.path.exists(path):  # not written by a holder that ended since this process looked
                write_json(path, compute())
        finally:
            release(path + ".lock", lock)
    with open(path) as f:
        return json.load(f)


def held_out(cfg, tok, model, task, n, problems):
    ks = sorted({k for k in (1, 4, 8, 16, 32, 64) if k <= n} | {n})
    return evaluate(model, tok, task, task.test_problems(problems), n=n, ks=ks, seed=0, progress=True)


def train_run(cfg, run_dir, flags, tokens, mean_length, model=None, curve=True):
    """bench/budget.py's train_to_budget for a run of this bench, from `model` (default: the start model), its
    steps estimated from `mean_length`, the start model's mean completion length; `curve`: --evals-per-run
    evaluations during training, else only the one before and the one after."""
    estimate = max(1, round(tokens / (per_step(cfg, flags) * mean_length)))
    flags = [*flags, "--model", model or cfg.model, "--save-every", 5, "--keep-checkpoints", 1,
             "--eval-every", max(1, estimate // cfg.evals_per_run) if curve else 0, "--eval-problems", cfg.eval_problems,
             "--eval-samples", cfg.eval_samples, "--final-samples", cfg.eval_samples]
    return train_to_budget(run_dir, flags, tokens, estimate)


def per_step(cfg, flags):
    """Completions per training step of a run with train.py `flags` (the model's recipe applied)."""
    _, algo = train.parse_args([str(f) for f in flags + ["--model", cfg.model]])[:2]
    return algo.population * algo.prompts_per_step if flags[1] == "es" else algo.prompts * algo.group_size


def es_check_runs(cfg):
    """{name: train.py flags} of the ES check (module docstring, 2): all seed 0."""
    es = ["--algo", "es", "--prompts-per-step", cfg.es_prompts, *task_flags(cfg)]
    qiu = es + ["--sigma", QIU_SIGMA, "--alpha", QIU_ALPHA]
    runs = {"es-inplace": qiu + ["--mode", "inplace"], "es-lowrank-r1": qiu + ["--mode", "lowrank", "--rank", 1],
            f"es-lowrank-r{cfg.es_check_rank}": qiu + ["--mode", "lowrank", "--rank", cfg.es_check_rank]}
    runs.update({f"es-sigma{s:g}-alpha{a:g}": es + ["--mode", "lowrank", "--sigma", s, "--alpha", a]
                 for s, a in grid(cfg)})
    return runs


def seeded_runs(cfg):
    """{name: (method, seed, run directory)} of the seeded runs (module docstring, 3)."""
    return {f"{method}-seed{seed}": (method, seed, os.path.join(cfg.out, "runs", f"{method}-seed{seed}"))
            for seed in range(cfg.seeds) for method in METHODS}


def method_flags(cfg, method, seed):
    flags = {"es": ["--algo", "es", "--prompts-per-step", cfg.es_prompts, "--mode", cfg.es_mode],
             "grpo": ["--algo", "grpo"], "c3po": ["--algo", "c3po"]}[method]
    return flags + task_flags(cfg) + ["--seed", seed]


def final_model(run_dir):
    """The final model of a trained run, loaded only when a piece still needs it: a run whose evaluations are all
    on file needs no checkpoint any more."""
    return load_weights(checkpoint.latest(run_dir))


def es_check(cfg, tok, mean_length):
    for name, flags in es_check_runs(cfg).items():  # the σ × α runs are ranked by their final evaluation alone
        short = name.startswith("es-sigma")
        train_run(cfg, os.path.join(cfg.out, "es-check", name), flags + ["--seed", 0],
                  cfg.tokens // 2 if short else cfg.tokens, mean_length, curve=not short)


def sequential(cfg, tok, mean_length):
    """GRPO, then ES from GRPO's final model, half the budget each (seed 0)."""
    first = os.path.join(cfg.out, "runs", "grpo-es-seed0", "1-grpo")
    second = os.path.join(cfg.out, "runs", "grpo-es-seed0", "2-es")
    train_run(cfg, first, method_flags(cfg, "grpo", 0), cfg.tokens // 2, mean_length)
    if not is_trained(second):  # a checkpoint names no recipe of its own: the start model's is given by name
        train_run(cfg, second, method_flags(cfg, "es", 0) + ["--recipe", own_recipe(cfg.model)],
                        cfg.tokens - cfg.tokens // 2, mean_length, model=checkpoint.latest(first))
    saved(eval_file(cfg, "grpo-es-seed0"), lambda: held_out(cfg, tok, final_model(second), make_task(cfg, 0),
                                                            cfg.samples, cfg.problems))


def calibration(cfg, tok, mean_length):
    for name, (numbers, high) in levels(cfg).items():
        saved(eval_file(cfg, name), lambda: held_out(cfg, tok, load_model(cfg.model), make_task(cfg, 0, numbers, high),
                                                     cfg.samples, cfg.problems))


def noise(cfg, tok, mean_length):
    model, task = load_model(cfg.model), make_task(cfg, 0)
    problems = task.test_problems(cfg.problems)
    for t in cfg.temperatures:
        saved(eval_file(cfg, f"noise-T{t:g}"), lambda: weight_noise.temperature(
            model, tok, task, problems, t, cfg.noise_samples))
    for scale in cfg.noise_scales:
        saved(eval_file(cfg, f"noise-s{scale:g}"), lambda: weight_noise.weight_noise(
            model, tok, task, problems, scale, cfg.noise_samples))


def final_evals(cfg, tok, mean_length):
    """Every trained run's final model on its seed's split and on the other task level (the start model too), and
    how far it moved, ‖θ − θ0‖ in total and per layer type."""
    for seed in range(1, cfg.seeds):
        saved(eval_file(cfg, f"start-seed{seed}"), lambda: held_out(cfg, tok, load_model(cfg.model),
                                                                    make_task(cfg, seed), cfg.samples, cfg.problems))
    transfer = make_task(cfg, 0, [cfg.transfer_numbers], 99)
    saved(eval_file(cfg, "start-transfer"), lambda: held_out(cfg, tok, load_model(cfg.model), transfer,
                                                             cfg.transfer_samples, cfg.problems))
    for name, (method, seed, run_dir) in seeded_runs(cfg).items():
        if is_trained(run_dir):
            saved(eval_file(cfg, name), lambda: held_out(cfg, tok, final_model(run_dir), make_task(cfg, seed),
                                                         cfg.samples, cfg.problems))
            saved(eval_file(cfg, f"{name}-transfer"), lambda: held_out(cfg, tok, final_model(run_dir), transfer,
                                                                       cfg.transfer_samples, cfg.problems))
            saved(eval_file(cfg, f"{name}-drift"), lambda: drift(weights(load_weights(cfg.model)),
                                                                 weights(final_model(run_dir))))


def sparsity(cfg, tok, mean_length):
    """Seed 0's ES and GRPO models with only the largest x% of their changes |θ − θ0| applied."""
    for name, (method, seed, run_dir) in seeded_runs(cfg).items():
        files = {keep: eval_file(cfg, f"{name}-keep{keep:g}") for keep in KEEP_FRACTIONS[1:-1]}
        if seed or method not in ("es", "grpo") or not is_trained(run_dir) or all(map(os.path.exists, files.values())):
            continue
        theta0, theta = weights(load_weights(cfg.model)), weights(final_model(run_dir))
        for keep, path in files.items():
            saved(path, lambda: held_out(cfg, tok, load_weights(cfg.model, sparsified(theta0, theta, keep)),
                                         make_task(cfg, seed), cfg.sparsity_samples, cfg.problems))


def main(argv=None):
    cfg = parse_args(argv)
    check_writable(cfg.out, "--out")
    set_up_process(default_device())
    began = time.time()
    tok = load_tokenizer(cfg.model)
    # Every piece waits for the start model's evaluation on seed 0's split: its mean length sizes the runs.
    mean_length = saved(eval_file(cfg, "start-seed0"), lambda: held_out(
        cfg, tok, load_model(cfg.model), make_task(cfg, 0), cfg.samples, cfg.problems), wait=True)["mean_length"]
    if wanted(cfg, "es-check"):
        es_check(cfg, tok, mean_length)
    for name, (method, seed, run_dir) in seeded_runs(cfg).items():
        if wanted(cfg, method):
            train_run(cfg, run_dir, method_flags(cfg, method, seed), cfg.tokens, mean_length)
    for piece, do in (("sequential", sequential), ("calibration", calibration), ("noise", noise),
                      ("evals", final_evals), ("sparsity", sparsity)):
        if wanted(cfg, piece):
            do(cfg, tok, mean_length)
    from bench import smollm2_report  # the report reads only the files written above
    if smollm2_report.complete(cfg):
        smollm2_report.write(cfg, asdict(cfg), time.time() - began)


if __name__ == "__main__":
    run_script(main)
