"""Train a language model with verifiable rewards: ES (default), GRPO, or 3PO.

    python train.py                              # ES on the shipped tiny model, default task
    python train.py --algo grpo                  # GRPO
    python train.py --task countdown             # ES on the shipped Countdown model
    python train.py --task examples/digit_sum.py # a task of your own, in one file (docs/tasks.md)
    python train.py --algo grpo --help           # the flags of one algorithm
    python train.py --model Qwen/Qwen2.5-0.5B-Instruct --dtype bfloat16 --task countdown --recipe qiu2025
    torchrun --nproc_per_node 2 train.py ...     # several processes (gloo on CPU, nccl on CUDA)

Every algorithm gets the same prompts, rewards, logging, checkpoints and evaluation; the
algorithm itself lives in minies/<algo>.py and provides what minies/algorithm.py lists.
"""
import argparse
import contextlib
import dataclasses
import json
import os
import sys
import time
from dataclasses import asdict, dataclass

import torch
from tqdm import tqdm

from minies import UserError
from minies.cli import ArgumentParser, check_thread_variable, check_writable, run_script
from minies.config import from_args, option
from minies.evaluate import evaluate
from minies.models import default_device, load_config, load_model, load_tokenizer, resolve_model
from minies.options import ModelOptions, TaskOptions, check_fit, first_pass, make_task, note_compile_decoding
from minies.options import own_recipe_of, parse, task_settings
from minies.recipes import RECIPES, set_by_recipe
from minies.recipes import describe as describe_recipes
from minies.runtime import checkpoint, distributed, set_up_process
from minies.runtime.checkpoint import written
from minies.runtime.guard import Diverged, check_weights, largest_weight
from minies.runtime.resume import check_resumed_settings, checkpoint_to_resume, input_digests, open_log, restore
from minies.runtime.run_lock import run_directory_lock
from minies.tasks import task_label


def algorithms():
    """name -> (config dataclass, algorithm class). Imported lazily so each algorithm stays optional."""
    from minies.es import ES, ESConfig
    from minies.grpo import GRPO, GRPOConfig
    from minies.threepo import B3PO, C3PO, M3PO, C3POConfig, M3POConfig, ThreePOConfig
    table = {"es": (ESConfig, ES)}
    table["grpo"] = (GRPOConfig, GRPO)
    table["b3po"] = (ThreePOConfig, B3PO)
    table["m3po"] = (M3POConfig, M3PO)
    table["c3po"] = (C3POConfig, C3PO)
    return table


@dataclass
class TrainConfig(TaskOptions, ModelOptions):
    algo: str = option("es", "training algorithm", choices=["es", "grpo", "b3po", "m3po", "c3po"])
    recipe: str = option(None, "a paper's settings in one flag (listed below; minies/recipes.py), over the model's "
                         "own recipe; explicit flags still win", choices=sorted(RECIPES))
    steps: int = option(None, "training steps", check="positive")  # None: the algorithm's own (parse_args)
    seed: int = option(0, "seed for prompts, sampling and noise", check="seed")
    out: str = option("out", "directory for run directories", check="nonempty")
    run_name: str = option(None, "run name (default: <algo>-<task>-seed<seed>)", check="nonempty")
    resume: bool = option(False, "continue the run in out/<run-name> from its latest checkpoint")
    save_every: int = option(25, "checkpoint every k steps (and at the end)", check="positive")
    keep_checkpoints: int = option(2, "checkpoints kept on disk: each save deletes all but the newest k (two: one "
                                   "still loads if the newest is damaged after it was written)", check="positive")
    eval_every: int = option(25, "held-out pass@1, greedy accuracy, entropy, malformed and truncated rates every "
                                 "k steps (0: only before and after)", check="non_negative")
    eval_problems: int = option(None, "held-out problems for the evaluations (default: all of the test split: 500 "
                                "generated, or every row of --eval-data)", check="count")
    eval_samples: int = option(4, "samples per problem for held-out pass@1 during training", check="count")
    final_samples: int = option(16, "samples per problem for the before/after evaluation (pass@1, and pass@k for k "
                                "the samples up to 16: pass@16 from 16 samples, pass@8 from 8)", check="count")
    max_weight_growth: float = option(100.0, "stop the run, before it saves, when a weight's magnitude exceeds this "
                                      "many times the start model's largest (a diverging run; inf: never)",
                                      check="positive_or_inf")


