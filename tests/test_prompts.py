"""Prompt styles for instruction-tuned models, generation lengths, Countdown from a data file, and the
public answer formats (Qiu et al. / TinyZero Countdown, GSM8K) scored as they should be."""
import json
from fractions import Fraction
from pathlib import Path

import pytest

from minies import UserError
from minies.tasks import FORMAT_BONUS, TASKS, Countdown, get_task, parse_expression

GSM8K_FILE = Path(__file__).parent / "data" / "gsm8k_test.jsonl"


def task(name, style, **kwargs):
    return get_task(name, data=GSM8K_FILE if name == "gsm8k" else None, prompt_style=style, **kwargs)


@pytest.mark.parametrize("name,terse,instruct", [("arithmetic", 10, 256), ("countdown", 32, 1024),
                                                 ("gsm8k", 256, 512)])
def test_max_new_tokens_per_task_and_style(name, terse, instruct):
    assert task(name, "terse").max_new_tokens == terse
    assert task(name, "instruct").max_new_tokens == instruct
    assert task(name, "instruct", max_new_tokens=64).max_new_tokens == 64


def test_instruct_prompts_state_the_answer_format():
    for name in TASKS:
        question = task(name, "instruct").test_problems()[0].question
        assert "<answer>" in question and "</answer>" in question, name
    countdown = task("countdown", "instruct").test_problems()[0]
    assert "<think>" in countdown.question and "exactly once" in countdown.question
    assert f"equals {countdown.answer}." in countdown.question
    assert str(list(countdown.numbers)).replace(" ", "") in countdown.question.replace(" ", "")
    assert "step by step" in task("gsm8k", "instruct").test_problems()[0].question
    # The terse style is unchanged: the shipped models were trained on it.
    assert task("arithmetic", "terse").test_problems()[0].question.count("+") == 1
    assert task("countdown", "terse").test_problems()[0].question.startswith("Use ")


def test_unknown_style_is_one_line():
    with pytest.raises(UserError, match="--prompt-style"):
        task("arithmetic", "chatty")


def test_instruct_countdown_is_tinyzero_shaped_and_solvable():
    t = task("countdown", "instruct")
    problems = t.test_problems() + t.train_problems(300, seed=1)
    assert {len(p.numbers) for p in problems} == {3, 4}
    for p in problems:
        assert all(1 <= n <= 99 for n in p.numbers) and 1 <= int(p.answer) <= 100
        value, literals, _ = parse_expression(p.reference, 200, 10)  # the reference solves it
        assert value == Fraction(p.answer) and sorted(literals) == sorted(map(Fraction, p.numbers))


QIU = "<think>3 * 3 = 9, so (1 + 2) * 3 = 9.</think>\n<answer>(1 + 2) * 3</answer>"


@pytest.mark.parametrize("completion,correct,malformed", [
    (QIU, True, False),
    ("<think>ok</think>\n<answer> (2 + 1) * 3 </answer>", True, False),
    ("<think>ok</think>\n<answer>(1 + 2) * 4</answer>", False, False),  # a wrong number
    ("<think>ok</think>\n<answer>(1 + 2) * 3 * 3</answer>", False, False),  # a number used twice
    ("<think>ok</think>\n<answer>(1 + 2) + 3</answer>", False, False),  # all numbers, wrong value
    ("<think>ok</think>\n<answer>(1 + 2) * 3 = 9</answer>", False, True),  # not an expression
    ("The answer is (1 + 2) * 3 = 9.", False, True),  # prose, no tag
    ("<think>Let me try (1 + 2) * 3 and then", False, True),  # a trace cut off by the token limit
    ("<answer>(1 + 2) * 3</answer>", True, False),  # no think block: still the right answer
])
def test_qiu_format_completions(completion, correct, malformed):
    t = task("countdown", "instruct")
    s = t.score(completion, t.make_problem([1, 2, 3], 9))
    assert (s.correct, s.malformed) == (correct, malformed)
    assert s.reward == pytest.approx(float(correct) + FORMAT_BONUS * (not malformed))


def write(path, text):
    path.write_text(text)
    return str(path)


def test_countdown_reads_jsonl_and_json_lists_with_either_name(tmp_path):
    rows = [{"nums": [3, 7, 12], "target": 33}, {"numbers": [1, 2, 3, 4], "target": 10},
            {"nums": [5, 5, 2], "target": 50}, {"numbers": [1, 2, 3, 4], "target": 10}]  # a repeat
    jsonl = write(tmp_path / "cd.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n\n")
    listed = write(tmp_path / "cd.json", json.dumps(rows))
    for path in (jsonl, listed):
        t = get_task("countdown", data=path, prompt_style="instruct", seed=0)
        every = t.test_problems() + t.train_problems(2, seed=0)
        assert len(t.test_problems()) == 1 and {p.answer for p in every} == {"33", "10", "50"}
        p = next(p for p in every if p.answer == "33")
        assert p.numbers == (3, 7, 12) and t.score("<answer>3*7+12</answer>", p).correct


@pytest.mark.parametrize("bad,why", [
    ('{"nums": [3, 7], "target"', "Expecting"),
    ('{"target": 5}', '"numbers"'),
    ('{"nums": [3, "7"], "target": 5}', '"numbers"'),
    ('{"nums": [3, 0], "target": 5}', '"numbers"'),
    ('{"nums": [3, 7], "target": 5.5}', '"target"'),
    ('[3, 7, 10]', "JSON object"),
])
def test_countdown_bad_row_is_one_line(tmp_path, bad, why):
    good = json.dumps({"nums": [1, 2, 3], "target": 6})
    path = write(tmp_path / "cd.jsonl", "\n".join([good, json.dumps({"nums": [2, 2], "target": 4}), bad]) + "\n")
    with pytest.raises(UserError) as e:
        get_task("countdown", data=path)
    message = str(e.value)
    assert message.startswith(f"{path} line 3: ") and why in message and "\n" not in message


def test_countdown_bad_json_list_names_the_row(tmp_path):
    path = write(tmp_path / "cd.json", json.dumps([{"nums": [1, 2], "target": 3}, {"nums": [1, 2]}]))
    with pytest.raises(UserError, match=r"cd\.json row 2: .*target"):
        get_task("countdown", data=path)


def test_data_for_a_task_that_reads_none_is_one_line(tmp_path):
    path = write(tmp_path / "x.jsonl", "{}\n")
    with pytest.raises(UserError, match="--task arithmetic .* reads no data file"):
        get_task("arithmetic", data=path)
    assert isinstance(get_task("countdown"), Countdown)  # generated when no file is given


@pytest.mark.parametrize("digits", ["１２", "١٢", "१२"])
def test_verifiers_read_ascii_digits_only(digits):
    arithmetic = get_task("arithmetic")
    problem = arithmetic.test_problems()[0]
    s = arithmetic.score(f"<answer>{digits}</answer>", type(problem)(problem.question, "12"))
    assert s.malformed and not s.correct
    gsm8k = task("gsm8k", "instruct")
    assert gsm8k.score(f"<answer>{digits}</answer>", type(problem)("q", "12")).malformed
