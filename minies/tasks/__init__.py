"""Tasks with verifiable rewards: prompts in two styles, ground truth, a seeded train/test split, a verifier.

One file per task (arithmetic, countdown, gsm8k); base.py holds what they share.
"""
from minies import UserError
from minies.tasks.arithmetic import Arithmetic
from minies.tasks.base import (ANSWER_TAG, FORMAT_BONUS, PROMPT_STYLES, Problem, Score, SolvedProblem, Task,
                               last_answer_tag, make_score)
from minies.tasks.countdown import (Countdown, CountdownProblem, parse_expression, random_expression, solutions,
                                   solvable)
from minies.tasks.gsm8k import BOXED, GSM8K, GSM8K_NUMBER

TASKS = {"arithmetic": Arithmetic, "countdown": Countdown, "gsm8k": GSM8K}
DEFAULT_TASK = "arithmetic"

__all__ = ["ANSWER_TAG", "BOXED", "DEFAULT_TASK", "FORMAT_BONUS", "GSM8K", "GSM8K_NUMBER", "PROMPT_STYLES", "TASKS",
           "Arithmetic", "Countdown", "CountdownProblem", "Problem", "Score", "SolvedProblem", "Task", "get_task",
           "last_answer_tag", "make_score", "parse_expression", "random_expression", "solutions", "solvable"]


def get_task(name=DEFAULT_TASK, seed=0, data=None, prompt_style="terse", max_new_tokens=None, lenient_answers=False):
    """The task called `name`. `data`: a local data file (gsm8k needs one; countdown may read one);
    `prompt_style`: "terse" or "instruct"; `max_new_tokens`: None for the task's default for that style;
    `lenient_answers`: gsm8k's fallback to the last number anywhere (evaluation only)."""
    if name not in TASKS:
        raise UserError(f"--task {name}: unknown task; choose one of {', '.join(sorted(TASKS))}")
    kwargs = {"lenient": lenient_answers} if name == "gsm8k" else {}
    return TASKS[name](seed=seed, data=data, prompt_style=prompt_style, max_new_tokens=max_new_tokens, **kwargs)
