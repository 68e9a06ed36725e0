"""--task path/to/task.py: a task from the user's own file, run by every algorithm, recorded in config.json and
guarded against what a user's code can do wrong (one error line naming the file, nothing lost)."""
import json
import textwrap

import pytest

from minies import UserError
from minies.runtime import checkpoint
from minies.tasks import get_task
from tests.conftest import REPO, assert_one_line_error, run_in_process

EXAMPLE = REPO / "examples" / "add_a_digit.py"
TINY_RUN = ["--steps", 1, "--eval-problems", 2, "--final-samples", 1, "--eval-every", 0, "--save-every", 1]
SMALL = {"es": ["--population", 2, "--prompts-per-step", 2], "grpo": ["--prompts", 2, "--group-size", 2]}

# A generated task whose score() is written by each test: {score} is its body, `calls` counts its calls.
TEMPLATE = '''
import math, time
from minies.tasks import Problem, Task, Score, make_score, last_answer_tag

calls = 0


class Sums(Task):
    def problem(self, rng):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        return Problem({question}, str(a + b))

    def score(self, completion, problem):
        global calls
        calls += 1
{score}
'''
GOOD_SCORE = "return make_score(last_answer_tag(completion) == problem.answer, last_answer_tag(completion) is None)"


def task_file(tmp_path, score=GOOD_SCORE, question='f"{a}+{b}"', name="sums.py"):
    path = tmp_path / name
    path.write_text(TEMPLATE.format(score=textwrap.indent(textwrap.dedent(score), " " * 8), question=question))
    return path


def train(model_dir, out, task, algo="es", *extra):
    return run_in_process("train.py", "--model", model_dir, "--out", out, "--task", task, "--algo", algo,
                          *SMALL["es" if algo == "es" else "grpo"], *TINY_RUN, *extra)


@pytest.mark.parametrize("algo,extra", [("es", ["--mode", "inplace"]), ("es", ["--mode", "lowrank"]),
                                        ("es", ["--load-in-8bit", "--mode", "inplace"]), ("grpo", []),
                                        ("grpo", ["--lora-rank", 2]), ("b3po", []), ("m3po", []), ("c3po", [])])
def test_every_algorithm_trains_on_a_task_file(algo, extra, tmp_path, model_dir, one_thread, capsys):
    code, _ = train(model_dir, tmp_path, EXAMPLE, algo, *extra)
    out = capsys.readouterr()
    assert code == 0, out.err[-3000:]
    assert "before:" in out.out and "after:" in out.out
    config = json.loads((tmp_path / f"{algo}-add_a_digit-seed0" / "config.json").read_text())
    assert config["train"]["task"] == str(EXAMPLE) and len(config["inputs"]["--task"]["sha256"]) == 64


def test_resume_refuses_a_changed_file_and_eval_reads_a_checkpoint_with_it(tmp_path, model_dir, one_thread, capsys):
    path = task_file(tmp_path)
    assert train(model_dir, tmp_path / "out", path)[0] == 0
    run = tmp_path / "out" / "es-sums-seed0"
    code, _ = train(model_dir, tmp_path / "out", path, "es", "--steps", 2, "--resume")
    assert code == 0 and (run / "step-000002").is_dir()
    code, _ = run_in_process("eval.py", "--model", run / "step-000002", "--task", path, "--problems", 2, "--n", 1,
                             "--k", 1)
    assert code == 0 and "pass@1" in capsys.readouterr().out
    path.write_text(path.read_text() + "\n# changed\n")
    code, _ = train(model_dir, tmp_path / "out", path, "es", "--steps", 3, "--resume")
    last = assert_one_line_error("changed file", code, capsys.readouterr().err)
    assert str(path) in last and "changed" in last
    assert sorted(d.name for d in run.glob("step-*")) == ["step-000001", "step-000002"]


def test_a_score_that_fails_mid_run_stops_it_and_keeps_its_checkpoints(tmp_path, model_dir, one_thread, capsys):
    # The before evaluation scores 4 completions (2 sampled, 2 greedy) and each GRPO step 4: the third step's raise.
    path = task_file(tmp_path, score=f"if calls > 12:\n    raise KeyError('late')\n{GOOD_SCORE}")
    code, _ = train(model_dir, tmp_path, path, "grpo", "--steps", 4)
    last = assert_one_line_error("late failure", code, capsys.readouterr().err)
    assert f"--task {path} line 17: score() raised KeyError" in last
    run = tmp_path / "grpo-sums-seed0"
    assert sorted(d.name for d in run.glob("step-*")) == ["step-000001", "step-000002"]
    assert checkpoint.load_latest(str(run))[1]["step"] == 2


