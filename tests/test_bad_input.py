"""Bad input ends with one "error: ..." line and exit status 2, never a traceback, and never a run that
silently does something else; checkpoints that do not load, a run that diverges, impossible pass@k counts."""
import json
import math
import shutil

import numpy as np
import pytest
import torch

from conftest import assert_one_line_error, finish, run_in_process, single_thread, start_script
from minies.runtime import checkpoint
from minies.runtime.guard import Diverged, check_finite, check_weights
from minies.metrics import pass_at_k

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["--population", 4, "--prompts-per-step", 4, "--eval-problems", 4, "--final-samples", 2, "--eval-every", 0]
RUN = "es-arithmetic-seed0"

# name -> (script, arguments, what the error line must mention). Every row also gets --model (the test
# model, unless the row names another) and, for train.py, --out in the test's own directory.
BAD = {
    # Tracebacks before.
    "train: --alpha nan": ("train.py", ["--alpha", "nan"], "--alpha"),
    "train grpo: --lr nan": ("train.py", ["--algo", "grpo", "--lr", "nan"], "--lr"),
    "train b3po: --lr nan": ("train.py", ["--algo", "b3po", "--lr", "nan"], "--lr"),
    "train: --save-every 0": ("train.py", ["--save-every", 0], "--save-every"),
    "train: --keep-checkpoints 0": ("train.py", ["--keep-checkpoints", 0], "--keep-checkpoints"),
    "train: --prompts-per-step 0": ("train.py", ["--prompts-per-step", 0], "--prompts-per-step"),
    "train: --eval-problems 0": ("train.py", ["--eval-problems", 0], "--eval-problems"),
    "eval: --problems 0": ("eval.py", ["--problems", 0], "--problems"),
    "train: --temperature nan": ("train.py", ["--temperature", "nan"], "--temperature"),
    "eval: --temperature nan": ("eval.py", ["--temperature", "nan"], "--temperature"),
    "train grpo: --temperature -1": ("train.py", ["--algo", "grpo", "--temperature", -1], "--temperature"),
    "eval: --temperature -1": ("eval.py", ["--temperature", -1], "--temperature"),
    "train: --micro-batch 0": ("train.py", ["--micro-batch", 0], "--micro-batch"),
    "eval: --micro-batch 0": ("eval.py", ["--micro-batch", 0], "--micro-batch"),
    "train: --out under a regular file": ("train.py", ["--out", "{file}/sub"], "is a file, not a directory"),
    "eval: --out under a regular file": ("eval.py", ["--n", 1, "--k", 1, "--out", "{file}/sub/x.json"],
                                          "is a file, not a directory"),
    "eval: --out is a directory": ("eval.py", ["--n", 1, "--k", 1, "--out", "{tmp}"], "--out"),
    # Ran silently before (and did something else than asked).
    "train: --steps -1": ("train.py", ["--steps", -1], "--steps"),
    "train: --steps 0": ("train.py", ["--steps", 0], "--steps"),
    "train: --sigma -1": ("train.py", ["--sigma", -1], "--sigma"),
    "eval: --problems -1": ("eval.py", ["--problems", -1], "--problems"),
    "train: --data for a task without data": ("train.py", ["--data", "{file}", "--steps", 1, *TINY], "--data"),
    # Were one-line errors already.
    "eval: missing model": ("eval.py", ["--model", "{tmp}/no-such-model", "--n", 1, "--k", 1], "no such directory"),
    "train: missing model": ("train.py", ["--model", "{tmp}/no-such-model"], "no such directory"),
    "train: missing relative model path": ("train.py", ["--model", "does/not/exist"], "--model does/not/exist: no such directory"),
    "train: missing model beside a run": ("train.py", ["--model", "{tmp}/no-such-model", "--steps", 2, "--out", "{trained}"],
                                          "no-such-model: no such directory"),
    "eval: bad dtype": ("eval.py", ["--dtype", "float8", "--n", 1, "--k", 1], "--dtype"),
    "train: bad dtype": ("train.py", ["--dtype", "float8"], "--dtype"),
    "train: unknown algorithm": ("train.py", ["--algo", "nope"], "--algo"),
    "train: unknown task": ("train.py", ["--task", "nope"], "--task"),
    "eval: unknown task": ("eval.py", ["--task", "nope"], "--task"),
    "eval: k above n": ("eval.py", ["--n", 2, "--k", 1, 4], "--k"),
    "eval: k not a number": ("eval.py", ["--k", "one"], "--k"),
    "train: run exists without --resume": ("train.py", ["--steps", 2, "--out", "{trained}"], "--resume"),
    "train: --population 3 with antithetic": ("train.py", ["--population", 3, *TINY[2:]], "--population"),
    "train grpo: --group-size 1": ("train.py", ["--algo", "grpo", "--group-size", 1], "--group-size"),
    "train c3po: --chunks 3": ("train.py", ["--algo", "c3po", "--chunks", 3], "--chunks"),
    # Ran silently before: an empty path meant the default model, or the current directory.
    "train: --model ''": ("train.py", ["--model", ""], "--model: empty"),
    "eval: --model ''": ("eval.py", ["--model", "", "--n", 1, "--k", 1], "--model: empty"),
    "train: --out ''": ("train.py", ["--out", ""], "--out: empty"),
    "eval: --out ''": ("eval.py", ["--n", 1, "--k", 1, "--out", ""], "--out: empty"),
    # Tracebacks or hangs before: sizes past an int64, numbers past float32's largest.
    "train: --max-new-tokens 10**30": ("train.py", ["--max-new-tokens", 10**30], "--max-new-tokens"),
    "train: --train-problems 10**30": ("train.py", ["--train-problems", 10**30], "--train-problems"),
    "train: --rank 10**30": ("train.py", ["--mode", "lowrank", "--rank", 10**30], "--rank"),
    "train grpo: --lora-rank 10**30": ("train.py", ["--algo", "grpo", "--lora-rank", 10**30], "--lora-rank"),
    "train c3po: --hess-init 1e308": ("train.py", ["--algo", "c3po", "--hess-init", "1e308"], "--hess-init"),
    "train c3po: --clip-radius 1e308": ("train.py", ["--algo", "c3po", "--clip-radius", "1e308"], "--clip-radius"),
    # More.
    "train: --steps abc": ("train.py", ["--steps", "abc"], "--steps"),
    "train: --eval-samples 0": ("train.py", ["--eval-samples", 0], "--eval-samples"),
    "train: --final-samples 0": ("train.py", ["--final-samples", 0], "--final-samples"),
    "train: --seed -1": ("train.py", ["--seed", -1], "--seed"),
    "train: --population 0": ("train.py", ["--population", 0], "--population"),
    "train: --alpha inf": ("train.py", ["--alpha", "inf"], "--alpha"),
    # A negative number in exponent or inf form is the flag's value, not an unknown flag.
    "train: --alpha -inf": ("train.py", ["--alpha", "-inf"], "--alpha: -inf is not a number in"),
    "train: --sigma -1e-3": ("train.py", ["--sigma", "-1e-3"], "--sigma: -1e-3 is not a number in"),
    "train: --rank 0": ("train.py", ["--mode", "lowrank", "--rank", 0], "--rank"),
    "train grpo: --prompts 0": ("train.py", ["--algo", "grpo", "--prompts", 0], "--prompts"),
    "train grpo: --beta -1": ("train.py", ["--algo", "grpo", "--beta", -1], "--beta"),
    "train grpo: --epsilon-low 1.5": ("train.py", ["--algo", "grpo", "--epsilon-low", 1.5], "--epsilon-low"),
    "train grpo: --max-grad-norm 0": ("train.py", ["--algo", "grpo", "--max-grad-norm", 0], "--max-grad-norm"),
    "train grpo: --max-grad-norm nan": ("train.py", ["--algo", "grpo", "--max-grad-norm", "nan"], "--max-grad-norm"),
    "train grpo: --lora-rank -1": ("train.py", ["--algo", "grpo", "--lora-rank", -1], "--lora-rank"),
    "train m3po: --samples 0": ("train.py", ["--algo", "m3po", "--samples", 0], "--samples"),
    "train c3po: --beta2 1": ("train.py", ["--algo", "c3po", "--beta2", 1], "--beta2"),
    "train c3po: --ess 0": ("train.py", ["--algo", "c3po", "--ess", 0], "--ess"),
    "eval: --n -1": ("eval.py", ["--n", -1], "--n"),
    "eval: --k 0": ("eval.py", ["--k", 0], "--k"),
    "eval: --seed -1": ("eval.py", ["--seed", -1], "--seed"),
    # Tracebacks, hangs or silently something else, before (the issue "nothing lost, nothing mixed").
    "train: --seed 2**32": ("train.py", ["--seed", 2**32], "--seed"),
    "train: --run-name ../x": ("train.py", ["--run-name", "../x"], "--run-name"),
    "train: --run-name .": ("train.py", ["--run-name", "."], "--run-name"),
    "eval: --n 10**20": ("eval.py", ["--n", 10**20], "--n"),
    "train grpo: --prompts 10**7": ("train.py", ["--algo", "grpo", "--prompts", 10**7], "--prompts"),
    "train grpo: --prompts × --group-size over a million": ("train.py", ["--algo", "grpo", "--prompts", 2000,
                                                                          "--group-size", 1000], "--prompts"),
    "train grpo: --temperature 1e-40": ("train.py", ["--algo", "grpo", "--temperature", "1e-40"], "--temperature"),
    "eval: --temperature 1e-40": ("eval.py", ["--temperature", "1e-40"], "--temperature"),
    "train grpo: --epsilon-high 1e308": ("train.py", ["--algo", "grpo", "--epsilon-high", "1e308"], "--epsilon-high"),
    "train c3po: --ess 1e-300": ("train.py", ["--algo", "c3po", "--ess", "1e-300"], "--ess"),
    "train c3po: --ratio-keep-min above --ratio-keep-max": ("train.py", ["--algo", "c3po", "--ratio-keep-min", 3,
                                                                        "--ratio-keep-max", 0.5], "--ratio-keep-min"),
    "train grpo: --lora-alpha without --lora-rank": ("train.py", ["--algo", "grpo", "--lora-alpha", 32], "--lora-alpha"),
    "train: --max-weight-growth 0": ("train.py", ["--max-weight-growth", 0], "--max-weight-growth"),
    "eval: --lenient-answers on arithmetic": ("eval.py", ["--lenient-answers", "--n", 1, "--k", 1], "--lenient-answers"),
    "eval: --out newdir/": ("eval.py", ["--n", 1, "--k", 1, "--out", "{tmp}/newdir/"], "--out"),
    "train: JSON nested too deeply": ("train.py", ["--task", "countdown", "--data", "{deep}", *TINY], "nested too deeply"),
    "train: a key twice in a row": ("train.py", ["--task", "countdown", "--data", "{twice}", *TINY], "appears twice"),
    "train: nums and numbers in a row": ("train.py", ["--task", "countdown", "--data", "{both}", *TINY],
                                         '"numbers" and "nums"'),
    "train: no solvable training problem": ("train.py", ["--task", "countdown", "--data", "{unsolvable}", *TINY],
                                            "no training problem can be solved"),
    "eval: a model missing a weight": ("eval.py", ["--model", "{damaged}", "--n", 1, "--k", 1], "do not fit"),
    "train: a model naming an unknown recipe": ("train.py", ["--model", "{unknown_recipe}"], "minies_recipe"),
    "train: --params (": ("train.py", ["--params", "("], "--params"),
    "train: --population 1 --no-antithetic": ("train.py", ["--population", 1, "--no-antithetic"], "--population"),
    "train: --prompts-per-step 10**11": ("train.py", ["--prompts-per-step", 10**11], "--prompts-per-step"),
    "train: lowrank --population 10**11": ("train.py", ["--mode", "lowrank", "--population", 10**11], "--population"),
    "train: --population × --prompts-per-step over a million": ("train.py", ["--population", 2000,
                                                                             "--prompts-per-step", 1000], "--population"),
}

