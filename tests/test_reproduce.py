"""bench/reproduce.py --quick end to end (about a minute on one core): every stage runs and results.json
holds sane values; and its one-line errors."""
import contextlib
import io
import json

import pytest

from bench import reproduce
from conftest import single_thread
from minies import UserError
from minies.recipes import RECIPES
from minies.models import SHIPPED_MODELS

RUNS = ("es-seed0", "es-sigma0.016-seed0", "grpo-seed0", "grpo-hot-seed0", "c3po-seed0", "grpo-es-seed0",
        "es-grpo-seed0")
SEQUENTIAL = ("grpo-es-seed0", "es-grpo-seed0")


@pytest.fixture(scope="module")
def quick(tmp_path_factory, model_dir):
    """(out directory, results.json, printed lines) of one quick reproduction."""
    out = tmp_path_factory.mktemp("reproduce")
    printed = io.StringIO()
    with single_thread(), contextlib.redirect_stdout(printed):
        reproduce.main(["--quick", "--model", model_dir, "--out", str(out)])
    return out, json.loads((out / "results.json").read_text()), printed.getvalue()


def test_results_have_every_part(quick):
    out, results, printed = quick
    parts = {"config", "start", "runs", "sparsity", "rescue", "summary", "seconds", "estimated_seconds"}
    assert parts <= results.keys()
    assert results["config"]["quick"] and results["config"]["tokens"] == reproduce.QUICK["tokens"]
    assert sorted(results["runs"]) == sorted(RUNS)
    assert set(results["summary"]) == {"start", "es", "es-sigma0.016", "grpo", "grpo-hot", "c3po", "grpo-es", "es-grpo"}
    assert "plan:" in printed and "estimated total" in printed and "grpo-hot-seed0" in printed
    markdown = (out / "results.md").read_text()
    assert "| GRPO→ES |" in markdown and "## Functional sparsity" in markdown
    assert "## Malformed rate over training" in markdown and "| GRPO-hot |" in markdown
    assert "| C3PO | GRPO-hot | seed0 |" in markdown and "| GRPO-hot | GRPO | seed0 |" in markdown
    assert "| ES σ=0.016 |" in markdown and "Rank correlation (Spearman) across the 2 ES runs" in markdown
    plots = {p.name for p in out.glob("*.png")}
    expected = {"entropy.png", "malformed.png", "pass_at_k.png", "reward.png", "sparsity.png", "train_malformed.png",
                "es_diversity.png", "diversity_pass_at_k.png", "rescue.png"}
    assert plots == expected or "plots skipped" in printed


def test_grpo_hot_is_grpo_at_the_hot_temperature(quick):
    out, results, _ = quick
    hot = results["config"]["hot_temperature"]
    assert hot == 1.2
    configs = {name: json.loads((out / "runs" / name / "config.json").read_text()) for name in ("grpo-seed0",
                                                                                                "grpo-hot-seed0")}
    assert configs["grpo-hot-seed0"]["train"]["algo"] == "grpo"
    assert configs["grpo-hot-seed0"]["grpo"]["temperature"] == hot and configs["grpo-seed0"]["grpo"]["temperature"] == 1
    # Everything else as plain GRPO's: the same seed, prompts, evaluations and flags.
    for section in ("train", "grpo"):
        plain, hot_cfg = (dict(configs[n][section]) for n in ("grpo-seed0", "grpo-hot-seed0"))
        for cfg in (plain, hot_cfg):
            cfg.pop("temperature", None), cfg.pop("run_name", None), cfg.pop("steps", None)
        assert plain == hot_cfg, section
    assert results["runs"]["grpo-hot-seed0"]["method"] == "grpo-hot"
    assert results["runs"]["grpo-hot-seed0"]["eval"]["n"] == results["config"]["samples"]


