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
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


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


def latest(run_dir):
    """Path of the newest complete checkpoint in `run_dir`, or None."""
    pointer = os.path.join(run_dir, "latest")
    if not os.path.exists(pointer):
        return None
    with open(pointer) as f:
        path = os.path.join(run_dir, f.read().strip())
    return path if os.path.exists(os.path.join(path, STATE_FILE)) else None


def load_state(path):
    """The training state saved with a checkpoint (restores the RNGs as a side effect)."""
    try:
        state = torch.load(os.path.join(path, STATE_FILE), weights_only=False)
    except FileNotFoundError:
        raise UserError(f"{path}: not a minies checkpoint (no {STATE_FILE}); point --resume at a run directory")
    set_rng_state(state["rng"])
    return state


def truncate_log(path, step):
    """Keep only the log lines up to `step` (a resumed run repeats the steps after its checkpoint)."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        kept = [line for line in f if line.strip() and json.loads(line)["step"] <= step]
    _write_text_atomic(path, "".join(kept))
