"""--resume: which checkpoint a run continues, whether this command may continue it, and restoring it.

train.py calls these in order: checkpoint_to_resume (before the model is loaded: a run directory that holds a run
is refused without --resume), check_resumed_settings (every setting resolved, before anything is restored),
restore (the RNGs and the algorithm's state), open_log (the log loses the steps after the checkpoint). Resuming
is exact: a step's prompts and seeds depend only on (seed, step), and a checkpoint holds every state the next
step reads."""
import json
import os
import sys
from dataclasses import asdict

from minies import UserError
from minies.runtime import checkpoint


def checkpoint_to_resume(run_dir, cfg, by_recipe, main_rank):
    """(the newest complete checkpoint of `run_dir`, its training state), or (None, None) for a run that starts at
    step 0. Refuses to overwrite a run without --resume, and a --steps the run has passed already."""
    if not checkpoint.has_checkpoint(run_dir):
        if main_rank and (cfg.resume or os.path.exists(os.path.join(run_dir, "log.jsonl"))):
            # Killed before its first checkpoint: nothing to resume, so the run starts again (and its log with it).
            print(f"note: {run_dir} has no checkpoint; starting it from step 0{where_resume_looked(cfg, by_recipe)}",
                  file=sys.stderr)
        return None, None
    if not cfg.resume:
        raise UserError(f"{run_dir} already holds a run; pass --resume to continue it or --run-name NAME "
                        "for a new one")
    resume_from, state, skipped = checkpoint.load_latest(run_dir)
    if cfg.steps < state["step"]:
        raise UserError(f"--steps {cfg.steps}: {resume_from} is at step {state['step']} already; pass --steps "
                        f"{state['step']} or more to continue the run")
    if skipped and main_rank:
        print(f"warning: {'; '.join(skipped)}; resuming from {resume_from}", file=sys.stderr)
    return resume_from, state


def where_resume_looked(cfg, by_recipe):
    """For --resume under the default run name: the name it is made of, so that a run looked for under another
    name (another --task, or a --model whose recipe sets one) says why."""
    if not cfg.resume or cfg.run_name is not None:
        return ""
    task = f"--task {cfg.task}" + (f" from {by_recipe['task']}" if "task" in by_recipe else "")
    return (f" (--resume looks for {os.path.join(cfg.out, '<algo>-<task>-seed<seed>')}: --algo {cfg.algo}, {task}, "
            f"--seed {cfg.seed}; --run-name NAME resumes a run of another name)")


def restore(state, algo):
    """(step, tokens generated up to that step, the run's "before" evaluation) of a checkpoint's `state`, its RNGs and the algorithm's
    state restored. The RNGs only now: building the algorithm draws from them."""
    checkpoint.set_rng_state(state["rng"])
    algo.load_state_dict(state["algorithm"])
    progress = state["step"], state["tokens"], state["before"]
    state.clear()  # applied: free its tensors (a real model's optimizer state takes GBs)
    return progress


def open_log(run_dir, start_step, resume_from):
    """The run's log.jsonl, opened to append the steps from `start_step` on: a resumed run's log first loses the
    steps after its checkpoint and what a crash left of a line; a new run's starts empty."""
    path = os.path.join(run_dir, "log.jsonl")
    if resume_from:
        for warning in checkpoint.truncate_log(path, start_step):
            print(f"warning: {warning}", file=sys.stderr)
    return open(path, "a" if resume_from else "w")


# Settings a resumed run may change: how long it runs, how often it evaluates and saves and how many checkpoints it
# keeps, where (not how) ES keeps its masters, and whether decoding is compiled. --recipe is a way of giving
# settings, not one: the values it resolves to are compared. Any other difference would continue one run with the
# settings of another.
MAY_CHANGE_ON_RESUME = {"steps", "eval_every", "save_every", "keep_checkpoints", "resume", "out", "run_name",
                        "master_device", "compile_decoding", "recipe"}


def check_resumed_settings(run_dir, cfg, algo_cfg, by_recipe, task_sha256=None):
    """A UserError naming every setting of this command line that differs from the run's config.json, with
    the recorded value and, for a value a recipe gave, that recipe (paths compared as the directories or files
    they name); first, one for a --task FILE whose text (`task_sha256`) is not the text the run was trained on."""
    path = os.path.join(run_dir, "config.json")
    try:
        with open(path) as f:
            recorded = json.load(f)
        recorded_train = recorded["train"]
    except (OSError, ValueError, KeyError, TypeError):
        raise UserError(f"{path} is missing or unreadable: --resume cannot check what it continues; restore it, "
                        "or pass --run-name NAME for a new run") from None
    recorded_sha256 = (recorded.get("task_file") or {}).get("sha256")
    if task_sha256 and recorded_sha256 and task_sha256 != recorded_sha256:
        raise UserError(f"--task {cfg.task}: the task file's text changed since {run_dir} started (sha256 "
                        f"{str(recorded_sha256)[:12]}, now {str(task_sha256)[:12]}), so its rewards are not the run's; "
                        "restore the file, or pass --run-name NAME for a new run")
    if cfg.algo not in recorded:
        raise UserError(f"--algo {cfg.algo}: {run_dir} was trained with --algo {recorded_train.get('algo')}")

    def same(key, a, b):
        if isinstance(a, str) and isinstance(b, str) and key in ("model", "data", "eval_data", "task"):
            return os.path.realpath(os.path.expanduser(a)) == os.path.realpath(os.path.expanduser(b))
        return a == b

    def origin(key):
        return f"from {by_recipe[key]}; " if key in by_recipe else ""

    differences = [f"--{key.replace('_', '-')} {now} ({origin(key)}the run has {recorded_part.get(key)})"
                   for recorded_part, settings in ((recorded_train, asdict(cfg)), (recorded[cfg.algo], asdict(algo_cfg)))
                   for key, now in settings.items()
                   if key not in MAY_CHANGE_ON_RESUME and not same(key, now, recorded_part.get(key))]
    if differences and recorded_train.get("recipe") not in (None, cfg.recipe):  # the flag that gives them back
        differences.append(f"the run was made with --recipe {recorded_train['recipe']}")
    if differences:
        raise UserError(f"--resume continues {run_dir} with its own settings, but this command differs: "
                        f"{'; '.join(differences)}; drop those flags, or pass --run-name NAME for a new run")