def test_diversity_runs_are_es_at_their_sigma_and_linked_to_pass_at_k(quick):
    out, results, _ = quick
    configs = {name: json.loads((out / "runs" / name / "config.json").read_text()) for name in ("es-seed0",
                                                                                                "es-sigma0.016-seed0")}
    assert configs["es-sigma0.016-seed0"]["es"]["sigma"] == 0.016
    assert configs["es-seed0"]["es"]["sigma"] == RECIPES["tiny"].settings("es")["sigma"]  # the shipped model's own
    configs["es-sigma0.016-seed0"]["es"].pop("sigma"), configs["es-seed0"]["es"].pop("sigma")
    assert configs["es-sigma0.016-seed0"]["es"] == configs["es-seed0"]["es"]
    link = results["diversity_link"]
    assert [p["run"] for p in link["runs"]] == ["es-seed0", "es-sigma0.016-seed0"]
    for point in link["runs"]:
        run = results["runs"][point["run"]]
        assert len(run["js_diversity"]) == run["steps"]  # one per ES step
        assert point["js_diversity_mean"] == pytest.approx(sum(d for _, d in run["js_diversity"]) / run["steps"])
        assert 0 <= point["js_diversity_mean"] <= 1 and point["pass@8"] == run["eval"]["pass@8"]
        assert point["gain_pass@8"] == pytest.approx(run["eval"]["pass@8"] - results["start"]["seed0"]["pass@8"])
    assert sorted(link["rank_correlation"]) == ["pass@1", "pass@2", "pass@4", "pass@8"]
    for k, r in link["rank_correlation"].items():
        a, b = ([p[key] for p in link["runs"]] for key in ("js_diversity_mean", f"gain_{k}"))
        # Two runs: +1 or -1 by the order of the two, None where either pair of values ties.
        if a[0] == a[1] or b[0] == b[1]:
            assert r is None
        else:
            assert r == pytest.approx(1.0 if (a[0] < a[1]) == (b[0] < b[1]) else -1.0)


def test_every_run_spends_the_same_token_budget(quick):
    _, results, _ = quick
    budget = results["config"]["tokens"]
    for name, run in results["runs"].items():
        stages = run["stages"]
        assert len(stages) == (2 if name in SEQUENTIAL else 1), name
        for stage in stages:
            # Steps are whole: each stage ends within one step of its share of the budget.
            assert abs(stage["tokens"] - budget / len(stages)) <= stage["tokens"] / stage["steps"], (name, stage)
        assert run["tokens"] == sum(s["tokens"] for s in stages)
    assert [s["method"] for s in results["runs"]["grpo-es-seed0"]["stages"]] == ["grpo", "es"]
    assert results["runs"]["es-grpo-seed0"]["checkpoint"].split("/")[-2] == "2-grpo"


def test_final_evaluations_are_sane(quick):
    _, results, _ = quick
    n = results["config"]["samples"]
    for metrics in [results["start"]["seed0"]] + [r["eval"] for r in results["runs"].values()]:
        curve = [metrics[f"pass@{k}"] for k in (1, 2, 4, 8)]
        assert curve == sorted(curve) and 0 <= curve[0] and curve[-1] <= 1 and metrics["n"] == n
        assert 0 <= metrics["greedy_accuracy"] <= 1 and metrics["entropy"] > 0
    for name, run in results["runs"].items():
        assert run["drift"]["total"] > 0 and run["drift"]["other"] == 0.0, name
        parts = sum(run["drift"][k] ** 2 for k in ("embedding", "attention", "mlp", "norm", "other"))
        assert run["drift"]["total"] == pytest.approx(parts ** 0.5)
        assert run["heldout_entropy"][0][0] == 0 and len(run["reward"]) == run["steps"]
        # The malformed series: the same evaluations as the entropy series, from the start model to the end.
        malformed = run["heldout_malformed"]
        assert [t for t, _ in malformed] == [t for t, _ in run["heldout_entropy"]], name
        assert malformed[0][0] == 0 and malformed[-1][0] == run["tokens"] and len(malformed) >= 3, name
        assert all(0 <= rate <= 1 for _, rate in malformed + run["train_malformed"]), name
        grpo_steps = sum(s["steps"] for s in run["stages"] if not s["method"].startswith("es"))
        assert len(run["train_malformed"]) == grpo_steps, name  # one per GRPO or C3PO step; ES logs none
    # Every run starts from the same model and train.py evaluates it the same way before training.
    assert len({run["heldout_malformed"][0][1] for run in results["runs"].values()}) == 1
    summary = results["summary"]
    assert summary["grpo"]["pass@1"]["mean"] == results["runs"]["grpo-seed0"]["eval"]["pass@1"]
    assert summary["grpo"]["pass@1"]["std"] == 0.0 and summary["grpo"]["pass@1"]["n"] == 1
    for method, row in summary.items():
        if method != "start":
            assert row["malformed_at1.0"]["mean"] == results["runs"][f"{method}-seed0"]["heldout_malformed"][-1][1]
            assert all(0 <= row[f"malformed_at{f}"]["mean"] <= 1 for f in reproduce.BUDGET_FRACTIONS)
    assert "train_malformed_last" in summary["grpo-hot"] and "train_malformed_last" not in summary["es"]


