"""bench/smollm2.py --quick end to end on the shipped model (every piece at toy size), its resumption piece by
piece, its one-line errors; the measurements it adds: the problems solved only by sampling, the answer diversity
of a policy's samples, and weight-noise samples that leave the model exactly as it was."""
import contextlib
import fcntl
import io
import json
import os
import threading
import time

import pytest
import torch

import train
from bench import budget, smollm2, smollm2_report, weight_noise
from bench.budget import write_json
from conftest import single_thread
from minies import UserError
from minies.evaluate import evaluate
from minies.models import load_model, load_tokenizer
from minies.tasks import get_task

SHIPPED = "minies/assets/tiny"


def run(out, *flags):
    with single_thread(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        smollm2.main(["--quick", "--out", str(out), *flags])
    return json.loads((out / "results.json").read_text())


def files(out):
    """{path: (mtime, content)} of every piece's file."""
    paths = [p for p in out.rglob("*.json") if p.name != "results.json" and "step-" not in str(p)]
    return {str(p): (os.stat(p).st_mtime_ns, p.read_bytes()) for p in paths if p.name in ("budget.json",)
            or p.parent.name == "evals"}


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("smollm2")
    return out, run(out)


def test_every_piece_is_in_the_results(quick):
    out, results = quick
    assert {"table", "training", "es_check", "calibration", "sequential", "noise", "sparsity", "rescue",
            "transfer", "drift"} <= results.keys()
    assert all(d["total"]["mean"] > 0 for d in results["drift"].values())  # every method moved its weights
    assert set(results["table"]) == {"start", "es", "grpo", "c3po"}
    assert set(results["es_check"]["rows"]) == {"es-inplace", "es-lowrank-r1", "es-lowrank-r8",
                                                "es-sigma0.003-alpha0.002"}
    assert {r["mode"] for r in results["es_check"]["rows"].values()} == {"inplace", "lowrank"}
    for name, r in results["es_check"]["rows"].items():
        assert r["seconds_per_step"] > 0, name
        if "pass@1_at_equal_time" in r:  # read off its curve of held-out pass@1 against steps
            steps, _, values = zip(*r["curve"])
            assert steps[0] == 0 and steps[-1] == r["steps"] and list(steps) == sorted(steps), name
            assert min(values) <= r["pass@1_at_equal_time"] <= max(values), name
    assert set(results["calibration"]) == {"chosen", "calibration-2-40"}
    assert [e["temperature"] for e in results["noise"]["temperature"]] == smollm2.QUICK["temperatures"]
    for name, run_ in results["training"].items():  # each run within about a step of the budget
        assert run_["tokens"] >= 0.5 * smollm2.QUICK["tokens"], name
    for e in results["finals"]["start"]:
        assert e["pass@4"] - e["greedy_accuracy"] <= e["sampling_only"] <= e["pass@4"]
        assert 0 <= e["answer_diversity"] <= 1
    for name in results["es_check"]["rows"]:  # a curve for the estimators, the σ × α runs ranked at their end
        evaluated = any("heldout_pass@1" in row for row in budget.read_log(str(out / "es-check" / name)))
        assert evaluated == (not name.startswith("es-sigma")), name
    claims = dict(results["claims"])  # a row per claim of the two papers, each with SmolLM2's figure
    assert len(claims) == 10 and all(claims.values())
    grpo_gain = results["finals"]["grpo"][0]["pass@1"] - results["finals"]["start"][0]["pass@1"]  # one seed: no spread
    grpo = claims["A: GRPO against the start model: pass@1, pass@4; entropy"]
    assert grpo.startswith(f"pass@1 {grpo_gain * 100:+.1f} ± 0.0 ({int(grpo_gain > 0)}/1 above)")
    diversity = claims["A: ES's population more diverse than GRPO's groups (mean JS diversity over training)"]
    assert diversity.startswith(f"ES {results['diversity']['es-seed0']:.3f} ± 0.000, GRPO")
    assert set(results["diversity"]) == {"es-seed0", "grpo-seed0", "c3po-seed0"}
    markdown = (out / "results.md").read_text()
    assert "| GRPO → ES |" in markdown and "| T = 0.6 |" in markdown and "| es-inplace | inplace |" in markdown


def test_a_second_run_redoes_nothing_and_a_lost_piece_comes_back_the_same(quick):
    out, results = quick
    before = files(out)
    again = run(out)
    assert files(out) == before and again["table"] == results["table"]
    lost = out / "evals" / "grpo-seed0.json"
    content = lost.read_bytes()
    lost.unlink()
    (out / "runs" / "c3po-seed0" / "budget.json").unlink()  # stopped after training, before its record
    run(out, "--only", "evals,c3po")
    assert lost.read_bytes() == content
    assert (out / "runs" / "c3po-seed0" / "budget.json").read_bytes() == before[
        str(out / "runs" / "c3po-seed0" / "budget.json")][1]


def test_a_file_another_process_computes_is_not_computed_twice(tmp_path):
    """Two processes sharing the work (--only): one skips the file the other computes, or waits for it."""
    path = str(tmp_path / "evals" / "x.json")
    os.makedirs(os.path.dirname(path))
    with open(path + ".lock", "w") as other:
        fcntl.flock(other, fcntl.LOCK_EX)
        assert smollm2.saved(path, lambda: pytest.fail("computed twice")) is None
    assert smollm2.saved(path, lambda: {"a": 1}) == {"a": 1} and os.listdir(tmp_path / "evals") == ["x.json"]
    other = open(path.replace("x.json", "y.json.lock"), "w")
    fcntl.flock(other, fcntl.LOCK_EX)

    def finish():  # the other process writes its file, then ends
        time.sleep(0.2)
        write_json(path.replace("x.json", "y.json"), {"b": 2})
        other.close()
    writer = threading.Thread(target=finish)
    writer.start()
    waited = smollm2.saved(path.replace("x.json", "y.json"), lambda: pytest.fail("computed twice"), wait=True)
    writer.join()
    assert waited == {"b": 2} and sorted(os.listdir(tmp_path / "evals")) == ["x.json", "y.json"]


@pytest.mark.parametrize("flags, message", [
    (["--es-check-grid", "0.001"], "--es-check-grid"),
    (["--es-check-grid", "0.001:-1"], "--es-check-grid"),
    (["--calibration-levels", "2-99"], "--calibration-levels"),
    (["--calibration-levels", "x:99"], "--calibration-levels"),
    (["--only", "grpo,nothing"], "--only grpo,nothing: no piece nothing"),
])
def test_malformed_lists_are_refused_before_anything_runs(flags, message, tmp_path):
    with pytest.raises(UserError, match=message):
        smollm2.parse_args(["--out", str(tmp_path), *flags])
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("flags, message", [
    (["--numbers", "0"], "--numbers: 0 is not an integer"), (["--high", "-1"], "--high: -1 is not an integer"),
    (["--temperatures", "0"], "--temperatures: 0 is not a number"), (["--noise-scales", "nan"], "--noise-scales"),
    (["--tokens", "0"], "--tokens: 0 is not an integer"),
])
def test_bad_numbers_end_in_one_error_line(flags, message, capsys):
    with pytest.raises(SystemExit):
        smollm2.parse_args(flags)
    assert message in capsys.readouterr().err.strip().splitlines()[-1]


def test_an_out_under_a_file_is_refused_before_anything_runs(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match="is a file, not a directory"):
        smollm2.main(["--quick", "--out", str(tmp_path / "file" / "out")])


def test_temperature_is_read_at_a_diversity_along_its_curve_and_at_its_best():
    """Diversity rises with temperature, then falls when hot samples are mostly malformed: a diversity the curve
    crosses twice is read at the better pass@1; one outside the curve at none."""
    curve = [{"temperature": t, "answer_diversity": d, "pass@1": p}
             for t, d, p in ((1.6, 0.4, 0.02), (0.6, 0.4, 0.14), (1.0, 0.6, 0.10))]
    assert smollm2_report.at_diversity(curve, 0.5) == pytest.approx(0.12)  # not 0.06 on the hot side
    assert smollm2_report.at_diversity(curve, 0.6) == pytest.approx(0.10)
    assert smollm2_report.at_diversity(curve, 0.2) is None and smollm2_report.at_diversity(curve, 0.7) is None


def test_weight_noise_leaves_the_model_exactly_as_it_was():
    model, tok = load_model(SHIPPED), load_tokenizer(SHIPPED)
    task = get_task("arithmetic", prompt_style="terse")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with single_thread():
        result = weight_noise.weight_noise(model, tok, task, task.test_problems(6), 0.05, 3)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert 0 <= result["answer_diversity"] <= 1 and 0 <= result["pass@1"] <= 1


def test_solved_only_by_sampling_lies_between_its_bounds():
    model, tok = load_model(SHIPPED), load_tokenizer(SHIPPED)
    task = get_task("arithmetic", prompt_style="terse")
    for temperature in (0.5, 1.0):
        with single_thread():
            e = evaluate(model, tok, task, task.test_problems(8), n=4, ks=[1, 4], temperature=temperature)
        # Solved by a sample and not greedily: at most every problem a sample solves, at least those less the
        # ones greedy decoding solves.
        assert e["pass@4"] - e["greedy_accuracy"] <= e["sampling_only"] <= e["pass@4"]
        assert 0 <= e["answer_diversity"] <= 1


def test_a_run_stopped_anywhere_ends_as_an_unbroken_one(tmp_path):
    """bench/budget.py: a run stopped after its first step (its checkpoint kept) and trained to the budget again
    takes the same steps and logs the same rows as one trained to the budget at once."""
    flags = ["--algo", "grpo", "--model", SHIPPED, "--prompts", 4, "--group-size", 4, "--save-every", 1,
             "--eval-every", 2, "--eval-problems", 4, "--eval-samples", 2, "--final-samples", 2]
    with single_thread(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        unbroken = budget.train_to_budget(str(tmp_path / "a"), flags, 400, 6)
        train.main([str(f) for f in flags + ["--out", tmp_path, "--run-name", "b", "--steps", 1]])  # then "killed"
        stopped = budget.train_to_budget(str(tmp_path / "b"), flags, 400, 6)
    assert unbroken["steps"] == stopped["steps"] and unbroken["tokens"] == stopped["tokens"] >= 300

    def rows(run):
        return [{k: v for k, v in row.items() if k != "seconds"} for row in budget.read_log(str(tmp_path / run))]
    assert rows("a") == rows("b")
