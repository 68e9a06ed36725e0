"""Tasks with verifiable rewards: prompts in several styles, ground truth, train and test splits, a verifier.

One file per task (arithmetic, countdown, gsm8k, answers: rows of a data file checked by --match); options.py holds
the tasks by name, their flags (TaskOptions) and get_task, which makes one from them; base.py holds what they share, data.py reads data files, difficulty.py the checks of the generated tasks' difficulty flags,
expressions.py Countdown's arithmetic, qiu_rows.py Countdown rows in Qiu et al.'s format, fit.py the checks that
need the model's tokenizer, math_answers.py the comparison of answers as mathematics, task_file.py a task from the
user's own file (--task path/to/task.py; docs/tasks.md).
"""
from minies.tasks.answers import MATCHES, Answers
from minies.tasks.arithmetic import Arithmetic
from minies.tasks.base import (ANSWER_TAG, FORMAT_BONUS, PROMPT_STYLES, REWARDS, Problem, PromptStyle, Score,
                               SolvedProblem, Task, answer_tags, last_answer_tag, make_score)
from minies.tasks.countdown import Countdown, CountdownProblem
from minies.tasks.expressions import parse_expression, python_value, random_expression, reaches, solutions, solvable
from minies.tasks.gsm8k import GSM8K, GSM8K_NUMBER, last_boxed
from minies.tasks.options import ALL_PROMPT_STYLES, DEFAULT_TASK, TASKS, TaskOptions, get_task, task_name
from minies.tasks.qiu_rows import qiu_rows
from minies.tasks.task_file import is_task_file, task_label

__all__ = ["ALL_PROMPT_STYLES", "ANSWER_TAG", "DEFAULT_TASK", "FORMAT_BONUS", "GSM8K", "GSM8K_NUMBER", "MATCHES",
           "PROMPT_STYLES", "REWARDS", "TASKS", "Answers", "Arithmetic", "Countdown", "CountdownProblem", "Problem",
           "PromptStyle", "Score", "SolvedProblem", "Task", "TaskOptions", "answer_tags", "get_task",
           "is_task_file", "last_answer_tag", "last_boxed", "make_score", "parse_expression", "python_value",
           "qiu_rows", "random_expression", "reaches", "solutions", "solvable", "task_label", "task_name"]