# Found by the algorithm at its first step, after the "before" evaluation made the run directory (a rerun
# starts such a run again: see test_a_run_without_checkpoint_starts_again).


def _files(tmp, model):
    """The bad files some rows point at, written into `tmp`."""
    (tmp / "a-file").write_text("not a directory\n")
    good = '{"nums": [1, 2], "target": 3}\n{"nums": [2, 2], "target": 4}\n'
    (tmp / "deep.json").write_text("[" * 100000 + "]" * 100000)
    (tmp / "twice.jsonl").write_text(good + '{"nums": [1, 2], "nums": [3, 4], "target": 7}\n')
    (tmp / "both.jsonl").write_text(good + '{"nums": [1, 2], "numbers": [3, 4], "target": 7}\n')
    (tmp / "unsolvable.jsonl").write_text("".join(json.dumps({"nums": [1, 1], "target": 90 + i}) + "\n" for i in range(8)))
    from safetensors.torch import load_file, save_file
    damaged = tmp / "damaged"
    shutil.copytree(model, damaged, dirs_exist_ok=True)
    weights = load_file(damaged / "model.safetensors")
    weights.pop(next(k for k in weights if "layers.0.mlp" in k))
    save_file(weights, damaged / "model.safetensors", metadata={"format": "pt"})
    unknown = tmp / "unknown-recipe"
    shutil.copytree(model, unknown, dirs_exist_ok=True)
    config = json.loads((unknown / "config.json").read_text())
    (unknown / "config.json").write_text(json.dumps({**config, "minies_recipe": "bogus"}))
    return {"file": tmp / "a-file", "tmp": tmp, "deep": tmp / "deep.json", "twice": tmp / "twice.jsonl",
            "both": tmp / "both.jsonl", "unsolvable": tmp / "unsolvable.jsonl", "damaged": damaged,
            "unknown_recipe": unknown}


