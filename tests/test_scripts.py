"""train.py and eval.py end to end, in subprocesses with tiny settings, and their one-line errors."""
import json
import os
import re

import pytest

from conftest import finish, run_in_process, run_script, start_script

pytestmark = pytest.mark.usefixtures("one_thread")

TINY_TRAIN = ["--population", "4", "--prompts-per-step", "16", "--eval-problems", "20", "--final-samples", "2",
              "--eval-every", "0"]
RUN = "es-arithmetic-seed0"


def _ok(r):
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stderr[-4000:]}"
    return r


def _log(run_dir):
    with open(os.path.join(run_dir, "log.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, model_dir):
    """A 2-step ES run: (out directory, run directory)."""
    out = tmp_path_factory.mktemp("train")
    _ok(run_script("train.py", "--model", model_dir, "--steps", 2, "--out", out, *TINY_TRAIN))
    return out, out / RUN


def test_train_end_to_end(trained):
    out, run_dir = trained
    rows = _log(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    assert all("reward_mean" in r and r["tokens"] > 0 for r in rows)
    assert (run_dir / "latest").read_text().strip() == "step-000002"
    assert (run_dir / "step-000002" / "training_state.pt").exists()
    config = json.loads((run_dir / "config.json").read_text())
    assert config["train"]["steps"] == 2 and config["es"]["population"] == 4
    summary = json.loads((run_dir / "summary.json").read_text())
    for when in ("before", "after"):
        assert summary[when]["problems"] == 20 and summary[when]["n"] == 2
        assert 0 <= summary[when]["pass@1"] <= 1 and 0 <= summary[when]["greedy_accuracy"] <= 1


def test_train_resume_continues(trained, model_dir):
    out, run_dir = trained
    before = json.loads((run_dir / "summary.json").read_text())["before"]
    _ok(run_script("train.py", "--model", model_dir, "--steps", 3, "--out", out, "--resume", *TINY_TRAIN))
    rows = _log(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[2]["tokens"] > rows[1]["tokens"]  # the token count carries over
    assert (run_dir / "latest").read_text().strip() == "step-000003"
    # The "before" evaluation is the one of the original run, not of the checkpoint.
    assert json.loads((run_dir / "summary.json").read_text())["before"] == before


def test_eval_end_to_end(tmp_path, model_dir):
    out = tmp_path / "x.json"
    r = _ok(run_script("eval.py", "--model", model_dir, "--problems", 20, "--n", 4, "--k", 1, 4, "--out", out))
    metrics = json.loads(out.read_text())
    assert metrics["problems"] == 20 and metrics["n"] == 4
    for key in ("pass@1", "pass@4", "greedy_accuracy", "malformed_rate", "entropy", "mean_length"):
        assert key in metrics, key
    assert 0 <= metrics["pass@1"] <= metrics["pass@4"] <= 1
    assert 0 <= metrics["greedy_accuracy"] <= 1
    assert "pass@1" in r.stdout


def _assert_one_line_error(name, code, stderr, pattern=r"error: "):
    err = stderr.strip()
    assert code != 0, f"{name}: exit status 0"
    assert "Traceback" not in err, f"{name}: traceback\n{err[-3000:]}"
    last = err.splitlines()[-1] if err else ""
    assert re.match(pattern, last), f"{name}: last stderr line is {last!r}"
    return last


# Mistakes that end in a UserError: the last line starts with "error:".
USER_ERRORS = {
    "eval: missing model": ("eval.py", ["--model", "{missing}", "--problems", 5, "--n", 1, "--k", 1],
                            "no such directory"),
    "train: missing model": ("train.py", ["--model", "{missing}", "--out", "{tmp}/a"], "no such directory"),
    "eval: bad dtype": ("eval.py", ["--model", "{model}", "--dtype", "float8", "--problems", 5, "--n", 1, "--k", 1],
                        "--dtype"),
    "train: bad dtype": ("train.py", ["--model", "{model}", "--dtype", "float8", "--out", "{tmp}/b"], "--dtype"),
    "train: resume without checkpoint": ("train.py", ["--model", "{model}", "--resume", "--out", "{tmp}/c"],
                                         "--resume"),
    "train: run exists without --resume": ("train.py", ["--model", "{model}", "--steps", 2, "--out", "{trained}"],
                                           "--resume"),
    "train: unknown algorithm": ("train.py", ["--algo", "nope"], "--algo"),
    "eval: k above n": ("eval.py", ["--model", "{model}", "--n", 2, "--k", 1, 4], "--k"),
}
# Errors argparse finds itself (minies.ArgumentParser prints them as one "error: ..." line too).
USAGE_ERRORS = {
    "eval: unknown task": ("eval.py", ["--task", "nope"], "--task"),
    "train: unknown task": ("train.py", ["--task", "nope"], "--task"),
    "eval: k not a number": ("eval.py", ["--k", "one"], "--k"),
}


def _fill(args, **values):
    return [str(a).format(**values) for a in args]


@pytest.mark.parametrize("name", list(USER_ERRORS) + list(USAGE_ERRORS))
def test_one_line_errors(name, tmp_path, trained, model_dir, capsys):
    """Each mistake ends with one error line on stderr and a non-zero exit status, never a traceback.
    Run in this interpreter (the scripts' __main__ blocks, as is); test_errors_in_a_subprocess checks
    that a real process prints the same."""
    script, args, mention = {**USER_ERRORS, **USAGE_ERRORS}[name]
    args = _fill(args, missing=tmp_path / "no-such-model", tmp=tmp_path, model=model_dir, trained=trained[0])
    code, message = run_in_process(script, *args)
    stderr = capsys.readouterr().err + message
    last = _assert_one_line_error(name, code, stderr, r"error: ")
    assert mention in last, f"{name}: {last!r}"
    # Nothing was written for a run that failed.
    assert not (tmp_path / "b").exists() and not (tmp_path / "c" / "log.jsonl").exists()


def test_errors_in_a_subprocess(tmp_path):
    procs = {"eval: missing model": start_script("eval.py", "--model", tmp_path / "none", "--n", 1, "--k", 1),
             "train: unknown task": start_script("train.py", "--task", "nope", "--out", tmp_path)}
    for name, proc in procs.items():
        r = finish(proc)
        _assert_one_line_error(name, r.returncode, r.stderr, r"error: ")
        assert r.returncode == 2


@pytest.mark.parametrize("args", [["--help"], ["--algo", "es", "--help"]])
def test_train_help(args, capsys):
    code, _ = run_in_process("train.py", *args)
    out = capsys.readouterr().out
    assert code == 0
    assert "--population" in out and "--steps" in out and "(default: 32)" in " ".join(out.split())


def test_eval_help(capsys):
    code, _ = run_in_process("eval.py", "--help")
    out = capsys.readouterr().out
    assert code == 0 and "--problems" in out and "default:" in out
