"""Checkpoints that survive a kill: each is written to a temporary directory, renamed into place, and
only then named in the `latest` file (itself replaced atomically). A kill at any moment leaves
`latest` naming a complete checkpoint, or no `latest` at all.

Layout of a run directory:
    config.json             every setting as resolved, the recipes applied, the sha256 of each file read
    run.lock                while a process runs it: that process's pid and host (minies/runtime/run_lock.py)
    log.jsonl               one JSON line per step
    latest                  name of the newest complete checkpoint, e.g. "step-000100"
    step-000100/            save_pretrained model + tokenizer, and training_state.pt
"""
import contextlib
import json
import os
import random
import re
import shutil

import numpy as np
import torch
from safetensors import SafetensorError

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
    state, e.g. the optimizer's) and drop all but the newest `keep` checkpoints. A write that fails (a full
    disk, a file-size limit) removes what it wrote and raises a UserError naming the file: the checkpoints
    before it are untouched."""
    name = f"step-{step:06d}"
    final, tmp = os.path.join(run_dir, name), os.path.join(run_dir, f".{name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    writes = [("model.safetensors", lambda: model.save_pretrained(tmp)),
              ("tokenizer.json", lambda: tokenizer.save_pretrained(tmp)),
              (STATE_FILE, lambda: torch.save({"step": step, "rng": rng_state(), **state}, os.path.join(tmp, STATE_FILE)))]
    for main_file, write in writes:
        try:
            write()
        except (OSError, RuntimeError, SafetensorError) as e:  # torch.save's full disk: RuntimeError("unexpected pos")
            file = getattr(e, "filename", None) or os.path.join(tmp, main_file)
            shutil.rmtree(tmp, ignore_errors=True)
            previous = latest(run_dir)
            kept = f"the previous checkpoint {previous} is intact" if previous else "no checkpoint was written"
            raise UserError(f"could not write {file} ({_reason(e)}); {kept}; a checkpoint needs about "
                            f"{_megabytes(model, state)} MB free in {run_dir}") from None
    if os.path.exists(final):  # re-saving a step: move the old copy aside first, never delete it in place
        shutil.rmtree(f"{final}.old", ignore_errors=True)
        os.replace(final, f"{final}.old")
    os.replace(tmp, final)
    _write_text_atomic(os.path.join(run_dir, "latest"), name)
    shutil.rmtree(f"{final}.old", ignore_errors=True)
    older = [d for d in _step_dirs(run_dir) if d != final]  # newest first, by number: step-1000000 after step-999999
    leftovers = [os.path.join(run_dir, d) for d in os.listdir(run_dir) if re.fullmatch(r"step-\d+\.old", d)]
    for d in older[keep - 1:] + leftovers:  # and the copies a kill in mid-save left aside
        shutil.rmtree(d, ignore_errors=True)
    return final


def _reason(e):
    text = e.strerror if isinstance(e, OSError) and e.strerror else str(e).strip().splitlines()[0][:100]
    return "no space left on the device, or a file-size limit" if "unexpected pos" in text else text


def _megabytes(model, state):
    """The size of a checkpoint: the model's weights and the tensors of the training state, in MB."""
    def tensor_bytes(value):
        if isinstance(value, torch.Tensor):
            return value.numel() * value.element_size()
        if isinstance(value, dict):
            return sum(tensor_bytes(v) for v in value.values())
        if isinstance(value, (list, tuple)):
            return sum(tensor_bytes(v) for v in value)
        return 0
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return max(1, round((weights + tensor_bytes(state)) / 1e6))


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
    """(path, training state, what was skipped) of the newest complete checkpoint in `run_dir`: the one `latest`
    names, else the newest step directory whose every part loads (a file can be lost or corrupted after it
    was written). `skipped` lists what did not load and why. A UserError when nothing loads."""
    pointer, named = os.path.join(run_dir, "latest"), latest(run_dir)
    skipped = [f"{pointer} does not name a complete checkpoint"] if os.path.exists(pointer) and not named else []
    for path in ([named] if named else []) + [d for d in _step_dirs(run_dir) if d != named]:
        try:
            check_model_files(path)
            return path, load_state(path), skipped
        except UserError as e:
            skipped.append(str(e))
    raise UserError(f"no checkpoint of {run_dir} loads ({'; '.join(skipped) or 'none left'}); "
                    f"delete {run_dir} to start the run again, or pass --run-name NAME for a new one")