def _args(name, model, tmp, **values):
    script, args, _ = BAD[name]
    values = {**_files(tmp, model), **values}
    extra = ["--model", model] + (["--out", tmp / "out"] if script == "train.py" else [])
    return script, [str(a).format(**values) for a in extra + args]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, model_dir):
    """The out directory of a 2-step ES run that saved after each step (step-000001 and step-000002)."""
    out = tmp_path_factory.mktemp("trained")
    with single_thread():  # a module fixture is set up before the one_thread of the first test
        code, _ = run_in_process("train.py", "--model", model_dir, "--out", out, "--steps", 2, "--save-every", 1,
                                 *TINY)
    assert code == 0
    return out


def test_keep_checkpoints_keeps_the_newest(tmp_path, model_dir, trained):
    """--keep-checkpoints k: each save deletes all but the newest k checkpoints (the default keeps 2); it may change
    on --resume."""
    assert sorted(d.name for d in (trained / RUN).glob("step-*")) == ["step-000001", "step-000002"]
    out = tmp_path / "out"
    shutil.copytree(trained, out)
    code, _ = run_in_process("train.py", "--model", model_dir, "--out", out, "--steps", 4, "--save-every", 1,
                             "--keep-checkpoints", 1, "--resume", *TINY)
    assert code == 0 and sorted(d.name for d in (out / RUN).glob("step-*")) == ["step-000004"]


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input(name, tmp_path, model_dir, trained, capsys):
    script, args = _args(name, model_dir, tmp_path, trained=trained)
    code, message = run_in_process(script, *args)
    last = assert_one_line_error(name, code, capsys.readouterr().err + message)
    assert BAD[name][2] in last, f"{name}: {last!r}"
    assert not (tmp_path / "out").exists(), f"{name}: wrote a run directory"