def test_sparsity_ends_are_the_start_and_the_trained_model(quick):
    _, results, _ = quick
    assert sorted(results["sparsity"]) == ["es-seed0", "grpo-seed0"]
    es, grpo = results["sparsity"]["es-seed0"], results["sparsity"]["grpo-seed0"]
    assert list(es) == ["0.0", "0.01", "0.05", "0.1", "0.5", "1.0"]
    # Keeping nothing gives the start model exactly: the same evaluation for both methods.
    for metric in ("pass@1", "greedy_accuracy"):
        assert es["0.0"][metric] == grpo["0.0"][metric]
    for points in (es, grpo):
        assert all(0 <= p["pass@1"] <= 1 for p in points.values())
        for metric in ("pass@1", "greedy_accuracy"):
            kept = [points[keep][f"{metric}_gain_kept"] for keep in ("0.0", "1.0")]
            assert kept in ([None, None], [0.0, 1.0])  # None: this metric did not improve


def test_rescue_pairs_methods_with_their_baselines_prompt_by_prompt(quick):
    _, results, _ = quick
    assert sorted(results["rescue"]) == ["c3po-vs-grpo", "c3po-vs-grpo-hot", "grpo-hot-vs-grpo"]
    for pair, seeds in results["rescue"].items():
        method, baseline = (results["runs"][f"{m}-seed0"] for m in pair.split("-vs-"))
        rescue = seeds["seed0"]
        assert rescue["steps"] == min(method["steps"], baseline["steps"]), pair
        assert rescue["prompts"] == 16 * rescue["steps"], pair
        assert all(len(step) == 16 for step in method["groups_solved"] + baseline["groups_solved"])
        assert rescue["baseline_failed"] == sum(step.count(0) for step in baseline["groups_solved"][:rescue["steps"]])
        assert 0 <= rescue["rescued"] <= rescue["baseline_failed"] <= rescue["prompts"]
        assert 0 <= rescue["lost"] <= rescue["prompts"] - rescue["baseline_failed"]
        # Over training: the quarters tile the paired steps and their counts add up to the totals.
        quarters = rescue["quarters"]
        assert len(quarters) == 4 and quarters[0]["steps"][0] == 1 and quarters[-1]["steps"][1] == rescue["steps"]
        assert all(a["steps"][1] + 1 == b["steps"][0] for a, b in zip(quarters, quarters[1:]))
        assert [sum(q[key] for q in quarters) for key in ("rescued", "lost")] == [rescue["rescued"], rescue["lost"]]


def test_user_errors(quick, tmp_path, capsys):
    out, _, _ = quick
    with pytest.raises(UserError, match="already exists"):
        reproduce.main(["--quick", "--out", str(out)])
    for flag in ("--seeds", "--hot-temperature"):  # rejected by argparse: one "error:" line, exit status 2
        with pytest.raises(SystemExit, match="2"):
            reproduce.main(["--quick", flag, "0", "--out", str(tmp_path)])
        assert flag in capsys.readouterr().err.splitlines()[-1]
    for bad in ("0.01,x", "-0.01"):
        with pytest.raises(UserError, match="--diversity-sigmas"):
            reproduce.main(["--quick", "--diversity-sigmas", bad, "--out", str(tmp_path)])


def test_countdown_reproduction_counts_distinct_solutions(tmp_path):
    """--task countdown: every run trains the Countdown model on Countdown, and the report adds the coverage of
    the solution space (distinct correct expressions per solved problem) from the final evaluations."""
    out = tmp_path / "countdown"
    printed = io.StringIO()
    with single_thread(), contextlib.redirect_stdout(printed):
        reproduce.main(["--quick", "--task", "countdown", "--tokens", "1500", "--problems", "12", "--samples", "4",
                        "--diversity-sigmas", "", "--es-population", "4", "--es-prompts", "8", "--eval-problems", "4",
                        "--sparsity-samples", "2", "--out", str(out)])
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["task"] == "countdown" and results["config"]["model"] == SHIPPED_MODELS["countdown"]
    config = json.loads((out / "runs" / "grpo-seed0" / "config.json").read_text())["train"]
    assert config["task"] == "countdown" and config["model"] == SHIPPED_MODELS["countdown"]
    space = results["solution_space"]
    assert space["mean"] > 1 and 0 < space["multi"] < 1
    for method, row in results["summary"].items():
        assert 1 <= row["distinct_correct"]["mean"] and 0 < row["solution_coverage"]["mean"] <= 1, method
    assert "## Coverage of the solution space" in (out / "results.md").read_text()
    assert (out / "solutions.png").exists() or "plots skipped" in printed.getvalue()