STATE_KEYS = ("step", "rng")  # what save() writes into every training state, beside the caller's


def load_state(path):
    """The training state saved with a checkpoint, in host memory (each algorithm's load_state_dict copies it
    to where its tensors live, so a run resumes on other GPUs, or none, and no rank loads onto GPU 0);
    set_rng_state(state["rng"]) restores its RNGs."""
    file = os.path.join(path, STATE_FILE)
    try:
        state = torch.load(file, weights_only=False, map_location="cpu")
    except FileNotFoundError:
        raise UserError(f"{path}: not a minies checkpoint (no {STATE_FILE}); point --resume at a run directory")
    except Exception as e:  # a truncated or overwritten file fails in many ways: unpickling, zip, EOF
        reason = ": ".join(filter(None, [type(e).__name__, str(e).strip().split("\n")[0][:100]]))
        raise UserError(f"{file} does not load ({reason})")
    missing = [key for key in STATE_KEYS if not isinstance(state, dict) or key not in state]
    if missing or not isinstance(state["rng"], dict) or not isinstance(state["step"], int):
        raise UserError(f"{file} does not hold a minies training state (missing: {', '.join(missing) or 'rng, step'})")
    return state


def check_model_files(path):
    """A UserError unless checkpoint `path` holds a readable config.json and complete weights (safetensors
    headers whose data is all there; the bytes themselves are read when the model loads)."""
    from safetensors import safe_open

    try:
        with open(os.path.join(path, "config.json"), "rb") as f:
            json.loads(f.read().decode("utf-8"))
        index = os.path.join(path, "model.safetensors.index.json")
        files = ["model.safetensors"]
        if os.path.exists(index):
            with open(index) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        for name in files:
            with safe_open(os.path.join(path, name), framework="pt") as weights:
                weights.keys()
    except Exception as e:  # missing, truncated, not JSON, a bad header: each fails its own way
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e).strip().split("\n")[0][:100]
        raise UserError(f"{path}: its model does not load ({type(e).__name__}: {reason})")


def truncate_log(path, step):
    """Keep only the log lines up to `step` (a resumed run repeats the steps after its checkpoint). A line that
    is not a JSON log row (a crash in mid-write leaves half of one) is dropped; returns a warning per line."""
    if os.path.isdir(path):
        raise UserError(f"{path} is a directory, not the run's log; move it away and resume again")
    if not os.path.exists(path):
        return [f"{path} is missing: the log of steps 1..{step} is gone, and it restarts at step {step + 1}"]
    kept, dropped = [], []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                line, row = raw.decode("utf-8"), json.loads(raw)
                if row["step"] <= step:
                    kept.append(renamed_keys(line, row))
            except (ValueError, KeyError, TypeError):
                if raw.strip():
                    dropped.append(f"{path} line {number} is not a log row (a write cut short?): dropped it")
    _write_text_atomic(path, "".join(kept))
    return dropped


# Log keys renamed since runs were logged: old name -> new. A resumed run's log is rewritten with the new names, so
# that one key runs through all of its rows (IVON's posterior std is s, as in docs/papers.md: σ is ES's).
RENAMED_LOG_KEYS = {"sigma_mean": "s_mean"}


def renamed_keys(line, row):
    """Log line `line` (its JSON: `row`) with the keys RENAMED_LOG_KEYS renames, else as it is; ending in a newline."""
    if not RENAMED_LOG_KEYS.keys() & row.keys():
        return line if line.endswith("\n") else line + "\n"
    return json.dumps({RENAMED_LOG_KEYS.get(key, key): value for key, value in row.items()}) + "\n"


@contextlib.contextmanager
def written(path, opened=None):
    """Open `path` for writing (or use the already `opened` file); a full disk or a file-size limit becomes one
    line naming the file."""
    try:
        if opened is not None:
            yield opened
        else:
            with open(path, "w") as f:
                yield f
    except OSError as e:
        raise UserError(f"could not write {path} ({e.strerror}); free some space and pass --resume to continue "
                        "from the last checkpoint") from None
