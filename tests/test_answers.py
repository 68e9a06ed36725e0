"""--task answers: rows of prompt and answer checked by --match exact | number | boxed | choice, and the rows a
reading refuses in one line with the file and line."""
import importlib.util
import json
import sys

import pytest

from minies import UserError
from minies.tasks import get_task
from tests.conftest import REPO, assert_one_line_error, run_in_process

ANSWERS_FILE = REPO / "tests" / "data" / "answers.jsonl"
needs_math_verify = pytest.mark.skipif(importlib.util.find_spec("math_verify") is None,
                                       reason="needs math-verify (pip install math-verify)")


def rows_file(tmp_path, rows, name="rows.jsonl"):
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def answers(tmp_path, match, answer_rows, **kwargs):
    """The task on `answer_rows` ((prompt, answer) pairs) with 8 filler rows, and the problem of the first row."""
    filler = "A" if match == "choice" else "1"
    rows = [{"prompt": p, "answer": a} for p, a in answer_rows] + [{"question": f"q{i}", "answer": filler}
                                                                   for i in range(8)]
    task = get_task("answers", data=str(rows_file(tmp_path, rows)), eval_data=str(rows_file(tmp_path, rows[:1], "e")),
                    match=match, **kwargs)
    return task, task.test_problems()[0]


@pytest.mark.parametrize("match,answer,completion,correct,malformed", [
    ("exact", "Paris", "<answer> Paris </answer>", True, False),
    ("exact", "Paris", "<answer>paris</answer>", False, False),
    ("exact", "Paris", "Paris", False, True),
    ("number", "1000", "<answer>$1,000.</answer>", True, False),
    ("number", 3.5, "so \\boxed{3.50}", True, False),
    ("number", "7", "<answer>seven</answer>", False, True),
    ("choice", "(b)", "<answer>B)</answer>", True, False),
    ("choice", "B", "<answer>C</answer>", False, False),
    ("choice", "B", "<answer>BC</answer>", False, True),
])
def test_each_match_reads_and_compares_answers(match, answer, completion, correct, malformed, tmp_path):
    task, problem = answers(tmp_path, match, [("Q?", answer)])
    score = task.score(completion, problem)
    assert (score.correct, score.malformed) == (correct, malformed)


@needs_math_verify
@pytest.mark.parametrize("answer,completion,correct,malformed", [
    ("0.5", "it is \\boxed{\\frac{1}{2}}", True, False),
    ("1/2", "\\boxed{0.5}", True, False),
    ("[1, 2)", "\\boxed{[1,2)}", True, False),
    ("\\{1, 2\\}", "\\boxed{\\{2, 1\\}}", True, False),
    ("x + 1", "\\boxed{1 + x}", True, False),
    ("x + 1", "\\boxed{x + 2}", False, False),
    ("18", "18 with no box", False, True),
])
def test_boxed_compares_as_mathematics(answer, completion, correct, malformed, tmp_path):
    task, problem = answers(tmp_path, "boxed", [("Q?", answer)])
    score = task.score(completion, problem)
    assert (score.correct, score.malformed) == (correct, malformed)


def test_boxed_without_math_verify_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)  # import math_verify raises ImportError
    with pytest.raises(UserError, match="pip install math-verify"):
        answers(tmp_path, "boxed", [("Q?", "1")])


BAD_ROWS = {  # name -> (the bad row, match, what the error says)
    "no prompt": ({"answer": "1"}, "exact", 'no "prompt"'),
    "both prompt and question": ({"prompt": "a", "question": "b", "answer": "1"}, "exact", "once"),
    "empty prompt": ({"prompt": "  ", "answer": "1"}, "exact", "non-empty text"),
    "prompt not text": ({"prompt": ["a"], "answer": "1"}, "exact", "non-empty text"),
    "no answer": ({"prompt": "a"}, "exact", '"answer" must be'),
    "not a number": ({"prompt": "a", "answer": "many"}, "number", "not a number"),
    "not a letter": ({"prompt": "a", "answer": "AB"}, "choice", "not one letter"),
    "bad JSON": ('{"prompt": "a", "answer": }', "exact", "Expecting value"),
}


@pytest.mark.parametrize("name", list(BAD_ROWS))
def test_a_bad_row_is_one_line_with_its_file_and_line(name, tmp_path):
    row, match, says = BAD_ROWS[name]
    filler = "A" if match == "choice" else "1"
    path = rows_file(tmp_path, [{"prompt": f"q{i}", "answer": filler} for i in range(3)] + [row])
    with pytest.raises(UserError, match=f"{path} line 4: .*{says}"):
        get_task("answers", data=str(path), match=match)


def test_non_utf8_data_is_one_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"prompt": "caf\xe9", "answer": "1"}\n' * 3)
    with pytest.raises(UserError, match=f"--data {path}: cannot read it \\(not UTF-8 text\\)"):
        get_task("answers", data=str(path))


def test_match_belongs_to_answers_and_answers_needs_data(tmp_path, model_dir, capsys):
    with pytest.raises(UserError, match="only --task answers"):
        get_task("arithmetic", match="exact")
    code, _ = run_in_process("train.py", "--model", model_dir, "--out", tmp_path, "--task", "answers")
    assert "--data FILE" in assert_one_line_error("answers without data", code, capsys.readouterr().err)


def test_train_and_eval_on_answers(tmp_path, model_dir, one_thread, capsys):
    code, _ = run_in_process("train.py", "--model", model_dir, "--out", tmp_path, "--task", "answers", "--data",
                             ANSWERS_FILE, "--match", "number", "--algo", "grpo", "--prompts", 2, "--group-size", 2,
                             "--steps", 1, "--eval-problems", 2, "--final-samples", 1, "--eval-every", 0)
    out = capsys.readouterr()
    assert code == 0 and "after:" in out.out, out.err[-2000:]
    assert "holding out 30 of the 60 problems" in out.err
    code, _ = run_in_process("eval.py", "--model", tmp_path / "grpo-answers-seed0" / "step-000001", "--task",
                             "answers", "--eval-data", ANSWERS_FILE, "--match", "number", "--problems", 2, "--n", 1,
                             "--k", 1)
    assert code == 0 and "on answers (2 held-out problems" in capsys.readouterr().out


@needs_math_verify
def test_bench_boxed_compares_both_readings_on_gsm8k_answers():
    from bench.boxed import compare, reference_answers

    answers = reference_answers(20)
    results = compare(answers)
    assert len(results["plain"]) == 20 and all(own and verified for _, _, own, verified in results["plain"])
    # \frac{2n}{2}: minies reads its last number (2), math-verify the fraction's value.
    assert all(verified and own == (n == 2) for n, _, own, verified in results["fraction"])
    assert len(results["thousands comma"]) == sum(abs(n) >= 1000 for n in answers)
