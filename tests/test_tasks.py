"""Tasks: ground truth, verifiers on good / wrong / hostile completions, splits, and data loading."""
import json
import random
import re
import time
from pathlib import Path

import pytest

from minies import UserError
from minies.tasks import (ANSWER_TAG, FORMAT_BONUS, GSM8K, TASKS, Arithmetic, Countdown, Problem,
                          SolvedProblem, get_task, last_answer_tag)

GSM8K_FILE = Path(__file__).parent / "data" / "gsm8k_test.jsonl"
ANSWERS_FILE = Path(__file__).parent / "data" / "answers.jsonl"
DATA = {"gsm8k": GSM8K_FILE, "answers": ANSWERS_FILE}  # the tasks that read their problems

# Hostile completions: each must be scored within a fraction of a second, without exceptions.
HOSTILE = [
    "<answer>" * 12500,  # 100k chars of unclosed tags
    "<answer>" + "(" * 100000 + "</answer>",  # deep nesting, far past the recursion limit
    "<answer>" + "(" * 90 + "1" + ")" * 90 + "</answer>",  # deep nesting within the length cap
    "<answer>" + "1+" * 50000 + "1</answer>",
    "<answer>" + "9" * 100000 + "</answer>",  # a huge number
    "<answer>9**9**9**9</answer>",
    "<answer>9^9^9</answer>",
    "<answer>__import__('os').system('true')</answer>",
    "<answer>(1).__class__</answer>",
    "1" * 100000,
    "",
]


def assert_fast(task, problem):
    for completion in HOSTILE:
        start = time.perf_counter()
        s = task.score(completion, problem)
        assert time.perf_counter() - start < 1.0, completion[:40]
        assert not s.correct


def rewards(task, problem, completions):
    return [task.score(c, problem).reward for c in completions]


# ---- shared helpers ----

