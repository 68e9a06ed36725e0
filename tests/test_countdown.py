"""Countdown's brute force (distinct solutions, solvability), the varied references of the Countdown warm
start, the shipped Countdown model, and --task countdown choosing it when no --model is given."""
import json
import os
import random
import re

import pytest

import train
from conftest import run_in_process
from minies import UserError
from minies.evaluate import evaluate, solution_metrics
from scripts.make_tiny import varied_references
from minies.models import SHIPPED_MODEL, SHIPPED_MODELS, load_model, load_tokenizer
from minies.recipes import RECIPES
from minies.tasks import Countdown, parse_expression, solutions, solvable

COUNTDOWN_MODEL = SHIPPED_MODELS["countdown"]
needs_model = pytest.mark.skipif(not os.path.exists(os.path.join(COUNTDOWN_MODEL, "model.safetensors")),
                                 reason="the shipped Countdown model is not built (docs/tiny-model.md)")


# Canonical forms: a sum or product of sorted parts, flattened, minus parts after "-", divisors after "/".
@pytest.mark.parametrize("numbers,target,expected", [
    ([3, 7, 12], 33, {"((3*7)+12)"}),  # 12+7*3, (7*3)+12: the same
    ([1, 2, 3], 6, {"(1+2+3)", "(1*2*3)", "(2*3/1)"}),  # 3/(1/2), 3*(2/1), 2/1*3: all (2*3/1)
    ([2, 2], 4, {"(2+2)", "(2*2)"}),
    ([5, 5, 3], 3, {"(3+5-5)", "(3*5/5)"}),  # 3-(5-5) is 5-5+3; 3/(5/5) is 5/5*3
    ([3, 4, 8], 6, {"(3*8/4)"}),  # 8/(4/3) too, through the fraction 4/3
    ([1, 2], 3, {"(1+2)"}),
    ([7], 7, {"7"}),
])
def test_distinct_solutions_hand_counted(numbers, target, expected):
    found = solutions(numbers, target)
    assert set(found) == expected
    task = Countdown(test_size=1)
    problem = task.make_problem(numbers, target)
    assert all(task.score(f"<answer>{text}</answer>", problem).correct for text in found.values())


def test_a_parsed_solution_has_its_brute_force_form():
    """The verifier's canonical form of an answer (Score.solution) is the key solutions() gives it, whatever
    the order of operands, grouping or redundant parentheses; so distinct solutions can be counted."""
    task = Countdown(test_size=200, numbers=4)
    for p in task.test_problems():
        for key, text in solutions(p.numbers, int(p.answer)).items():
            assert parse_expression(text, 200, 10)[2] == key
            assert task.score(f"<answer>({text})</answer>", p).solution == key
    problem = task.make_problem([3, 7, 12], 33)
    forms = {task.score(f"<answer>{t}</answer>", problem).solution for t in ("3*7+12", "12+7*3", "(7*3)+12")}
    assert forms == {"((3*7)+12)"} and task.solution_count(problem) == 1
    assert task.score("<answer>3*7+13</answer>", problem).solution is None  # wrong: no solution
    assert task.solution_count(task.make_problem([1, 2, 3], 6)) == 3


def test_distinct_correct_solutions_are_counted():
    """distinct_correct and solution_coverage from scored answers: a problem with three solutions whose
    samples find all three (twice each) plus a wrong one, a problem with one solution, one never solved."""
    task = Countdown(test_size=1)
    problems = [task.make_problem([1, 2, 3], 6), task.make_problem([3, 7, 12], 33), task.make_problem([1, 1, 1], 3)]
    answers = [["1+2+3", "3+2+1", "1*2*3", "3*2*1", "2*3/1", "6"], ["3*7+12"] * 6, ["1*1*1"] * 6]
    found = [{sc.solution for sc in (task.score(f"<answer>{a}</answer>", p) for a in texts) if sc.correct}
             for p, texts in zip(problems, answers)]
    m = solution_metrics(task, problems, found)
    assert m["distinct_correct"] == pytest.approx((3 + 1) / 2)
    assert m["solution_coverage"] == pytest.approx((3 / 3 + 1 / 1) / 2)
    assert solution_metrics(task, problems, [set()] * 3) == {"distinct_correct": 0.0, "solution_coverage": 0.0}


def test_solvable():
    assert solvable([3, 7, 12], 33) and solvable([3, 4, 8], 6)
    assert not solvable([1, 1, 1], 100) and not solvable([7], 8) and not solvable([2, 2], 5)
    assert solvable([5, 5, 5], 0) and solvable([4, 2], "0.5") and solvable([3, 7], -4) and not solvable([3, 3], 2)
    # 5 and 6 numbers, past the parts that are looked up whole: the goal is split, and split again
    assert solvable([97, 89, 83, 79, 73, 71], 1) and solvable([2, 3, 5, 7, 11, 13], 30030)
    assert not solvable([97, 89, 83, 79, 73, 2], 10**9 + 7) and not solvable([1, 1, 1, 1, 1, 1], 1000)