BAD_FILES = {  # name -> (file text, or None for a missing file; what the error line must say)
    "missing": (None, "no such file"),
    "syntax error": ("x = 1\ndef broken(:\n", "line 2: SyntaxError"),
    "raises when run": ("import no_such_module_at_all\n", "line 1: running the file raised ModuleNotFoundError"),
    "no task": ("x = 1\n", "defines 0 Task subclasses"),
    "two tasks": ("from minies.tasks import Arithmetic\nclass A(Arithmetic): pass\nclass B(Arithmetic): pass\n",
                  "defines 2 Task subclasses (A, B)"),
    "no score": ("from minies.tasks import Task\nclass A(Task):\n    def problem(self, rng): pass\n", "no score("),
    "no problems": ("from minies.tasks import Task\nclass A(Task):\n    def score(self, c, p): pass\n",
                    "neither problem(rng)"),
    "exits": ("import sys\nsys.exit(3)\n", "raised SystemExit"),
}


@pytest.mark.parametrize("name", list(BAD_FILES))
def test_a_bad_task_file_is_one_line_naming_it(name, tmp_path):
    text, says = BAD_FILES[name]
    path = tmp_path / "task.py"
    if text is not None:
        path.write_text(text)
    with pytest.raises(UserError) as error:
        get_task(str(path))
    assert str(error.value).startswith(f"--task {path}") and says in str(error.value), str(error.value)


BAD_SCORES = {  # name -> (score body, question, what the error line must say)
    "raises": ("return 1 / 0", None, "line 16: score() raised ZeroDivisionError"),
    "NaN": ("return Score(math.nan, False, False)", None, "reward of nan"),
    "None": ("return None", None, "returned None"),
    "a string": ("return 'yes'", None, "returned 'yes' (str), not a Score"),
    "correct not a bool": ("return Score(1.0, 'yes', False)", None, "correct='yes'"),
    "hangs": ("time.sleep(30)", None, "took more than --score-timeout 0.2 seconds"),
    "hangs, catching every Exception": ("try:\n    time.sleep(30)\nexcept Exception:\n    pass", None,
                                        "took more than --score-timeout"),
    "raises a multi-line error": ("raise ValueError('a\\nb')", None, "raised ValueError: a b; fix the file"),
    "empty prompt": (GOOD_SCORE, '" "', "question is empty"),
    "prompt not text": (GOOD_SCORE, "[a, b]", "question is list"),
}


@pytest.mark.parametrize("name", list(BAD_SCORES))
def test_a_bad_score_or_prompt_is_one_line_naming_the_file(name, tmp_path):
    score, question, says = BAD_SCORES[name]
    path = task_file(tmp_path, score=score, **({"question": question} if question else {}))
    with pytest.raises(UserError) as error:
        task = get_task(str(path), score_timeout=0.2)
        task.score("<answer>3</answer>", task.test_problems(1)[0])
    assert str(error.value).startswith(f"--task {path}") and says in str(error.value), str(error.value)


def test_a_bad_score_through_train_is_one_line_and_writes_nothing(tmp_path, model_dir, one_thread, capsys):
    path = task_file(tmp_path, score="return float('nan')")
    code, _ = train(model_dir, tmp_path / "out", path)
    last = assert_one_line_error("nan score", code, capsys.readouterr().err)
    assert str(path) in last and not (tmp_path / "out").exists()


def test_a_data_task_file_reads_rows_and_names_a_bad_line(tmp_path):
    path = tmp_path / "rows_task.py"
    path.write_text(textwrap.dedent('''
        from minies.tasks import Problem, Task, make_score

        class Rows(Task):
            def parse_row(self, row):
                return Problem(row["q"], row["a"])

            def score(self, completion, problem):
                return make_score(completion.strip() == problem.answer, False)
        '''))
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"q": f"{i}?", "a": str(i)}) + "\n" for i in range(10)))
    with pytest.raises(UserError, match=f"--task {path} reads its problems from files"):
        get_task(str(path))
    assert len(get_task(str(path), eval_data=str(rows)).test_problems()) == 10
    task = get_task(str(path), data=str(rows))
    assert len(task.test_problems()) == 5 and task.score(" 3 ", task.test_problems(1)[0]) is not None
    rows.write_text(rows.read_text() + json.dumps({"q": "", "a": "1"}) + "\n")
    with pytest.raises(UserError, match=f"{rows} line 11: the prompt is empty"):
        get_task(str(path), data=str(rows))
    rows.write_text("".join(rows.read_text().splitlines(keepends=True)[:10]) + json.dumps({"x": 1}) + "\n")
    with pytest.raises(UserError, match=f"{rows} line 11: --task {path}: parse_row\\(\\) raised KeyError"):
        get_task(str(path), data=str(rows))


def test_help_names_task_files(capsys):
    code, _ = run_in_process("train.py", "--help")
    assert code == 0 and "path/to/task.py" in " ".join(capsys.readouterr().out.split())
    code, _ = run_in_process("train.py", "--task", "nosuchtask")
    last = assert_one_line_error("unknown task", code, capsys.readouterr().err)
    assert "neither a task" in last and "path/to/task.py" in last
