"""--resume: which checkpoint a run continues, whether this command may continue it, and restoring it.

train.py calls these in order: checkpoint_to_resume (before the model is loaded: a run directory that holds a run
is refused without --resume), check_resumed_settings (every setting resolved, before anything is restored),
restore (the RNGs and the algorithm's state), open_log (the log loses the steps after the checkpoint). Resuming
is exact: a step's prompts and seeds depend only on (seed, step), and a checkpoint holds every state the next
step reads."""
import hashlib
import json
import os
import sys
from dataclasses import fields

from minies import UserError
from minies.gguf import packaged_file
from minies.tasks.task_file import is_task_file
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


def restore(state, algorithm):
    """(step, tokens generated up to that step, the run's "before" evaluation) of a checkpoint's `state`, its RNGs
    and the algorithm's state restored. The RNGs only now: building the algorithm draws from them."""
    checkpoint.set_rng_state(state["rng"])
    algorithm.load_state_dict(state["algorithm"])
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


def typed(value):
    """A setting as it is typed on the command line: a list's items space-separated."""
    return " ".join(map(str, value)) if isinstance(value, (list, tuple)) else value


# The settings that name a file the run reads: config.json records each file's sha256 ("inputs"), and --resume
# refuses a file whose content changed, as it refuses a changed setting (the same path may hold other problems).
INPUT_FILES = ("data", "eval_data", "task")


def input_digests(cfg):
    """{"--flag": {"path", "sha256"}} of every file the run reads (INPUT_FILES: --task when it names a file), for
    config.json."""
    return {f"--{key.replace('_', '-')}": {"path": getattr(cfg, key), "sha256": sha256(getattr(cfg, key))}
            for key in INPUT_FILES if getattr(cfg, key, None) is not None and (key != "task" or is_task_file(cfg.task))}


def sha256(path):
    """The file's sha256 in hex, or None when it cannot be read (reading it later says why)."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


def changed_inputs(recorded, now):
    """One phrase per input file whose content differs from the run's (`recorded`: config.json's "inputs"; a run
    written before files were hashed has none, and resumes unchecked)."""
    return [f"{flag} {now[flag]['path']} changed since the run read it (sha256 {entry['sha256'][:12]}..., now "
            f"{(now[flag]['sha256'] or 'unreadable')[:12]}...)"
            for flag, entry in (recorded or {}).items()
            if flag in now and entry.get("sha256") and now[flag]["sha256"] != entry["sha256"]]


def check_resumed_settings(run_dir, settings, configs, by_recipe, inputs=None, difficulty=None):
    """A UserError naming every setting of this command line (`settings`: as config.json records them,
    {"train": ..., ALGO: ...}; `configs`: the config dataclasses, whose defaults stand for a setting an older
    config.json lacks) that differs from the run's config.json, with
    the recorded value and, for a value a recipe gave, that recipe, or naming an input file whose content
    changed (`inputs`: input_digests now). Settings are compared as they resolve: paths as the directories or
    files they name (a packaged model's name as its file), the difficulty flags as the task's `difficulty`
    resolves them (None: its default)."""
    path = os.path.join(run_dir, "config.json")
    try:
        with open(path) as f:
            recorded = json.load(f)
        recorded_train = recorded["train"]
    except (OSError, ValueError, KeyError, TypeError):
        raise UserError(f"{path} is missing or unreadable: --resume cannot check what it continues; restore it, "
                        "or pass --run-name NAME for a new run") from None
    now_train, algo = dict(settings["train"]), settings["train"]["algo"]
    if algo not in recorded:
        raise UserError(f"--algo {algo}: {run_dir} was trained with --algo {recorded_train.get('algo')}")

    def same(key, a, b):
        if isinstance(a, str) and isinstance(b, str) and key in ("model", "data", "eval_data", "task"):
            return real_path(a) == real_path(b)
        return a == b

    if difficulty is not None:  # both sides resolved: "--numbers 2" is arithmetic's default, and never "None"
        keys = ("numbers", "low", "high")
        now_train.update(difficulty(*(now_train[key] for key in keys)))
        recorded_train = {**recorded_train, **difficulty(*(recorded_train.get(key) for key in keys))}

    def origin(key):
        return f"from {by_recipe[key]}; " if key in by_recipe else ""

    # A setting the run's config.json does not name came with a later minies: the run ran with its default.
    defaults = {f.name: f.default for config in configs for f in fields(config)}
    differences = [f"--{key.replace('_', '-')} {typed(now)} ({origin(key)}the run has "
                   f"{typed(recorded_part.get(key, defaults[key]))})"
                   for recorded_part, now_part in ((recorded_train, now_train), (recorded[algo], settings[algo]))
                   for key, now in now_part.items()
                   if key not in MAY_CHANGE_ON_RESUME and not same(key, now, recorded_part.get(key, defaults[key]))]
    if differences and recorded_train.get("recipe") not in (None, now_train["recipe"]):  # the flag that gives them back
        differences.append(f"the run was made with --recipe {recorded_train['recipe']}")
    changed = changed_inputs(recorded.get("inputs"), inputs or {})
    if changed and not differences:
        raise UserError(f"--resume continues {run_dir} on the files it read, but {'; '.join(changed)}; put the "
                        "run's file back, or pass --run-name NAME for a new run")
    if differences:
        raise UserError(f"--resume continues {run_dir} with its own settings, but this command differs: "
                        f"{'; '.join(differences)}; drop those flags, or pass --run-name NAME for a new run")


def real_path(name):
    """The file or directory a path names; a packaged model's name (smollm2-135m) names its GGUF file."""
    try:
        name = packaged_file(name)
    except UserError:  # not installed: the name stands for itself
        pass
    return os.path.realpath(os.path.expanduser(name))
