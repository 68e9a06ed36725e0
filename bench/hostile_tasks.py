"""bench.hostile's cases of a task the user brings: task files that are missing, broken or whose code misbehaves
(--task path/to/task.py), and bad rows of --task answers. Each is to end in one error line naming the file; a run
resumed with a changed task file is refused before anything is written."""
import json
import os
import shutil

from minies.tasks import Task

# A generated task; {question} is its prompt, {score} the body of its score().
TASK = '''import math, time
from minies.tasks import Problem, Score, Task, last_answer_tag, make_score


class Sums(Task):
    def problem(self, rng):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        return Problem({question}, str(a + b))

    def score(self, completion, problem):
        {score}
'''
GOOD = "return make_score(last_answer_tag(completion) == problem.answer, last_answer_tag(completion) is None)"
QUESTION = 'f"{a}+{b}"'
TASK_FILES = {  # name -> file text
    "good": TASK.format(question=QUESTION, score=GOOD),
    "syntax": "x = 1\ndef broken(:\n",
    "no-task": "x = 1\n",
    "two-tasks": "from minies.tasks import Arithmetic\nclass A(Arithmetic): pass\nclass B(Arithmetic): pass\n",
    "import-error": "import no_such_module_at_all\n",
    "score-raises": TASK.format(question=QUESTION, score="return 1 / 0"),
    "score-nan": TASK.format(question=QUESTION, score="return Score(math.nan, False, False)"),
    "score-none": TASK.format(question=QUESTION, score="return None"),
    "score-string": TASK.format(question=QUESTION, score="return 'correct'"),
    "score-hangs": TASK.format(question=QUESTION, score="time.sleep(3600)"),
    "prompt-empty": TASK.format(question='""', score=GOOD),
    "prompt-list": TASK.format(question="[a, b]", score=GOOD),
}
ROWS = [{"prompt": f"What is {a} times {b}?", "answer": str(a * b)} for a in range(2, 6) for b in range(2, 6)]
ANSWER_FILES = {  # name -> rows (a string: the line as written)
    "good": ROWS,
    "prompt-empty": ROWS + [{"prompt": "", "answer": "1"}],
    "prompt-list": ROWS + [{"prompt": ["a", "b"], "answer": "1"}],
    "no-answer": ROWS + [{"prompt": "What?"}],
    "not-a-number": ROWS + [{"prompt": "What?", "answer": "many"}],
}


def write_task_fixtures(root):
    for name, text in TASK_FILES.items():
        with open(os.path.join(root, f"task-{name}.py"), "w") as f:
            f.write(text)
    for name, rows in ANSWER_FILES.items():
        with open(os.path.join(root, f"ans-{name}.jsonl"), "w") as f:
            f.write("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    with open(os.path.join(root, "ans-latin1.jsonl"), "wb") as f:
        f.write(b'{"prompt": "caf\xe9?", "answer": "1"}\n' * 4)


def changed_task_file(case_dir, fx):
    """A prepare step: the base run copied as run "base", its config.json made to record task-good.py with
    another text's sha256, as if the file had been edited since the run started."""
    run = shutil.copytree(fx.base(), os.path.join(case_dir, "out", "base"))
    path = os.path.join(run, "config.json")
    with open(path) as f:
        config = json.load(f)
    config["train"]["task"] = os.path.join(fx.root, "task-good.py")
    # What the file's task resolves to, so that its text is the one difference (it sets no length of its own).
    config["train"]["max_new_tokens"] = Task.default_max_new_tokens[config["train"]["prompt_style"]]
    config["inputs"] = {"--task": {"path": config["train"]["task"], "sha256": "0" * 64}}
    with open(path, "w") as f:
        json.dump(config, f)


def task_cases(refuse, runs, train_args, eval_args, resume_args):
    """The cases, built with bench.hostile_cases' `refuse` and `runs` on its small train.py, eval.py and --resume
    arguments."""
    for what, name, says in [
            ("missing", "no-such-task", "no such file"), ("a syntax error", "syntax", "line 2: SyntaxError"),
            ("no Task subclass", "no-task", "defines 0 Task"), ("two Task subclasses", "two-tasks", "defines 2 Task"),
            ("an import that fails", "import-error", "line 1"),
            ("score() raises", "score-raises", "line 11: score.. raised ZeroDivisionError"),
            ("score() returns NaN", "score-nan", "reward of nan"), ("score() returns None", "score-none", "None"),
            ("score() returns a string", "score-string", "not a Score"),
            ("score() hangs", "score-hangs", "--score-timeout"),
            ("an empty prompt", "prompt-empty", "question is empty"),
            ("a prompt that is not text", "prompt-list", "question is list")]:
        extra = ["--score-timeout", "1"] if name == "score-hangs" else []
        yield refuse(f"task file: {what}", "train.py", [*train_args, "--task", f"{{fx}}/task-{name}.py", *extra],
                     f"--task .*task-{name}.py.*{says}")
    yield refuse("task file: eval.py, score() raises", "eval.py",
                 [*eval_args, "--task", "{fx}/task-score-raises.py"], "task-score-raises.py line 11")
    yield runs("task file: the example", "train.py", [*train_args, "--task", "{repo}/examples/add_a_digit.py"])
    yield refuse("task file: --resume with the file changed", "train.py",
                 [*resume_args, "--task", "{fx}/task-good.py"], "changed since the run read it",
                 prepare=changed_task_file)
    answers = [*train_args, "--task", "answers", "--data"]
    for what, name, says in [("an empty prompt", "prompt-empty", "line 17"),
                             ("a list prompt", "prompt-list", "line 17"), ("no answer", "no-answer", "line 17"),
                             ("not UTF-8", "latin1", "not UTF-8")]:
        yield refuse(f"data answers: {what}", "train.py", [*answers, f"{{fx}}/ans-{name}.jsonl"],
                     f"ans-{name}.jsonl.*{says}")
    yield refuse("data answers: --match number, an answer not a number", "train.py",
                 [*answers, "{fx}/ans-not-a-number.jsonl", "--match", "number"], "line 17: .*not a number")
    yield refuse("data answers: --match on another task", "train.py", [*train_args, "--match", "exact"], "--match")
    yield runs("data answers: good rows", "train.py", [*answers, "{fx}/ans-good.jsonl", "--match", "number"])