def test_bad_input_in_a_subprocess(tmp_path, model_dir):
    names = ["train: --alpha nan", "eval: --problems 0", "train: --out under a regular file", "eval: missing model"]
    procs = {}
    for name in names:
        script, args = _args(name, model_dir, tmp_path)
        procs[name] = start_script(script, *args)
    for name, proc in procs.items():
        r = finish(proc)
        last = assert_one_line_error(name, r.returncode, r.stderr)
        assert BAD[name][2] in last


def test_help_shows_the_ranges(capsys):
    run_in_process("train.py", "--algo", "grpo", "--help")
    out = " ".join(capsys.readouterr().out.split())
    assert "learning rate; a number in (0, 3.4e38] (default: 0.0001; recipe tiny)" in out
    assert "a number in (0, 3.4e38], or inf (default: 1.0; 3PO paper's RL stage" in out


def _copy(trained, tmp_path):
    run = tmp_path / RUN
    shutil.copytree(trained / RUN, run)
    return run


def _steps(run):
    return [json.loads(line)["step"] for line in (run / "log.jsonl").read_text().splitlines()]


def _resume(run, model_dir, *extra):
    return run_in_process("train.py", "--model", model_dir, "--out", run.parent, "--steps", 3, "--save-every", 1,
                          *TINY, *extra)


@pytest.mark.parametrize("damage, skipped, resumed", [
    ("state", "step-000002/training_state.pt does not load", "step-000001"),
    ("latest", "latest does not name a complete checkpoint", "step-000002"),
])
def test_resume_skips_what_does_not_load(damage, skipped, resumed, tmp_path, model_dir, trained, capsys):
    run = _copy(trained, tmp_path)
    if damage == "state":
        (run / "step-000002" / "training_state.pt").write_bytes(b"\x80\x04garbage, not a pickle")
    else:
        (run / "latest").write_bytes(b"\xff\xfe\x00\x9c garbage")
    code, _ = _resume(run, model_dir, "--resume")
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    warning = next(line for line in err.splitlines() if line.startswith("warning:"))
    assert skipped in warning and warning.endswith(f"resuming from {run / resumed}")
    assert _steps(run) == [1, 2, 3]
    assert (run / "latest").read_text() == "step-000003"


def test_resume_when_no_checkpoint_loads(tmp_path, model_dir, trained, capsys):
    run = _copy(trained, tmp_path)
    for step in ("step-000001", "step-000002"):
        (run / step / "training_state.pt").write_bytes(b"garbage")
    (run / "latest").write_bytes(b"\xff\xfe")
    code, message = _resume(run, model_dir, "--resume")
    last = assert_one_line_error("no checkpoint loads", code, capsys.readouterr().err + message)
    assert "training_state.pt does not load" in last and "--run-name" in last


