"""Prompt styles for instruction-tuned models, generation lengths, Countdown from a data file, and the
public answer formats (Qiu et al. / TinyZero Countdown, GSM8K) scored as they should be."""
import json
from fractions import Fraction
from pathlib import Path

import pytest

from minies import UserError
from minies.tasks import FORMAT_BONUS, TASKS, Countdown, get_task, parse_expression, qiu_rows

GSM8K_FILE = Path(__file__).parent / "data" / "gsm8k_test.jsonl"
ANSWERS_FILE = Path(__file__).parent / "data" / "answers.jsonl"
DATA = {"gsm8k": GSM8K_FILE, "answers": ANSWERS_FILE}  # the tasks that read their problems


def task(name, style, **kwargs):
    return get_task(name, data=DATA.get(name), prompt_style=style, **kwargs)


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
    ('{"nums": [3, 7], "target": "five"}', '"target"'),
    ('{"nums": [3, 7], "target": "1e5"}', '"target"'),
    ('{"nums": [3, 7], "target": 5, "context": 3}', '"context"'),
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


# ---- the papers' Countdown: Qiu et al.'s data file, prompts and rewards, TinyZero's ----

# Two rows of Qiu et al.'s published file, as published: their prompt prints the numbers as numpy does.
QIU_ROW_0 = {"id": 0, "context": "You are a helpful assistant. You first think about the reasoning process in your mind "
             "and then provide the user with the answer.Using the numbers [44 19 35], create an equation that equals "
             "98. You can use basic arithmetic operations (+, -, *, /) and each number can only be used once. Show "
             "your work in <think> </think> tags. And return the final answer in <answer> </answer> tags, for "
             "example <answer> (1 + 2) / 3 </answer>.Let me solve this step by step.\n<think>",
             "numbers": [44, 19, 35], "target": "98", "solution": "((44 + 19) + 35)"}
QIU_ROW_PADDED = dict(QIU_ROW_0, context=QIU_ROW_0["context"].replace("[44 19 35]", "[83 78  1 39]").replace(
    "equals 98.", "equals 82."), numbers=[83, 78, 1, 39], target="82", solution="((83 - (78 / 39)) + 1)")
QIU_ROW_FRACTION = {"id": 1, "numbers": [60, 10, 57, 80], "target": "266.6666666666667",
                    "solution": "((10 / (60 - 57)) * 80)"}


def qiu_file(tmp_path, rows):
    path = tmp_path / "countdown.json"
    path.write_text(json.dumps(rows, indent=2))
    return str(path)


def test_qiu_prompts_are_the_published_context(tmp_path, tokenizer):
    t = get_task("countdown", data=qiu_file(tmp_path, [QIU_ROW_0, QIU_ROW_PADDED, QIU_ROW_FRACTION]),
                 prompt_style="qiu", train_problems=1)
    built = Countdown(prompt_style="qiu", test_size=1)
    for row in (QIU_ROW_0, QIU_ROW_PADDED):
        problem = next(p for p in t.train_problems(1, 0) + t.test_problems() if p.numbers == tuple(row["numbers"]))
        # Fed as raw text, whatever the tokenizer's chat template, and the same when built from the numbers.
        assert t.prompts(tokenizer, [problem]) == [row["context"]]
        assert built.make_problem(row["numbers"], row["target"]).question == row["context"]
    assert t.reward == "qiu" and t.max_new_tokens == 1024


def test_qiu_file_loads_and_its_training_rows_score_the_maximum(tmp_path):
    """A 2,200-row file in Qiu et al.'s format (string targets, non-integer ones, context, solution): the first
    200 rows train, the last 2,000 test, and every reference solution in their envelope earns 1.1."""
    rows = qiu_rows(2200, seed=0)
    assert {type(r["target"]) for r in rows} == {str} and any("." in r["target"] for r in rows)
    t = get_task("countdown", data=qiu_file(tmp_path, rows), prompt_style="qiu", train_problems=200)
    train, test = t.train_problems(200, seed=0), t.test_problems()
    assert sorted(p.question for p in train) == sorted(r["context"] for r in rows[:200])
    assert [p.question for p in test] == [r["context"] for r in rows[200:]] and len(test) == 2000
    assert t.train_problems(200, seed=1) != train and set(t.train_problems(200, seed=1)) == set(train)
    for p in train + [p for p in test if "." in p.answer]:
        s = t.score(f"Adding them up.</think>\n<answer>{p.reference}</answer>", p)
        assert s.correct and s.reward == pytest.approx(1.1) and s.format == 1.0, (p.numbers, p.answer, p.reference)


@pytest.mark.parametrize("reward", ["minies", "qiu", "tinyzero"])
def test_non_integer_targets_are_reached_within_the_graders_tolerance(tmp_path, reward):
    t = get_task("countdown", data=qiu_file(tmp_path, [QIU_ROW_0, QIU_ROW_FRACTION]), prompt_style="qiu",
                 train_problems=1, reward=reward)
    [p] = t.test_problems()
    assert p.answer == "266.6666666666667" and t.solution_count(p) == 1  # 10/(60-57)*80 is 800/3
    assert t.score("</think>\n<answer>10 / (60 - 57) * 80</answer>", p).correct
    assert not t.score("</think>\n<answer>10 / (60 - 57) * 81</answer>", p).correct