def test_last_answer_tag_matches_the_regex_definition():
    rng = random.Random(0)
    pieces = ["<answer>", "</answer>", "<answer", "answer>", "1", " ", "\n"]
    for _ in range(2000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        found = ANSWER_TAG.findall(text)
        assert last_answer_tag(text) == (found[-1].strip() if found else None), text


def test_last_answer_tag_is_linear_on_unclosed_tags():
    start = time.perf_counter()
    assert last_answer_tag("<answer>" * 12500) is None
    assert last_answer_tag("<answer>1</answer>" + "<answer>" * 12500) == "1"
    assert time.perf_counter() - start < 1.0


# ---- arithmetic ----

def test_arithmetic_scores():
    task = Arithmetic()
    p = Problem("5+7+0", "12")
    assert rewards(task, p, ["<answer>12</answer>", "<answer>13</answer>", "12", ""]) == pytest.approx(
        [1 + FORMAT_BONUS, FORMAT_BONUS, 0.0, 0.0])
    s = task.score("<answer>13</answer> <answer> 12 </answer>", p)  # the last tag counts
    assert s.correct and not s.malformed
    assert task.score("<answer>twelve</answer>", p).malformed
    assert task.score(task.solution(p), p).correct


def test_arithmetic_never_scores_the_prompt():
    # Even a prompt that contains the right tagged answer earns nothing: only the completion is read.
    task = Arithmetic()
    p = Problem("Example: <answer>12</answer>. Now: 5+7+0", "12")
    s = task.score("", p)
    assert s.malformed and not s.correct and s.reward == 0.0


def test_arithmetic_hostile():
    assert_fast(Arithmetic(), Problem("5+7+0", "12"))


def test_arithmetic_ground_truth():
    for p in Arithmetic(test_size=50).test_problems():
        assert sum(int(x) for x in p.question.split("+")) == int(p.answer)


# ---- countdown ----

COUNTDOWN = Countdown(test_size=1).make_problem([3, 7, 12], 33)


@pytest.mark.parametrize("expr", ["3*7+12", "12+7*3", " ( 12 + 7 * 3 ) ", "((3*7))+12", "7*3+12", "3.0*7+12"])
def test_countdown_correct(expr):
    s = Countdown(test_size=1).score(f"thinking <answer>1</answer> <answer>{expr}</answer>", COUNTDOWN)
    assert s.correct and not s.malformed and s.reward == pytest.approx(1 + FORMAT_BONUS)



def test_countdown_exact_fractions():
    p = Countdown(test_size=1).make_problem([3, 4, 8], 6)
    assert Countdown(test_size=1).score("<answer>8/(4/3)</answer>", p).correct  # 4/3 is not a float here


@pytest.mark.parametrize("expr", [
    "3*7*12",  # wrong value
    "21+12",  # not the given numbers
    "3*7+12+0",  # an extra number
    "3*7+12-3+3",  # a number used three times
    "3+7+12",  # all numbers, wrong value
    "33",
    "1.5*22",
])
def test_countdown_wrong_but_well_formed(expr):
    s = Countdown(test_size=1).score(f"<answer>{expr}</answer>", COUNTDOWN)
    assert not s.correct and not s.malformed and s.reward == pytest.approx(FORMAT_BONUS)


@pytest.mark.parametrize("completion", [
    "3*7+12",  # no tag
    "<answer></answer>",
    "<answer>7*3-(-12)</answer>",  # unary minus is not allowed
    "<answer>3**7+12</answer>",
    "<answer>3^7+12</answer>",
    "<answer>3*7+12)</answer>",
    "<answer>(3*7+12</answer>",
    "<answer>3 7 12</answer>",
    "<answer>1e3</answer>",
    "<answer>x+3</answer>",
    "<answer>3*7+12.</answer>",
    "<answer>12/(7-7)*3</answer>",  # division by zero has no value
    "<answer>" + "(" * 11 + "3*7+12" + ")" * 11 + "</answer>",  # deeper than MAX_DEPTH
    "<answer>3*7" + " " * 200 + "+12</answer>",  # longer than MAX_CHARS
    "<answer>٣*7+12</answer>",  # non-ASCII digits
])
def test_countdown_malformed(completion):
    s = Countdown(test_size=1).score(completion, COUNTDOWN)
    assert s.malformed and not s.correct and s.reward == 0.0


def test_countdown_hostile():
    assert_fast(Countdown(test_size=1), COUNTDOWN)


def test_countdown_is_deterministic_from_the_seed():
    a, b, c = Countdown(seed=1, test_size=50), Countdown(seed=1, test_size=50), Countdown(seed=2, test_size=50)
    assert [p.question for p in a.test_problems()] == [p.question for p in b.test_problems()]
    assert [p.reference for p in a.test_problems()] == [p.reference for p in b.test_problems()]
    assert a.train_problems(20, seed=3) == b.train_problems(20, seed=3)
    assert a.test_problems() != c.test_problems()
    assert a.train_problems(20, seed=3) != a.train_problems(20, seed=4)


def test_countdown_references_are_correct_and_targets_reachable():
    task = Countdown()
    problems = task.test_problems() + task.train_problems(500, seed=0)
    assert len(task.test_problems()) == 500
    for p in problems:
        m = re.fullmatch(r"Use (\d+) (\d+) (\d+) to make (\d+)", p.question)
        assert m and all(1 <= int(x) <= 20 for x in m.groups()[:3])
        assert int(p.answer) > 0 and m[4] == p.answer
        assert sorted(re.findall(r"\d+", p.reference)) == sorted(m.groups()[:3])
        s = task.score(task.solution(p), p)
        assert s.correct and s.reward == pytest.approx(1 + FORMAT_BONUS), (p, task.solution(p))
        assert len(p.reference) + 3 <= task.max_new_tokens  # characters + two tag tokens + EOS


def test_countdown_options():
    task = Countdown(test_size=100, numbers=4, low=1, high=9)
    for p in task.test_problems():
        assert len(p.question.split()) == 4 + 4 and task.score(task.solution(p), p).correct
    with pytest.raises(UserError):
        Countdown(low=0)


def test_solved_problem_equality_ignores_the_reference():
    a, b = SolvedProblem("q", "1", "x"), SolvedProblem("q", "1", "y")
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1


# ---- splits, for every task ----

@pytest.mark.parametrize("name,style", [(name, style) for name in sorted(TASKS) for style in ("terse", "instruct")])
def test_train_and_test_never_overlap(name, style):
    task = get_task(name, seed=0, data=DATA.get(name), prompt_style=style)
    test = {p.question for p in task.test_problems()}
    train = task.train_problems(2000, seed=0)
    assert len(test) == len(task.test_problems()) > 0 and len(train) == 2000
    assert not test & {p.question for p in train}
    assert task.max_new_tokens > 0


# ---- gsm8k ----

def test_gsm8k_every_reference_answer_scores_correct():
    rows = [json.loads(line) for line in GSM8K_FILE.read_text().splitlines()]
    assert len(rows) == 1319
    task, lenient = GSM8K(data=GSM8K_FILE), GSM8K(data=GSM8K_FILE, lenient=True)
    n_train = len(rows) - len(task.test_problems())
    by_question = {p.question: p for p in task.test_problems() + task.train_problems(n_train, seed=0)}
    assert set(by_question) == {r["question"] for r in rows}  # one train pass covers the rest, once each
    for r in rows:
        p = by_question[r["question"]]
        assert task.solution(p).startswith(r["answer"].rpartition("####")[0].rstrip())
        assert task.score(task.solution(p), p).correct
        # The file's own "#### 42" line is an answer only to the lenient reading.
        s = lenient.score(r["answer"], p)
        assert s.correct and not s.malformed, r["answer"][-40:]
        assert task.score(r["answer"], p).malformed


def test_gsm8k_split_is_seeded():
    a, b, c = (GSM8K(seed=s, data=GSM8K_FILE) for s in (0, 0, 1))
    assert len(a.test_problems()) == 500
    assert a.test_problems() == b.test_problems() != c.test_problems()
    assert a.train_problems(10, seed=0) == b.train_problems(10, seed=0)
    assert len(GSM8K(data=GSM8K_FILE, test_size=5000).test_problems()) == 1319 // 2


@pytest.mark.parametrize("completion,answer,correct", [
    ("so she makes $18 a day.\n#### 18", "18", True),
    ("The answer is 1,000.", "1000", True),
    ("<answer>$1,450,000.</answer>", "1450000", True),
    ("<answer>3.50</answer>", "3.5", True),
    ("It is -3.", "-3", True),
    ("16-3-4=9", "9", True),  # subtraction is not a sign
    ("16-3-4=9", "-4", False),
    ("x = 5 - 10 = -5", "-5", True),
    ("<answer>18</answer> then 19", "18", True),  # the tag beats a later number
    ("\\boxed{42} and 7 more", "42", True),  # \boxed beats a later number
    ("\\boxed{1} \\boxed{2}", "2", True),
    ("<answer>17</answer>", "18", False),
    ("I think 0.5", ".5", True),
    ("1" * 100, "1", False),
])
def test_gsm8k_score(completion, answer, correct):
    task = GSM8K(data=GSM8K_FILE, test_size=1, lenient=True)
    s = task.score(completion, Problem("q", answer))
    assert s.correct == correct and not s.malformed
    assert s.reward == pytest.approx(float(correct) + FORMAT_BONUS)


@pytest.mark.parametrize("completion", ["", "no number here", "<answer>eighteen</answer> 18", "\\boxed{x} 18"])
def test_gsm8k_malformed(completion):
    s = GSM8K(data=GSM8K_FILE, test_size=1, lenient=True).score(completion, Problem("q", "18"))
    assert s.malformed and not s.correct and s.reward == 0.0


@pytest.mark.parametrize("completion,correct", [
    ("<answer>18</answer>", True),
    ("so \\boxed{18}", True),
    ("<answer>17</answer> so 18", False),
])
def test_gsm8k_strict_reads_only_the_tag_or_boxed(completion, correct):
    s = GSM8K(data=GSM8K_FILE, test_size=1).score(completion, Problem("q", "18"))
    assert s.correct == correct and not s.malformed


@pytest.mark.parametrize("completion", ["so she makes $18 a day.\n#### 18", "The answer is 18", "18"])
def test_gsm8k_strict_ignores_untagged_numbers(completion):
    """Training rewards are strict: a number outside the tag or \\boxed{} (a cut-off trace whose last
    number happens to be right) earns nothing; only the lenient evaluation reads it."""
    problem = Problem("q", "18")
    assert GSM8K(data=GSM8K_FILE, test_size=1).score(completion, problem).malformed
    assert GSM8K(data=GSM8K_FILE, test_size=1, lenient=True).score(completion, problem).correct


def test_gsm8k_hostile():
    assert_fast(GSM8K(data=GSM8K_FILE, test_size=1), Problem("q", "18"))


def test_gsm8k_needs_data(tmp_path):
    for call in (lambda: GSM8K(), lambda: get_task("gsm8k", data=None)):
        with pytest.raises(UserError, match="--data"):
            call()
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(UserError) as e:
        GSM8K(data=missing)
    assert str(missing) in str(e.value) and "\n" not in str(e.value)


GOOD = json.dumps({"question": "1+1?", "answer": "1+1=2\n#### 2"})


@pytest.mark.parametrize("bad", [
    "{not json",
    json.dumps({"question": "q"}),
    json.dumps({"answer": "#### 2"}),
    json.dumps({"question": "q", "answer": "2"}),  # no ####
    json.dumps({"question": "q", "answer": "#### two"}),
    json.dumps({"question": "q", "answer": 2}),
    json.dumps(["q", "#### 2"]),
])
def test_gsm8k_malformed_line(tmp_path, bad):
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join([GOOD, json.dumps({"question": "2+2?", "answer": "#### 4"}), bad, GOOD]) + "\n")
    with pytest.raises(UserError) as e:
        GSM8K(data=path)
    message = str(e.value)
    assert str(path) in message and "line 3" in message and "\n" not in message