def parse_args(argv):
    """(TrainConfig, the algorithm's config, the algorithm's class, the recipes applied, weakest first)."""
    # Two passes: --recipe, --algo and the model decide which flags exist and their defaults (--help shows
    # only those).
    known = first_pass(argv, "--algo", "--recipe")
    recipe = RECIPES.get(known.recipe)
    if known.recipe is not None and recipe is None:
        raise UserError(f"--recipe {known.recipe}: unknown recipe; choose one of {', '.join(RECIPES)}")
    algo = known.algo or (recipe.algos[0] if recipe else "es")
    if recipe and algo not in recipe.algos:
        raise UserError(f"--recipe {known.recipe} is for --algo {' or '.join(recipe.algos)}, not {algo}")
    table = algorithms()
    if algo not in table:
        raise UserError(f"--algo {algo}: unknown or not available; choose one of {', '.join(table)}")
    # The model a run loads (hence its own recipe) depends on the task, which --recipe may name.
    # A recipe's task-level values (its prompt style, ...) apply only with its task (Recipe.settings): the task
    # given, else --recipe's, else each recipe's own.
    chosen_task = known.task or (recipe.settings(algo).get("task") if recipe else None)
    recipes = [own_recipe_of(known.model, chosen_task), known.recipe]
    parser = ArgumentParser(description=__doc__, epilog="recipes (--recipe NAME):\n" + describe_recipes(),
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    config_class, algorithm = table[algo]
    module = f"minies/{algorithm.__module__.split('.')[-1]}.py"
    args = parse(parser, argv, {"training": TrainConfig, f"{algo} (see {module})": config_class}, recipes, algo,
                 chosen_task, defaults={"algo": algo, "steps": algorithm.default_steps},
                 origins={"steps": f"{module}: {algorithm.__name__}.default_steps"})
    applied = list(dict.fromkeys(name for name in recipes if name))  # --recipe tiny on the tiny model: once
    return from_args(TrainConfig, args), from_args(config_class, args), algorithm, applied


def print_settings(argv, names, cfg, algo_cfg):
    """One line per recipe applied: the values of every flag it names, as the run resolved them (a flag given
    on the command line shows its own value); then a note for a flag given that does nothing here."""
    values = {**dataclasses.asdict(cfg), **dataclasses.asdict(algo_cfg)}
    for name in names:
        keys = [k for k in RECIPES[name].settings(cfg.algo, cfg.task) if k in values]
        print(f"recipe {name}: " + ", ".join(f"--{k.replace('_', '-')} {values[k]}" for k in keys))
    note_compile_decoding(argv, cfg.compile_decoding, default_device())


def heldout(model, tok, task, cfg, n, progress=False):
    model.eval()
    return evaluate(model, tok, task, task.test_problems(cfg.eval_problems), n=n, ks=sorted({1, min(n, 16)}),
                    seed=cfg.seed, chat_template=cfg.chat_template, compile_decoding=cfg.compile_decoding,
                    progress=progress)


# The log row's name for each held-out metric train.py evaluates every --eval-every steps.
HELDOUT_LOGGED = {"heldout_pass@1": "pass@1", "heldout_greedy": "greedy_accuracy", "heldout_entropy": "entropy",
                  "heldout_malformed": "malformed_rate", "heldout_truncated": "truncated_rate"}


def main(argv=None):
    cfg, algo_cfg, Algorithm, recipes = parse_args(argv)
    check_thread_variable()
    set_up_process(default_device())  # every process-wide setting (threads, allocator, logging): minies/runtime
    distributed.init()
    main_rank = distributed.is_main()
    by_recipe = set_by_recipe(argv, recipes, cfg.algo, cfg, algo_cfg)
    if main_rank:
        print_settings(argv, recipes, cfg, algo_cfg)
    check_run_name(cfg.run_name)
    source = resolve_model(cfg.model)  # once: a GGUF file is converted here, or found converted
    model_config = load_config(source)  # a missing model is named before anything about its run
    run_dir = os.path.join(cfg.out, cfg.run_name or f"{cfg.algo}-{task_label(cfg.task)}-seed{cfg.seed}")
    check_writable(run_dir, "--out")
    with run_directory_lock(run_dir) if main_rank else contextlib.nullcontext():  # before anything is written
        train(cfg, algo_cfg, Algorithm, recipes, by_recipe, source, model_config, run_dir, main_rank)
    distributed.close()


def train(cfg, algo_cfg, Algorithm, recipes, by_recipe, source, model_config, run_dir, main_rank):
    """The run in `run_dir`, new or resumed, to its summary."""
    inputs = input_digests(cfg)  # of the files as the run starts reading them
    resume_from, state = checkpoint_to_resume(run_dir, cfg, by_recipe, main_rank)

    torch.manual_seed(cfg.seed)
    task = make_task(cfg, model_config, by_recipe, speak=main_rank, to_train=True)
    tok = load_tokenizer(source)
    check_fit(task, tok, cfg, model_config, by_recipe, speak=main_rank)
    # --resume starts again from the start model too: the training state holds the trained weights (ES's masters,
    # GRPO's weights or adapters), and the model a checkpoint holds (merged, dequantized) is for eval.py.
    model = load_model(source, cfg.dtype, cfg.load_in_8bit)
    algorithm = Algorithm(model, tok, task, algo_cfg, chat_template=cfg.chat_template,
                          compile_decoding=cfg.compile_decoding)
    if main_rank and getattr(algo_cfg, "mode", None) == "auto" and algorithm.resolved["mode"] == "lowrank":
        # auto never switches estimators in silence: lowrank's noise is not the full-rank noise of Qiu et al.
        print(f"note: --mode auto runs lowrank: each member's noise is rank {algo_cfg.rank} (EGGROLL), added in the "
              "forward pass, not the full-rank noise written into the weights that Qiu et al. ran (--mode inplace); "
              "what each learns: docs/real-models.md#es-mode", file=sys.stderr)
    weight_bound = cfg.max_weight_growth * largest_weight(model)  # of the start model, also when resuming
    # Every setting as the run resolved it: the flags, and what the task and the algorithm chose for those left
    # to them (config.json records it; --resume compares it).
    settings = run_settings(cfg, algo_cfg, task_settings(task), algorithm.resolved)

    if resume_from:
        # Every setting resolved, before anything is restored.
        check_resumed_settings(run_dir, settings, (cfg, algo_cfg), by_recipe, inputs, task.difficulty)
        start_step, tokens, before = restore(state, algorithm)
    else:
        start_step, tokens = 0, 0
        before = heldout(model, tok, task, cfg, cfg.final_samples, main_rank)
        if main_rank:
            write_config(run_dir, settings, recipes, inputs)
            print("before: " + _fmt(before))
    log = open_log(run_dir, start_step, resume_from) if main_rank else None

    wall, tied_steps = time.time(), 0
    bar = tqdm(range(start_step, cfg.steps), initial=start_step, total=cfg.steps, disable=not main_rank,
               desc=cfg.algo, dynamic_ncols=True)
    for step in bar:
        # Each step's prompts and seeds depend only on (seed, step): the same on every rank and after --resume.
        step_seed = cfg.seed * 1_000_003 + step
        stats = guarded_step(algorithm, task, step_seed, step + 1, model, weight_bound)
        tokens += stats.pop("tokens", 0)
        tied_steps += bool(stats.get("all_tied"))
        row = {"step": step + 1, **stats, "tokens": tokens, "seconds": round(time.time() - wall, 2)}
        if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.steps:
            metrics = heldout(model, tok, task, cfg, cfg.eval_samples)
            row.update({key: metrics[name] for key, name in HELDOUT_LOGGED.items()})
            if main_rank:  # one line each, above the step bar
                bar.write(f"step {step + 1}: " + _fmt({key: row[key] for key in HELDOUT_LOGGED}))
        if main_rank:
            append_row(log, row)
            bar.set_postfix(reward=f"{stats.get('reward_mean', 0):.3f}")
        if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
            save(run_dir, step + 1, algorithm, tok, {"tokens": tokens, "before": before}, cfg.keep_checkpoints)
    bar.close()

    after = heldout(model, tok, task, cfg, before["n"], main_rank)
    if main_rank:
        log.close()
        write_summary(run_dir, before, after, tokens, tied_steps, cfg.steps - start_step, bool(resume_from))


def check_run_name(run_name):
    parts = run_name.replace("\\", "/").split("/") if run_name is not None else []
    if run_name is not None and (os.path.isabs(run_name) or any(p in ("", ".", "..") for p in parts)):
        raise UserError(f"--run-name {run_name}: the run's directory is --out/NAME, so NAME must stay inside "
                        "--out (no '..', '.', leading '/')")


def run_settings(cfg, algo_cfg, resolved_task=(), resolved_algorithm=()):
    """{"train": its settings, ALGO: the algorithm's}, as config.json records them: each flag's value, over it
    what the task and the algorithm resolved (`resolved_task`, `resolved_algorithm`: {setting: value})."""
    return {"train": {**asdict(cfg), **dict(resolved_task)},
            cfg.algo: {**asdict(algo_cfg), **dict(resolved_algorithm)}}


def write_config(run_dir, settings, recipes, inputs):
    """config.json: every setting as resolved (run_settings), the recipes applied, and the sha256 of each file the
    run reads."""
    os.makedirs(run_dir, exist_ok=True)
    with written(os.path.join(run_dir, "config.json")) as f:
        json.dump({**settings, "recipes": recipes, "inputs": inputs}, f, indent=1)


def guarded_step(algorithm, task, step_seed, step, model, weight_bound):
    """The algorithm's step number `step`, its weights checked before the step is logged or saved: every
    checkpoint stays good."""
    try:
        stats = algorithm.step(task.train_problems(algorithm.prompts_per_step, seed=step_seed), step_seed)
        check_weights(model, weight_bound)
    except Diverged as e:
        raise Diverged(e.what, step, e.why) from None
    return stats


def save(run_dir, step, algorithm, tok, progress, keep):
    """Checkpoint `step` (written by the main process; every process waits for it)."""
    if distributed.is_main():
        state = {"algorithm": algorithm.state_dict(), **progress}
        checkpoint.save(run_dir, step, algorithm.model_to_save(), tok, state, keep)
    distributed.barrier()


def append_row(log, row):
    with written(log.name, log) as f:
        f.write(json.dumps(row) + "\n")
        f.flush()


def write_summary(run_dir, before, after, tokens, tied_steps, steps_run, resumed):
    """summary.json, and the `after:` line (beside `before:` for a resumed run, which printed none at its start)."""
    with written(os.path.join(run_dir, "summary.json")) as f:
        json.dump({"before": before, "after": after, "tokens": tokens}, f, indent=1)
    if resumed:
        print("before: " + _fmt(before))
    print("after:  " + _fmt(after))
    if tied_steps and tied_steps == steps_run:
        print(f"note: every member tied at every one of the {tied_steps} steps run: ES had no difference to "
              "follow and the weights did not move (another --sigma, more --prompts-per-step?)", file=sys.stderr)
    print(f"run directory: {run_dir}")


def _fmt(metrics):
    return "  ".join(f"{k} {v:.3f}" for k, v in metrics.items() if isinstance(v, float))


if __name__ == "__main__":
    run_script(main)