@pytest.mark.parametrize("resume", [[], ["--resume"]])
def test_a_run_without_checkpoint_starts_again(resume, tmp_path, model_dir, trained, capsys):
    """A run killed after its first evaluation, before its first checkpoint."""
    run = _copy(trained, tmp_path)
    for entry in ("step-000001", "step-000002", "latest", "summary.json"):
        shutil.rmtree(run / entry) if (run / entry).is_dir() else (run / entry).unlink()
    (run / "log.jsonl").write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n{"step": 4}\n')
    code, _ = _resume(run, model_dir, *resume)
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    # --resume under the default run name also says what that name is made of.
    looked = (f" (--resume looks for {run.parent / '<algo>-<task>-seed<seed>'}: --algo es, --task arithmetic, "
              "--seed 0; --run-name NAME resumes a run of another name)") if resume else ""
    assert f"note: {run} has no checkpoint; starting it from step 0{looked}" in err.splitlines()
    assert _steps(run) == [1, 2, 3]  # the stale log is gone


def test_resume_says_which_run_it_looked_for(tmp_path, model_dir, trained, capsys):
    """--resume --model of a shipped model whose recipe sets another task looks for another run: it says which,
    and where the task came from."""
    from minies.models import SHIPPED_MODELS

    run = _copy(trained, tmp_path)
    code, _ = run_in_process("train.py", "--model", SHIPPED_MODELS["countdown"], "--out", run.parent, "--steps", 1, *TINY,
                             "--resume")
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    assert (f"note: {run.parent / 'es-countdown-seed0'} has no checkpoint; starting it from step 0 (--resume looks "
            f"for {run.parent / '<algo>-<task>-seed<seed>'}: --algo es, --task countdown from recipe tiny-countdown, "
            "--seed 0; --run-name NAME resumes a run of another name)") in err.splitlines()


def test_out_in_missing_directories_is_created(tmp_path, model_dir):
    code, _ = run_in_process("eval.py", "--model", model_dir, "--problems", 2, "--n", 1, "--k", 1,
                             "--out", tmp_path / "a" / "b" / "x.json")
    assert code == 0 and (tmp_path / "a" / "b" / "x.json").exists()


def _nan_update(monkeypatch, step):
    """ES's third update is NaN (α = nan); the rewards never tie, so that there is an update."""
    from minies import es
    monkeypatch.setattr(es, "normalize_rewards", lambda rewards, how: np.linspace(-0.5, 0.5, len(rewards)))
    original, calls = es.ES.step, []

    def nan_step(self, problems, seed):
        calls.append(seed)
        if len(calls) == step:
            self.config.alpha = math.nan
        return original(self, problems, seed)
    monkeypatch.setattr(es.ES, "step", nan_step)


def _nan_weight(monkeypatch, step):
    """A weight becomes NaN in the third step, after the algorithm's own checks: train.py's check catches it."""
    from minies import es
    original, calls = es.ES.step, []

    def nan_step(self, problems, seed):
        stats = original(self, problems, seed)
        calls.append(seed)
        if len(calls) == step:
            next(self.model.parameters()).data[0, 0] = math.nan
        return stats
    monkeypatch.setattr(es.ES, "step", nan_step)


def _nan_loss(monkeypatch, step):
    """GRPO's third batch of advantages is NaN: its loss is, and the optimizer must not step."""
    from minies import grpo
    original, calls = grpo.group_advantages, []

    def nan_advantages(rewards, scale="group", eps=1e-4):
        calls.append(1)
        return original(rewards, scale, eps) * (math.nan if len(calls) == step else 1)
    monkeypatch.setattr(grpo, "group_advantages", nan_advantages)


@pytest.mark.parametrize("inject, algo, what", [
    (_nan_update, ["--algo", "es", *TINY[:4]], "the update of"),
    (_nan_weight, ["--algo", "es", *TINY[:4]], "a weight of the model"),
    (_nan_loss, ["--algo", "grpo", "--prompts", 2, "--group-size", 2], "the loss"),
])
def test_divergence_stops_the_run_and_keeps_the_last_good_checkpoint(inject, algo, what, tmp_path, model_dir,
                                                                      monkeypatch, capsys):
    inject(monkeypatch, 3)
    code, message = run_in_process("train.py", *algo, "--model", model_dir, "--out", tmp_path, "--steps", 5,
                                   "--save-every", 1, "--eval-problems", 4, "--final-samples", 2, "--eval-every", 0)
    last = assert_one_line_error("divergence", code, capsys.readouterr().err + message)
    assert last.startswith("error: step 3: ") and what in last and "--lr/--alpha" in last
    run = next(tmp_path.iterdir())
    assert (run / "latest").read_text() == "step-000002"
    assert _steps(run) == [1, 2]
    good = checkpoint.latest(str(run))
    state = checkpoint.load_state(good)
    for t in state["algorithm"].get("master", []) + list(state["algorithm"].get("weights", {}).values()):
        assert torch.isfinite(t).all()
    from minies.models import load_model
    check_weights(load_model(good, device="cpu"))


