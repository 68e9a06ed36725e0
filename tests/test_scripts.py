"""train.py and eval.py end to end, in subprocesses with tiny settings (their errors: test_bad_input.py)."""
import json
import os

import pytest

from conftest import REPO, assert_one_line_error, run_in_process, run_script

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


@pytest.mark.parametrize("args", [["--help"], ["--algo", "es", "--help"]])
def test_train_help(args, capsys):
    code, _ = run_in_process("train.py", *args)
    out = capsys.readouterr().out
    assert code == 0
    assert "--population" in out and "--steps" in out and "(default: 32; recipe tiny)" in " ".join(out.split())


def test_eval_help(capsys):
    code, _ = run_in_process("eval.py", "--help")
    out = capsys.readouterr().out
    assert code == 0 and "--problems" in out and "default:" in out


def test_eval_scores_every_row_of_eval_data(tmp_path, model_dir, capsys):
    """--eval-data is evaluated whole: more than the 500 problems the single-file split held out."""
    rows = tmp_path / "test.jsonl"
    rows.write_text("".join(json.dumps({"question": f"{i}+1", "answer": f"#### {i + 1}"}) + "\n" for i in range(600)))
    out = tmp_path / "m.json"
    code, message = run_in_process("eval.py", "--model", model_dir, "--task", "gsm8k", "--eval-data", rows,
                                   "--max-new-tokens", 1, "--n", 1, "--k", 1, "--micro-batch", 1024, "--out", out)
    assert code == 0, capsys.readouterr().err + message
    assert json.loads(out.read_text())["problems"] == 600


def test_gsm8k_trains_only_from_data(tmp_path, model_dir, capsys):
    from conftest import REPO, assert_one_line_error

    code, message = run_in_process("train.py", "--model", model_dir, "--task", "gsm8k", "--eval-data",
                                   REPO / "tests" / "data" / "gsm8k_test.jsonl", "--out", tmp_path)
    assert_one_line_error("gsm8k without --data", code, capsys.readouterr().err + message, r"error: --task gsm8k")


def test_plot_reads_a_runs_curves(trained, capsys):
    """plot.py's panels from a run's log and summary: every step's reward, the held-out metrics with the
    before/after evaluations at both ends; without matplotlib, one line saying how to get it."""
    import importlib.util

    import plot

    out, run_dir = trained
    rows, summary = plot.read_run(run_dir)
    every = [r["step"] for r in rows]
    assert every[0] == 1 and plot.points(rows, summary, "reward_mean", None, None) == (
        every, [r["reward_mean"] for r in rows])
    steps, values = plot.points(rows, summary, None, "heldout_pass@1", "pass@1")
    assert steps == [0, every[-1]] and values == [summary["before"]["pass@1"], summary["after"]["pass@1"]]
    code, message = run_in_process("plot.py", run_dir, "--out", out / "curves.png")
    if importlib.util.find_spec("matplotlib") is None:
        assert code == 2 and capsys.readouterr().err.strip() == (
            "error: plotting needs matplotlib, which minies does not require: pip install matplotlib")
    else:
        assert code == 0 and (out / "curves.png").stat().st_size > 0, capsys.readouterr().err + message


def test_plot_of_a_missing_run_is_one_line(tmp_path, capsys):
    code, message = run_in_process("plot.py", tmp_path / "nope")
    err = capsys.readouterr().err + message
    assert code == 2 and err.strip().splitlines()[-1].startswith(f"error: {tmp_path / 'nope' / 'log.jsonl'}")


def test_eval_notes_completions_longer_than_the_models_positions(tmp_path, model_dir, capsys):
    """--max-new-tokens at or past the model's max_position_embeddings runs, with one note saying so."""
    from minies.models import load_config

    positions = load_config(model_dir).max_position_embeddings
    for new_tokens, noted in ((positions - 1, False), (positions, True)):
        code, message = run_in_process("eval.py", "--model", model_dir, "--problems", 2, "--n", 1, "--k", 1,
                                       "--max-new-tokens", new_tokens, "--out", tmp_path / "m.json")
        err = capsys.readouterr().err
        assert code == 0, err + message
        assert (f"note: --max-new-tokens {new_tokens} reaches past the {positions} positions" in err) == noted, err


def test_eval_out_may_not_name_the_data_it_reads(tmp_path, model_dir, capsys):
    data = tmp_path / "rows.jsonl"
    data.write_text(open(REPO / "tests" / "data" / "gsm8k_test.jsonl").read())
    for flag in ("--data", "--eval-data"):
        code, message = run_in_process("eval.py", "--model", model_dir, "--task", "gsm8k", flag, data, "--out", data)
        last = assert_one_line_error(flag, code, capsys.readouterr().err + message)
        assert f"is the {flag} file" in last
    assert data.read_text() == open(REPO / "tests" / "data" / "gsm8k_test.jsonl").read()


def test_eval_show_prompt_writes_out(tmp_path, model_dir, capsys):
    code, message = run_in_process("eval.py", "--model", model_dir, "--show-prompt", "--out", tmp_path / "p.json")
    out = capsys.readouterr().out
    assert code == 0, message
    written = json.loads((tmp_path / "p.json").read_text())
    assert written["prompt"] == out.rstrip("\n") and written["tokens"] > 0 and written["task"] == "arithmetic"


def test_train_prints_before_once_a_line_per_evaluation_and_the_pass_at_k_its_samples_allow(tmp_path, model_dir,
                                                                                             capsys):
    code, message = run_in_process("train.py", "--model", model_dir, "--steps", 3, "--out", tmp_path, "--population", 2,
                                   "--prompts-per-step", 2, "--eval-problems", 2, "--final-samples", 8, "--eval-every", 1,
                                   "--eval-samples", 2)
    out = capsys.readouterr().out
    assert code == 0, message
    assert out.count("before: ") == 1 and out.count("after: ") == 1 and "pass@8 " in out and "pass@16" not in out
    assert [line.split(":")[0] for line in out.splitlines() if "heldout_pass@1" in line] == ["step 1", "step 2"]
