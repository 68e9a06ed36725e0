"""Checkpoints that survive a kill: each is written to a temporary directory, renamed into place, and
only then named in the `latest` file (itself replaced atomically). A kill at any moment leaves
`latest` naming a complete checkpoint, or no `latest` at all.

Layout of a run directory:
    log.jsonl               one JSON line per step
    latest                  name of the newest complete checkpoint, e.g. "step-000100"
    step-000100/            save_pretrained model + tokenizer, and training_state.pt
"""
import json
import os
import random
import re
import shutil

import numpy as np
import torch

from minies import UserError

STATE_FILE = "training_state.pt"


def rng_state():
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state):
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():  # on the GPUs that both the saving run and this one see
        for device, gpu_state in enumerate(state["cuda"][:torch.cuda.device_count()]):
            torch.cuda.set_rng_state(gpu_state, device)


def _write_text_atomic(path, text):
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save(run_dir, step, model, tokenizer, state, keep=2):
    """Write checkpoint `step` (model weights, tokenizer, and `state`: any picklable training
    state, e.g. the optimizer's) and drop all but the newest `keep` checkpoints."""
    name = f"step-{step:06d}"
    final, tmp = os.path.join(run_dir, name), os.path.join(run_dir, f".{name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    torch.save({"step": step, "rng": rng_state(), **state}, os.path.join(tmp, STATE_FILE))
    if os.path.exists(final):  # re-saving a step: move the old copy aside first, never delete it in place
        shutil.rmtree(f"{final}.old", ignore_errors=True)
        os.replace(final, f"{final}.old")
    os.replace(tmp, final)
    _write_text_atomic(os.path.join(run_dir, "latest"), name)
    shutil.rmtree(f"{final}.old", ignore_errors=True)
    old = sorted(d for d in os.listdir(run_dir) if d.startswith("step-") and d != name)
    for d in old[:max(0, len(old) - keep + 1)]:
        shutil.rmtree(os.path.join(run_dir, d), ignore_errors=True)
    return final


def _step_dirs(run_dir):
    """The checkpoint directories (step-NNNNNN) in `run_dir`, newest first."""
    names = [d for d in os.listdir(run_dir) if re.fullmatch(r"step-\d+", d)] if os.path.isdir(run_dir) else []
    return [os.path.join(run_dir, d) for d in sorted(names, key=lambda d: int(d[5:]), reverse=True)]


def has_checkpoint(run_dir):
    """Whether `run_dir` holds a checkpoint, or what is left of one (a `latest` pointer)."""
    return os.path.exists(os.path.join(run_dir, "latest")) or bool(_step_dirs(run_dir))


def latest(run_dir):
    """Path of the newest complete checkpoint in `run_dir` (the one `latest` names), or None."""
    try:
        with open(os.path.join(run_dir, "latest"), "rb") as f:
            name = f.read().decode().strip()
    except (OSError, UnicodeDecodeError):  # no pointer, or garbage in it
        return None
    path = os.path.join(run_dir, name)
    return path if re.fullmatch(r"step-\d+", name) and os.path.exists(os.path.join(path, STATE_FILE)) else None


def load_latest(run_dir):
    """(path, training state, what was skipped) of the newest checkpoint in `run_dir` whose state loads:
    the one `latest` names, else the newest step directory that loads (a file can be corrupted after
    it was written). `skipped` lists what did not load and why. A UserError when nothing loads."""
    pointer, named = os.path.join(run_dir, "latest"), latest(run_dir)
    skipped = [f"{pointer} does not name a complete checkpoint"] if os.path.exists(pointer) and not named else []
    for path in ([named] if named else []) + [d for d in _step_dirs(run_dir) if d != named]:
        try:
            return path, load_state(path), skipped
        except UserError as e:
            skipped.append(str(e))
    raise UserError(f"no checkpoint of {run_dir} loads ({'; '.join(skipped) or 'none left'}); "
                    f"delete {run_dir} to start the run again, or pass --run-name NAME for a new one")


def load_state(path):
    """The training state saved with a checkpoint, in host memory (each algorithm's load_state_dict copies it
    to where its tensors live, so a run resumes on other GPUs, or none, and no rank loads onto GPU 0);
    set_rng_state(state["rng"]) restores its RNGs."""
    file = os.path.join(path, STATE_FILE)
    try:
        return torch.load(file, weights_only=False, map_location="cpu")
    except FileNotFoundError:
        raise UserError(f"{path}: not a minies checkpoint (no {STATE_FILE}); point --resume at a run directory")
    except Exception as e:  # a truncated or overwritten file fails in many ways: unpickling, zip, EOF
        reason = ": ".join(filter(None, [type(e).__name__, str(e).strip().split("\n")[0][:100]]))
        raise UserError(f"{file} does not load ({reason})")


def truncate_log(path, step):
    """Keep only the log lines up to `step` (a resumed run repeats the steps after its checkpoint)."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        kept = [line for line in f if line.strip() and json.loads(line)["step"] <= step]
    _write_text_atomic(path, "".join(kept))