def test_guard():
    check_finite("x", 1.0)
    check_finite("x", torch.ones(3))
    for bad in (math.nan, math.inf, torch.tensor([1.0, math.nan])):
        with pytest.raises(Diverged, match="x is not finite"):
            check_finite("x", bad)
    assert str(Diverged("the loss", 7)).startswith("step 7: the loss is not finite")
    model = torch.nn.Linear(2, 2)
    check_weights(model)
    with torch.no_grad():
        model.bias[1] = 5.0
    check_weights(model, bound=5.0)
    with pytest.raises(Diverged, match="grew to 5, past --max-weight-growth"):
        check_weights(model, bound=4.0)
    with torch.no_grad():
        model.bias[1] = math.inf
    with pytest.raises(Diverged, match="weight"):
        check_weights(model)


@pytest.mark.parametrize("n, c, k", [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, -1), (4.0, 2, 1), (4, 2.0, 1),
                                     (4, 2, 1.0), (4, 2, 5), ("4", 2, 1)])
def test_pass_at_k_rejects_impossible_counts(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_pass_at_k_accepts_numpy_integers():
    assert pass_at_k(np.int64(4), np.int32(2), 1) == pytest.approx(0.5)


# ---- --resume continues the same run, from its newest complete checkpoint ----

@pytest.mark.parametrize("flags, mention", [
    (["--sigma", 0.01], "--sigma 0.01 (the run has 0.008)"),
    (["--population", 6], "--population 6 (the run has 4)"),
    (["--mode", "lowrank"], "--mode lowrank (the run has inplace)"),
    (["--params", ".*"], "--params .* (the run has embed_tokens"),
    (["--dtype", "bfloat16"], "--dtype bfloat16 (the run has float32)"),
    (["--seed", 1, "--run-name", RUN], "--seed 1 (the run has 0)"),
    (["--task", "countdown", "--run-name", RUN], "--task countdown (the run has arithmetic)"),
    (["--algo", "grpo", "--run-name", RUN], "--algo grpo: "),
    (["--steps", 1], "--steps 1: "),
    (["--recipe", "tiny-countdown", "--run-name", RUN], "--task countdown (from recipe tiny-countdown; the run has "
                                                        "arithmetic)"),
])
def test_resume_refuses_other_settings(flags, mention, tmp_path, model_dir, trained, capsys):
    run = _copy(trained, tmp_path)
    log, latest = (run / "log.jsonl").read_text(), (run / "latest").read_text()
    tiny = TINY if "grpo" not in flags else TINY[4:]
    code, message = run_in_process("train.py", "--model", model_dir, "--out", run.parent, "--steps", 3, *tiny,
                                   "--resume", *flags)
    last = assert_one_line_error(f"resume with {flags}", code, capsys.readouterr().err + message)
    assert mention in last, last
    assert (run / "log.jsonl").read_text() == log and (run / "latest").read_text() == latest


def test_resume_compares_what_a_recipe_resolves_to(tmp_path, model_dir, trained, capsys):
    """--recipe itself is not compared, the values it sets are: naming the model's own recipe changes nothing, and
    a refusal says which of the values it lists came from a recipe rather than from the command line."""
    run = _copy(trained, tmp_path)
    code, message = _resume(run, model_dir, "--resume", "--recipe", "tiny-countdown", "--run-name", RUN,
                            "--sigma", 0.01)
    last = assert_one_line_error("resume with another recipe", code, capsys.readouterr().err + message)
    assert "--sigma 0.01 (the run has 0.008)" in last and "--alpha 0.03 (from recipe tiny-countdown; the run has 0.01)" in last
    assert "--params .* (from recipe tiny-countdown; the run has embed_tokens" in last and "--recipe" not in last
    code, _ = _resume(run, model_dir, "--resume", "--recipe", "tiny")  # the shipped model's own recipe
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    assert _steps(run) == [1, 2, 3]


def test_resume_without_the_runs_recipe_names_it(tmp_path, model_dir, trained, capsys):
    run = _copy(trained, tmp_path)
    config = json.loads((run / "config.json").read_text())
    config["train"]["recipe"], config["es"]["alpha"] = "tiny-countdown", 0.03  # as if made with that recipe
    (run / "config.json").write_text(json.dumps(config))
    code, message = _resume(run, model_dir, "--resume")
    last = assert_one_line_error("resume without the run's recipe", code, capsys.readouterr().err + message)
    assert ("--alpha 0.01 (from recipe tiny; the run has 0.03); the run was made with --recipe tiny-countdown; "
            "drop those") in last  # recipe tiny: the model's own


def test_resume_refuses_another_model(tmp_path, model_dir, trained, capsys):
    run = _copy(trained, tmp_path)
    other = shutil.copytree(model_dir, tmp_path / "other-model")
    code, message = _resume(run, other, "--resume")
    last = assert_one_line_error("resume with another --model", code, capsys.readouterr().err + message)
    assert f"--model {other} (the run has" in last


@pytest.mark.parametrize("damage", ["no model.safetensors", "config.json not JSON", "no config.json",
                                    "state is a list", "state without rng"])
def test_resume_falls_back_to_the_newest_complete_checkpoint(damage, tmp_path, model_dir, trained, capsys):
    run = _copy(trained, tmp_path)
    newest = run / "step-000002"
    if damage == "no model.safetensors":
        (newest / "model.safetensors").unlink()
    elif damage == "config.json not JSON":
        (newest / "config.json").write_text("{nope")
    elif damage == "no config.json":
        (newest / "config.json").unlink()
    else:
        state = torch.load(newest / "training_state.pt", weights_only=False)
        torch.save([1, 2] if damage == "state is a list" else {k: v for k, v in state.items() if k != "rng"},
                   newest / "training_state.pt")
    code, _ = _resume(run, model_dir, "--resume")
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    warning = next(line for line in err.splitlines() if line.startswith("warning:"))
    assert str(newest) in warning and warning.endswith(f"resuming from {run / 'step-000001'}")
    assert _steps(run) == [1, 2, 3] and (run / "latest").read_text() == "step-000003"


@pytest.mark.parametrize("tail", ['{"step": 3, "reward_me', "\x00\x01 garbage"])
def test_resume_drops_what_a_crash_left_of_a_log_line(tail, tmp_path, model_dir, trained, capsys):
    run = _copy(trained, tmp_path)
    with open(run / "log.jsonl", "a") as f:
        f.write(tail)
    code, _ = _resume(run, model_dir, "--resume")
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    assert any(line.startswith("warning:") and "line 3 is not a log row" in line for line in err.splitlines())
    assert _steps(run) == [1, 2, 3]


def test_resume_says_when_the_log_is_gone_and_refuses_a_directory(tmp_path, model_dir, trained, capsys):
    run = _copy(trained, tmp_path)
    (run / "log.jsonl").unlink()
    code, _ = _resume(run, model_dir, "--resume")
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    assert any(line.startswith("warning:") and "log of steps 1..2 is gone" in line for line in err.splitlines())
    assert _steps(run) == [3]
    (run / "log.jsonl").unlink()
    (run / "log.jsonl").mkdir()
    code, _ = _resume(run, model_dir, "--resume")
    line = assert_one_line_error("log.jsonl a directory", code, capsys.readouterr().err)
    assert line == f"error: {run / 'log.jsonl'} is a directory, not the run's log; move it away and resume again"


def test_a_run_where_every_member_tied_says_so(tmp_path, model_dir, capsys):
    code, _ = run_in_process("train.py", "--model", model_dir, "--out", tmp_path, "--steps", 2, "--sigma", 1e6, *TINY)
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    assert "note: every member tied at every one of the 2 steps run" in err


def _limited(limit, *args):
    """train.py in a subprocess whose files may not grow past `limit` bytes (as on a full disk)."""
    import resource
    import subprocess
    import sys

    from conftest import REPO, script_env

    def limit_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return subprocess.run([sys.executable, str(REPO / "train.py"), *map(str, args)], cwd=REPO, env=script_env(),
                          capture_output=True, text=True, preexec_fn=limit_files, timeout=300)


@pytest.mark.parametrize("algo, limit, file", [(["--algo", "es", *TINY[:4]], 2_000_000, "model.safetensors"),
                                               (["--algo", "grpo", "--prompts", 2, "--group-size", 2], 6_000_000,
                                                "training_state.pt")])
def test_a_full_disk_is_one_line_and_loses_nothing(algo, limit, file, tmp_path, model_dir):
    common = ["--model", model_dir, "--out", tmp_path, *algo, "--save-every", 1, *TINY[4:]]
    assert run_in_process("train.py", *common, "--steps", 1)[0] == 0
    run = next(tmp_path.iterdir())
    r = _limited(limit, *common, "--steps", 2, "--resume")
    last = assert_one_line_error("full disk", r.returncode, r.stderr, r"error: could not write ")
    assert file in last and f"the previous checkpoint {run / 'step-000001'} is intact" in last and " MB free" in last
    assert sorted(p.name for p in run.iterdir() if "step-" in p.name) == ["step-000001"]  # no partial directory
    assert (run / "latest").read_text() == "step-000001"


@pytest.mark.parametrize("algo, what", [
    (["--algo", "es", "--alpha", "1e6", *TINY[:4]], "a weight of the model grew to"),
    (["--algo", "grpo", "--lr", "1e6", "--prompts", 2, "--group-size", 2], "a weight of the model grew to"),
    (["--algo", "es", "--sigma", "1e30", "--no-greedy", *TINY[:4]], "the model's next-token distribution is not"),
])
def test_a_run_blowing_up_stops_before_it_saves(algo, what, tmp_path, model_dir, capsys):
    code, message = run_in_process("train.py", *algo, "--model", model_dir, "--out", tmp_path, "--steps", 3,
                                   "--save-every", 1, *TINY[4:])
    last = assert_one_line_error("a diverging run", code, capsys.readouterr().err + message)
    assert last.startswith(f"error: step 1: {what}") and "--lr/--alpha" in last
    run = next(tmp_path.iterdir())
    assert not (run / "latest").exists() and not list(run.glob("step-*"))


@pytest.mark.parametrize("script, args", [("train.py", ["--out", "{tmp}", *TINY]), ("eval.py", ["--n", 1, "--k", 1])])
def test_an_unreadable_omp_num_threads_is_one_line(script, args, tmp_path, model_dir, monkeypatch, capsys):
    """libgomp ignores it, saying so as torch loads: the run would take every core, which nobody asked for."""
    monkeypatch.setenv("OMP_NUM_THREADS", "abc")
    code, message = run_in_process(script, "--model", model_dir, *[str(a).format(tmp=tmp_path) for a in args])
    last = assert_one_line_error("OMP_NUM_THREADS=abc", code, capsys.readouterr().err + message)
    assert last.startswith("error: OMP_NUM_THREADS='abc' is not a number of threads; set it to a whole number")
    assert not list(tmp_path.iterdir())


def test_an_unreadable_omp_num_threads_ends_a_script_with_our_line(model_dir):
    """In a real process libgomp warns first, as torch loads; the last line is minies' own."""
    import subprocess
    import sys

    from conftest import REPO, script_env

    r = subprocess.run([sys.executable, str(REPO / "eval.py"), "--model", str(model_dir)], cwd=REPO,
                       env={**script_env(), "OMP_NUM_THREADS": "abc"}, capture_output=True, text=True, timeout=300)
    assert "OMP_NUM_THREADS='abc'" in assert_one_line_error("OMP_NUM_THREADS=abc", r.returncode, r.stderr)


@pytest.mark.parametrize("value, readable", [("2", True), (" 4 ", True), ("4,2", True), ("+2", True), ("abc", False),
                                             ("0", False), ("", False), ("-1", False), ("1.5", False), ("2,0", False)])
def test_omp_num_threads_is_read_as_openmp_reads_it(value, readable, monkeypatch):
    from minies import UserError
    from minies.cli import check_thread_variable

    monkeypatch.setenv("OMP_NUM_THREADS", value)
    if readable:
        check_thread_variable()
    else:
        with pytest.raises(UserError, match="OMP_NUM_THREADS"):
            check_thread_variable()


@pytest.mark.parametrize("script, args", [("train.py", ["--out", "{tmp}", "--steps", 1, *TINY]),
                                          ("eval.py", ["--problems", 2, "--n", 1, "--k", 1])])
def test_compile_decoding_given_where_it_does_nothing_says_so(script, args, tmp_path, model_dir, capsys):
    """--compile-decoding, given, on a machine where decoding is not compiled: one note. Its default (on) says
    nothing."""
    from minies.models import default_device
    from minies.runtime.decoding import DEVICES

    args = ["--model", model_dir, *[str(a).format(tmp=tmp_path) for a in args]]
    for given, noted in (([], False), (["--compile-decoding"], default_device().type not in DEVICES)):
        code, message = run_in_process(script, *args, *given, *(["--run-name", "x"] if given and script == "train.py"
                                                                 else []))
        err = capsys.readouterr().err
        assert code == 0, err[-3000:] + message
        assert ("note: --compile-decoding does nothing here: decoding is compiled only on CUDA" in err) == noted, err


def test_rank_without_torchrun_is_one_line(tmp_path, model_dir, monkeypatch, capsys):
    monkeypatch.setenv("RANK", "0")
    for name in ("WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    code, message = run_in_process("train.py", "--model", model_dir, "--out", tmp_path, *TINY)
    last = assert_one_line_error("RANK without torchrun", code, capsys.readouterr().err + message)
    assert "RANK is set" in last and "torchrun" in last
