"""Tasks with verifiable rewards: prompts in several styles, ground truth, train and test splits, a verifier.

One file per task (arithmetic, countdown, gsm8k); base.py holds what they share, data.py reads data files,
difficulty.py the checks of the generated tasks' difficulty flags, expressions.py Countdown's arithmetic,
qiu_rows.py Countdown rows in Qiu et al.'s format, fit.py the checks that need the model's tokenizer.
"""
from minies import UserError
from minies.tasks.arithmetic import Arithmetic
from minies.tasks.base import (ANSWER_TAG, FORMAT_BONUS, PROMPT_STYLES, REWARDS, Problem, PromptStyle, Score,
                               SolvedProblem, Task, answer_tags, last_answer_tag, make_score)
from minies.tasks.countdown import Countdown, CountdownProblem
from minies.tasks.difficulty import refuse_with_files
from minies.tasks.expressions import parse_expression, python_value, random_expression, reaches, solutions, solvable
from minies.tasks.gsm8k import GSM8K, GSM8K_NUMBER, last_boxed
from minies.tasks.qiu_rows import qiu_rows

TASKS = {"arithmetic": Arithmetic, "countdown": Countdown, "gsm8k": GSM8K}
DEFAULT_TASK = "arithmetic"
ALL_PROMPT_STYLES = sorted({style for task in TASKS.values() for style in task.prompt_styles})

__all__ = ["ALL_PROMPT_STYLES", "ANSWER_TAG", "DEFAULT_TASK", "FORMAT_BONUS", "GSM8K", "GSM8K_NUMBER",
           "PROMPT_STYLES", "REWARDS", "TASKS", "Arithmetic", "Countdown", "CountdownProblem", "Problem",
           "PromptStyle", "Score", "SolvedProblem", "Task", "answer_tags", "get_task", "last_answer_tag",
           "last_boxed", "make_score", "parse_expression", "python_value", "qiu_rows", "random_expression",
           "reaches", "solutions", "solvable"]


def get_task(name=DEFAULT_TASK, seed=0, data=None, prompt_style="terse", max_new_tokens=None, lenient_answers=False,
             eval_data=None, train_problems=None, reward="auto", system=None, numbers=None, low=None, high=None):
    """The task called `name`. `data`: a local data file to train on (gsm8k needs one to train; countdown may
    read one); `eval_data`: a local data file to evaluate on; `train_problems`: a fixed training set of that
    many problems; `prompt_style`, `system` and `reward`: see minies/tasks/base.py; `max_new_tokens`: None for the task's
    default for that style; `lenient_answers`: gsm8k's fallback to the last number anywhere (evaluation only);
    `numbers`, `low`, `high`: how many numbers a generated problem has and their range (None: the task's own;
    arithmetic and countdown only)."""
    if name not in TASKS:
        raise UserError(f"--task {name}: unknown task; choose one of {', '.join(sorted(TASKS))}")
    if name == "gsm8k":
        refuse_with_files("--task gsm8k reads its problems from data files", numbers, low, high)
        kwargs = {"lenient": lenient_answers}
    else:
        kwargs = {"numbers": numbers, "low": low, "high": high}
    return TASKS[name](seed=seed, data=data, prompt_style=prompt_style, max_new_tokens=max_new_tokens,
                       eval_data=eval_data, train_problems=train_problems, reward=reward, system=system, **kwargs)