@pytest.mark.parametrize("bad,reason", [
    (json.dumps({"question": "", "answer": "#### 2"}), '"question" is empty: there is nothing to ask'),
    (json.dumps({"question": " \n", "answer": "#### 2"}), '"question" is empty'),
    (json.dumps({"question": "q", "answer": "#### " + "9" * 100}),
     'the answer after "####" has 100 characters; scoring reads numbers of at most 40, so no completion could be '
     "right"),
])
def test_gsm8k_rows_that_cannot_be_answered_right_are_errors(tmp_path, bad, reason):
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join([GOOD, json.dumps({"question": "2+2?", "answer": "#### 4"}), bad]) + "\n")
    with pytest.raises(UserError) as e:
        GSM8K(data=path)
    assert str(e.value).startswith(f"{path} line 3: {reason}") and "\n" not in str(e.value)
    path.write_text("\n".join([GOOD, json.dumps({"question": "big?", "answer": "#### 1" + ",000" * 13})]) + "\n")
    assert len(GSM8K(data=path).test_problems()) == 1  # 40 characters once its commas are gone: it can be answered


def test_gsm8k_small_file(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text(GOOD + "\n\n" + json.dumps({"question": "2+2?", "answer": "#### 4"}) + "\n")
    task = get_task("gsm8k", seed=0, data=str(path))
    assert len(task.test_problems()) == 1 and len(task.train_problems(3, seed=0)) == 3
    path.write_text(GOOD + "\n")
    with pytest.raises(UserError, match="at least 2"):
        GSM8K(data=path)


# ---- data regimes: --eval-data, --train-problems, the single-file fallback ----

def test_eval_data_is_the_whole_test_split_and_training_never_sees_it(tmp_path):
    rows = GSM8K_FILE.read_text().splitlines()
    train_file = tmp_path / "train.jsonl"
    train_file.write_text("\n".join(rows[:700]) + "\n")  # 700 rows, all of them also in the test file
    extra = [json.dumps({"question": f"What is {i} + 1?", "answer": f"#### {i + 1}"}) for i in range(30)]
    train_file.write_text("\n".join(rows[:700] + extra) + "\n")
    task = GSM8K(data=train_file, eval_data=GSM8K_FILE)
    assert [p.question for p in task.test_problems()] == [json.loads(r)["question"] for r in rows]  # all 1,319
    assert task.notes == ["700 problem(s) of --data are also in --eval-data: left out of training"]
    assert {p.question for p in task.train_problems(60, seed=0)} == {json.loads(r)["question"] for r in extra}
    alone = GSM8K(data=GSM8K_FILE)  # the fallback: one file split in two, and a note saying so
    assert len(alone.test_problems()) == 500 and "no --eval-data" in alone.notes[0]
    with pytest.raises(UserError, match="every problem is also in --eval-data"):
        GSM8K(data=GSM8K_FILE, eval_data=GSM8K_FILE)


def test_gsm8k_evaluates_without_training_data_but_cannot_train():
    task = GSM8K(eval_data=GSM8K_FILE)
    assert len(task.test_problems()) == 1319
    with pytest.raises(UserError, match="--data FILE to train on"):
        task.train_problems(1, seed=0)


def test_train_problems_is_a_fixed_set():
    task = Countdown(train_problems=6, prompt_style="instruct")
    first = task.train_problems(6, seed=0)
    assert len(set(first)) == 6 and set(task.train_problems(6, seed=1)) == set(first)
    assert sorted(p.question for p in task.train_problems(12, seed=2)) == sorted(2 * [p.question for p in first])
    assert not {p.question for p in first} & {p.question for p in task.test_problems()}


def test_train_problems_takes_the_first_rows_of_a_file(tmp_path):
    rows = [json.dumps({"numbers": [i, 1, 2], "target": i + 3}) for i in range(1, 11)]
    path = tmp_path / "cd.jsonl"
    path.write_text("\n".join(rows) + "\n")
    task = Countdown(data=path, train_problems=4)
    assert sorted(p.numbers[0] for p in task.train_problems(4, seed=0)) == [1, 2, 3, 4]
    assert [p.numbers[0] for p in task.test_problems()] == list(range(5, 11))  # the rest, in the file's order
    with pytest.raises(UserError, match="--train-problems 10: .* has 10 problems"):
        Countdown(data=path, train_problems=10)


@pytest.mark.parametrize("completion,answer", [
    ("so \\boxed{18 \\text{ dollars}}.", "18"),
    ("\\boxed{\\$1,450} and then \\boxed{2", "1,450"),  # an unclosed box at the end: the last complete one
    ("\\boxed{a \\boxed{7}}", "7"),
])
def test_gsm8k_boxed_braces_nest(completion, answer):
    task = GSM8K(eval_data=GSM8K_FILE, test_size=1)
    s = task.score(completion, Problem("q", answer.replace(",", "")))
    assert s.correct and s.answer == answer