# Completions for [44, 19, 35] -> 98 and their reward under each scheme: minies, Qiu et al., TinyZero.
REWARD_TABLE = [
    ("44+19=63, 63+35=98</think>\n<answer>44 + 19 + 35</answer>", 1.1, 1.1, 1.0),  # correct, in the envelope
    ("44+19+35=98</think>\n<answer>44 + 19 + 35 = 98</answer>", 0.0, 0.1, 0.1),  # an equation, not an expression
    ("44+19+35=98</think><answer>44 + 19 + 35</answer>", 1.1, 1.06, 1.0),  # no newline between the tags
    ("44+19+35=98</think>\n<answer>44 + 19 + 35</answer>\nDone.", 1.1, 1.06, 0.0),  # the answer is not last
    ("</think>\n<answer>(44 - 19) * 35</answer>", 0.1, 0.1, 0.1),  # the given numbers, a wrong value
    ("</think>\n<answer>44 + 19 + 19</answer>", 0.1, 0.1, 0.1),  # a number used twice
    ("</think>\n<answer>The answer is 98</answer>", 0.0, 0.1, 0.1),  # prose inside the tag
    ("<answer>44 + 19 + 35</answer>", 1.1, 1.05, 1.0),  # no think block
    ("</think>\n<answer>-(-44) + 19 + 35</answer>", 0.0, 1.1, 1.0),  # Python's unary minus: the graders accept it
    ("</think>\n<answer>44 + 19 + 35.0</answer>", 1.1, 0.1, 0.1),  # "35.0": minies reads 35, the graders 35 and 0
    ("44 + 19 + 35 = 98", 0.0, 0.0, 0.0),  # no tags
    ("The answer is 44 + 19 + 35.", 0.0, 0.0, 0.0),  # prose
    ("Let me try 44 + 19 and then", 0.0, 0.0, 0.0),  # a trace cut off by the token limit
    ("</think>\n<answer>44 + 19 + 35</answer>\n", 1.1, 1.1, 0.0),  # one final newline: still Qiu's envelope
]


@pytest.mark.parametrize("completion,minies,qiu,tinyzero", REWARD_TABLE)
def test_the_reward_table(completion, minies, qiu, tinyzero):
    for reward, expected in (("minies", minies), ("qiu", qiu), ("tinyzero", tinyzero)):
        t = Countdown(prompt_style="qiu", reward=reward, test_size=1)
        assert t.score(completion, t.make_problem([44, 19, 35], 98)).reward == pytest.approx(expected), reward


def test_qiu_envelope_matches_its_regular_expression():
    import random
    import re

    from minies.tasks.countdown import qiu_envelope

    regex = re.compile(r"^<think>.*?</think>\n<answer>.*?</answer>$", re.DOTALL)
    rng = random.Random(0)
    pieces = ["<think>", "</think>", "\n", "<answer>", "</answer>", "x", "</think>\n<answer>"]
    for _ in range(5000):
        text = "<think>" + "".join(rng.choice(pieces) for _ in range(rng.randint(0, 8)))
        assert qiu_envelope(text) == bool(regex.match(text)), text


def test_tinyzero_prompt_in_chatml_and_without_a_template(tokenizer):
    from bench.qwen_shapes import chatml_tokenizer

    t = Countdown(prompt_style="tinyzero", test_size=1)
    p = t.make_problem([44, 19, 35], 98)
    rules = ("create an equation that equals 98. You can use basic arithmetic operations (+, -, *, /) and each "
             "number can only be used once. Show your work in <think> </think> tags. And return the final answer "
             "in <answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>.")
    assert t.prompts(chatml_tokenizer(), [p]) == [
        "<|im_start|>system\nYou are a helpful assistant. You first thinks about the reasoning process in the mind "
        "and then provides the user with the answer.<|im_end|>\n<|im_start|>user\n Using the numbers [44, 19, 35], "
        + rules + "<|im_end|>\n<|im_start|>assistant\nLet me solve this step by step.\n<think>"]
    assert t.prompts(tokenizer, [p], chat_template=False) == [
        "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. The "
        "assistant first thinks about the reasoning process in the mind and then provides the user with the "
        "answer.\nUser: Using the numbers [44, 19, 35], " + rules + "\nAssistant: Let me solve this step by "
        "step.\n<think>"]
    assert t.reward == "tinyzero"


def test_the_papers_rewards_are_for_countdown_only():
    with pytest.raises(UserError, match="--reward qiu: --task arithmetic offers minies"):
        get_task("arithmetic", reward="qiu")
    with pytest.raises(UserError, match="--prompt-style qiu: --task gsm8k offers terse, instruct"):
        get_task("gsm8k", data=GSM8K_FILE, prompt_style="qiu")