def test_solvable_agrees_with_the_brute_force():
    rng = random.Random(0)
    for count in (2, 3, 3, 4):
        for _ in range(60):
            numbers = [rng.randint(1, 12) for _ in range(count)]
            target = rng.choice([rng.randint(-30, 200), rng.choice(["0.5", "2.25", "13.333333333333334", "-1.5"])])
            assert solvable(numbers, target) == bool(solutions(numbers, target)), (numbers, target)


def test_a_large_files_solvability_is_sampled(tmp_path):
    path = tmp_path / "data.jsonl"
    rows = [{"nums": [1, i], "target": i + 1 if i % 4 else 10**6} for i in range(2, 1002)]  # a quarter: none
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = Countdown(data=path, test_size=1)
    [note] = [n for n in task.notes if "no solution" in n]
    match = re.fullmatch(rf"about ([0-9]+)% of the 999 training problems of {path} have no solution \(([0-9]+) of 200 "
                         r"checked at random\): they can only score 0", note)
    assert match and 15 <= int(match.group(1)) <= 35 and abs(int(match.group(1)) - int(match.group(2)) / 2) < 1
    path.write_text("".join(json.dumps({"nums": [1, i], "target": 10**6}) + "\n" for i in range(2, 1002)))
    with pytest.raises(UserError, match=r"no training problem of 200 drawn at random from its 999 can be solved"):
        Countdown(data=path, test_size=1)


@pytest.mark.parametrize("target,reason", [
    (1e308, '"target" 1e+308 is out of range: a target written with a point or an exponent must be 0 or from 0.0001 '
            "to 1e+16 in size (an integer may be larger)"),
    (1e-7, '"target" 1e-07 is out of range'),
    (float("nan"), '"target" must be a number'),
])
def test_a_target_past_what_a_float_holds_is_out_of_range(tmp_path, target, reason):
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps({"nums": [1, 2], "target": 3}) + "\n" + json.dumps({"nums": [1, 2], "target": target}))
    with pytest.raises(UserError) as e:
        Countdown(data=path)
    assert str(e.value).startswith(f"{path} line 2: {reason}") and "\n" not in str(e.value)
    path.write_text("\n".join(json.dumps({"nums": [1, 2], "target": t}) for t in (3, 1e15, 0.0, 10**30)))
    assert len(Countdown(data=path).test_problems()) == 2  # the edges of the range, and a large integer


@pytest.mark.parametrize("count,size", [(3, 300), (4, 40)])
def test_generated_problems_are_solvable_and_splits_apart(count, size):
    task = Countdown(test_size=size, numbers=count)
    test = task.test_problems()
    assert all(solvable(p.numbers, int(p.answer)) for p in test)
    train_questions = {p.question for p in task.train_problems(2000, seed=1)}
    assert not train_questions & {p.question for p in test}


def test_varied_references_are_correct_and_varied():
    task = Countdown(test_size=1)
    problems, counts = varied_references([task.make_problem([1, 2, 3], 6)] * 30 + task.test_problems(), seed=0)
    assert counts[0] == 3 and all(c >= 1 for c in counts)
    assert all(task.score(task.solution(p), p).correct for p in problems)
    assert len({p.reference for p in problems[:30]}) == 3  # each of the three ways is drawn


def test_countdown_task_selects_the_countdown_model():
    assert train.parse_args(["--task", "countdown"])[0].model == COUNTDOWN_MODEL
    assert train.parse_args([])[0].model == SHIPPED_MODEL
    assert train.parse_args(["--task", "gsm8k"])[0].model == SHIPPED_MODEL
    assert train.parse_args(["--task", "countdown", "--model", "x"])[0].model == "x"


@needs_model
def test_eval_countdown_uses_the_countdown_model(capsys, one_thread):
    code, _ = run_in_process("eval.py", "--task", "countdown", "--problems", "2", "--n", "1", "--k", "1")
    assert code == 0
    assert capsys.readouterr().out.startswith(f"{COUNTDOWN_MODEL} on countdown")


@needs_model
def test_countdown_model_solves_some_held_out_problems(one_thread):
    model, tok = load_model(COUNTDOWN_MODEL, device="cpu"), load_tokenizer(COUNTDOWN_MODEL)
    recipe = RECIPES[model.config.minies_recipe]
    assert model.config.minies_recipe == "tiny-countdown" and recipe.settings("es")["task"] == "countdown"
    task = Countdown(prompt_style=recipe.settings("es")["prompt_style"])
    m = evaluate(model, tok, task, task.test_problems()[:40], n=4, ks=(1, 4))
    assert m["pass@4"] > 0 and m["malformed_rate"] < 0.5
    assert m["distinct_correct"] >= 1 and 0 < m["solution_coverage"] <= 1
