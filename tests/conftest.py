"""Shared fixtures: a small model directory (`tiny_model_dir`, alias `model_dir`), the model and tokenizer
loaded from it, and helpers that run the scripts (train.py, eval.py) in a subprocess the way a user would,
or in this interpreter when only their argument handling and error lines are under test."""
import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from minies.rollout import completion_logprobs
from minies.tasks import Arithmetic, Score

REPO = Path(__file__).resolve().parent.parent

# No network in tests: a hub id must fail at once instead of retrying.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# For the tests of CUDA-only paths (device placement, pinned memory): skipped on a machine without CUDA.
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def shipped_model_ready():
    from minies.models import SHIPPED_MODEL

    return all(os.path.exists(os.path.join(SHIPPED_MODEL, f))
               for f in ("config.json", "model.safetensors", "tokenizer.json"))


def tuned(config_class, algo, **options):
    """`config_class` with the shipped model's tuned values (its recipe `tiny`: the flags default to the papers'
    values, sized for real models), then `options` over them."""
    import dataclasses

    from minies.recipes import recipe_defaults

    fields = {f.name for f in dataclasses.fields(config_class)}
    return config_class(**{**recipe_defaults(["tiny"], algo, fields), **options})


def build_throwaway_model(out, steps=30, batch=32, seed=0):
    """A 2-layer version of the shipped model, warm-started for a few steps with make_tiny's own
    tokenizer, architecture and SFT batches: enough to emit the answer format and EOS. (make_tiny.main
    would also evaluate 3,200 samples at the end, which costs minutes on two cores.)"""
    from scripts import make_tiny

    task = Arithmetic()
    tok = make_tiny.build_tokenizer()
    model = make_tiny.build_model(tok, hidden=64, layers=2, seed=seed)
    make_tiny.sft(model, tok, task, task.train_problems(steps * batch, seed=seed + 1), batch, lr=1e-2)
    make_tiny.save(model, tok, out)
    return str(out)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The shipped tiny model when it is there, else a throwaway one built once per session.
    MINIES_TEST_MODEL=DIR tests another model directory; MINIES_TEST_MODEL=throwaway forces the throwaway."""
    from minies.models import SHIPPED_MODEL

    choice = os.environ.get("MINIES_TEST_MODEL")
    if choice and choice != "throwaway":
        return choice
    if shipped_model_ready() and choice != "throwaway":
        return SHIPPED_MODEL
    with single_thread():
        return build_throwaway_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def model_dir(tiny_model_dir):
    return tiny_model_dir


@pytest.fixture(autouse=True)
def threads_as_found():
    """Each test starts with the session's thread count and no load following. A test that runs train.main
    in this interpreter turns following on (set_up_process), and it would stay on for every later test: their
    thread counts would then follow the machine's load, and a float32 sum over a tensor, split by thread,
    can end in other last bits (an ES update's logged norm did, once, between two twins in one test)."""
    from minies.runtime import threads

    count = torch.get_num_threads()
    yield
    threads._follower = None
    torch.set_num_threads(count)


@contextlib.contextmanager
def single_thread():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture
def one_thread():
    """Tiny matmuls gain nothing from threads, and on a busy machine their spin-waits cost seconds."""
    with single_thread():
        yield


@pytest.fixture(scope="session")
def tokenizer(model_dir):
    from minies.models import load_tokenizer

    return load_tokenizer(model_dir)


@pytest.fixture(scope="session")
def model(model_dir):
    """float32 on the CPU. Shared by many tests: never modify it in place."""
    from minies.models import load_model

    return load_model(model_dir, device="cpu")


@pytest.fixture(scope="session")
def task():
    from minies.tasks import Arithmetic

    return Arithmetic()


class DenseArithmetic(Arithmetic):
    """Arithmetic plus a reward per character: groups almost never tie, so every step changes the
    policy, however weak the test model."""

    def score(self, completion, problem):
        s = super().score(completion, problem)
        return Score(s.reward + len(completion) / 10, s.correct, s.malformed)


def logps(model, r):
    """Log-probs [B, C] of the rollouts' completion tokens under `model` (with grad when it is enabled)."""
    return completion_logprobs(model, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask)


def no_grad_logps(model, r):
    with torch.no_grad():
        return logps(model, r)


def script_env():
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def start_script(script, *args):
    """Start `python <script> args...` from the repository root; returns the Popen."""
    return subprocess.Popen([sys.executable, str(REPO / script), *map(str, args)], cwd=REPO, env=script_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)


def finish(proc, timeout=300):
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"{proc.args} ran past {timeout}s\n{err[-3000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_script(script, *args, timeout=300):
    return finish(start_script(script, *args), timeout)


def run_in_process(script, *args):
    """Run a script's `if __name__ == "__main__"` block in this interpreter (no start-up cost) and return
    (exit status, stdout, stderr) as a subprocess would see them. Capture output with capsys."""
    import runpy

    saved = sys.argv
    sys.argv = [str(REPO / script), *map(str, args)]
    try:
        runpy.run_path(str(REPO / script), run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code
    finally:
        sys.argv = saved
    message = ""
    if isinstance(code, str):  # sys.exit("text"): the interpreter prints it to stderr and exits with 1
        code, message = 1, code + "\n"
    return code or 0, message


def assert_one_line_error(name, code, stderr, pattern=r"error: "):
    """A user error: exit status 2, no traceback, and a last stderr line matching `pattern`; returns that line."""
    err = stderr.strip()
    assert code == 2, f"{name}: exit status {code}\n{err[-3000:]}"
    assert "Traceback" not in err, f"{name}: traceback\n{err[-3000:]}"
    last = err.splitlines()[-1] if err else ""
    assert re.match(pattern, last), f"{name}: last stderr line is {last!r}"
    return last
