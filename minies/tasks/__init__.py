"""Tasks with verifiable rewards: prompts in several styles, ground truth, train and test splits, a verifier.

One file per task (arithmetic, countdown, gsm8k, answers: rows of a data file checked by --match); base.py holds
what they share, data.py reads data files, difficulty.py the checks of the generated tasks' difficulty flags,
expressions.py Countdown's arithmetic, qiu_rows.py Countdown rows in Qiu et al.'s format, fit.py the checks that
need the model's tokenizer, math_answers.py the comparison of answers as mathematics, task_file.py a task from the
user's own file (--task path/to/task.py; docs/tasks.md).
"""
from minies import UserError
from minies.tasks.answers import MATCHES, Answers
from minies.tasks.arithmetic import Arithmetic
from minies.tasks.base import (ANSWER_TAG, FORMAT_BONUS, PROMPT_STYLES, REWARDS, Problem, PromptStyle, Score,
                               SolvedProblem, Task, answer_tags, last_answer_tag, make_score)
from minies.tasks.countdown import Countdown, CountdownProblem
from minies.tasks.difficulty import refuse_with_files
from minies.tasks.expressions import parse_expression, python_value, random_expression, reaches, solutions, solvable
from minies.tasks.gsm8k import GSM8K, GSM8K_NUMBER, last_boxed
from minies.tasks.qiu_rows import qiu_rows
from minies.tasks.task_file import is_task_file, load_task_class, task_label

TASKS = {"answers": Answers, "arithmetic": Arithmetic, "countdown": Countdown, "gsm8k": GSM8K}
DEFAULT_TASK = "arithmetic"
ALL_PROMPT_STYLES = sorted({style for task in TASKS.values() for style in task.prompt_styles})

__all__ = ["ALL_PROMPT_STYLES", "ANSWER_TAG", "DEFAULT_TASK", "FORMAT_BONUS", "GSM8K", "GSM8K_NUMBER", "MATCHES",
           "PROMPT_STYLES", "REWARDS", "TASKS", "Answers", "Arithmetic", "Countdown", "CountdownProblem", "Problem",
           "PromptStyle", "Score", "SolvedProblem", "Task", "answer_tags", "get_task", "is_task_file",
           "last_answer_tag",
           "last_boxed", "make_score", "parse_expression", "python_value", "qiu_rows", "random_expression",
           "reaches", "solutions", "solvable", "task_label"]


def get_task(name=DEFAULT_TASK, seed=0, data=None, prompt_style="terse", max_new_tokens=None, lenient_answers=False,
             eval_data=None, train_problems=None, reward="auto", system=None, numbers=None, low=None, high=None,
             match=None, score_timeout=10.0):
    """The task called `name`, or the one a Python file defines (`name` ends in .py: task_file.py). `data`: a
    local data file to train on (gsm8k and answers need one to train; countdown and a task file may read one);
    `eval_data`: a local data file to evaluate on; `train_problems`: a fixed training set of that many problems;
    `prompt_style`, `system` and `reward`: see minies/tasks/base.py; `max_new_tokens`: None for the task's
    default for that style; `lenient_answers`: gsm8k's fallback to the last number anywhere (evaluation only);
    `numbers`, `low`, `high`: how many numbers a generated problem has and their range (None: the task's own;
    arithmetic and countdown only); `match`: how answers checks an answer (None: exact); `score_timeout`: the
    seconds a task file's score() may take on one completion."""
    if match is not None and name != "answers":
        raise UserError(f"--match {match}: only --task answers reads a match; --task {name} checks its answers its "
                        "own way, so drop it")
    if is_task_file(name):
        refuse_with_files(f"--task {name} makes its own problems", numbers, low, high)
        task_class, kwargs = load_task_class(name), {"score_timeout": score_timeout}
    elif name not in TASKS:
        raise UserError(f"--task {name}: unknown task; choose one of {', '.join(sorted(TASKS))}, or give a Python "
                        "file that defines one (path/to/task.py; docs/tasks.md)")
    elif name in ("gsm8k", "answers"):
        refuse_with_files(f"--task {name} reads its problems from data files", numbers, low, high)
        task_class = TASKS[name]
        kwargs = {"lenient": lenient_answers} if name == "gsm8k" else {"match": match}
    else:
        task_class, kwargs = TASKS[name], {"numbers": numbers, "low": low, "high": high}
    return task_class(seed=seed, data=data, prompt_style=prompt_style, max_new_tokens=max_new_tokens,
                      eval_data=eval_data, train_problems=train_problems, reward=reward, system=system, **kwargs)
