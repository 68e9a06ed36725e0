"""The tasks by name, their flags declared once (TaskOptions: train.py and eval.py inherit it, minies/options.py
parses it) and the task those flags make (get_task). A new task flag is one field of TaskOptions plus the code that
reads it: get_task hands every field to every task's constructor (Task.__init__, base.py) but the few that only
some tasks read (--match, --score-timeout, the difficulty flags), which go to those tasks alone."""
import argparse
import dataclasses

from minies import UserError
from minies.config import checked, option
from minies.tasks.answers import MATCHES, Answers
from minies.tasks.arithmetic import Arithmetic
from minies.tasks.base import REWARDS
from minies.tasks.countdown import Countdown
from minies.tasks.difficulty import refuse_with_files
from minies.tasks.gsm8k import GSM8K
from minies.tasks.task_file import is_task_file, load_task_class

TASKS = {"answers": Answers, "arithmetic": Arithmetic, "countdown": Countdown, "gsm8k": GSM8K}
DEFAULT_TASK = "arithmetic"
ALL_PROMPT_STYLES = sorted({style for task in TASKS.values() for style in task.prompt_styles})


def task_name(text):
    """--task's argparse `type=`: a built-in task's name or a Python file's path (read when the task is made)."""
    if text not in TASKS and not is_task_file(checked(str, "nonempty")(text)):
        raise argparse.ArgumentTypeError(f"{text!r} is neither a task ({', '.join(sorted(TASKS))}) nor a Python "
                                         "file (path/to/task.py)")
    return text


@dataclasses.dataclass
class TaskOptions:
    """The flags that choose and shape the task, train.py's and eval.py's alike (config.py turns each field into
    a flag: `eval_data` is --eval-data)."""
    task: str = option(DEFAULT_TASK, f"the task: one of {', '.join(sorted(TASKS))} (answers: the rows of --data, "
                       "checked by --match), or a Python file that defines one, path/to/task.py (docs/tasks.md)",
                       type=task_name)
    match: str = option(None, "--task answers: how an answer is compared with a row's: exact text in the answer tag, "
                        "number, boxed (the last \\boxed{} as mathematics; needs pip install math-verify), choice "
                        "(one letter) (default: exact)", choices=MATCHES)
    score_timeout: float = option(10.0, "--task FILE: the seconds its score() may take on one completion before the "
                                  "run stops with an error", check="positive")
    data: str = option(None, "local data file to train on: gsm8k needs one (JSON Lines of question, answer ending in "
                       "'#### N'), answers too (JSON Lines of prompt, answer); countdown may read one (JSON Lines "
                       "or a JSON list of numbers or nums, target, optionally context and solution: Qiu et al.'s "
                       "and TinyZero's formats)", check="nonempty")
    eval_data: str = option(None, "local data file to evaluate on, all of its rows (same format as --data); without "
                            "it a file given by --data is split in two (docs/real-models.md)", check="nonempty")
    train_problems: int = option(None, "train on a fixed set of this many problems, the same every step: the first "
                                 "rows of --data (the rest are evaluated on, unless --eval-data), or generated once",
                                 check="count")
    prompt_style: str = option("auto", "terse: the short questions the shipped models were trained on; instruct: "
                               "full instructions with the answer format, for instruction-tuned models; qiu, "
                               "tinyzero (countdown): the papers' own prompts; auto: the model's recipe's, else "
                               "instruct", choices=["auto", *ALL_PROMPT_STYLES])
    system: str = option(None, "the system message of chat-templated prompts (default: the prompt style's own: "
                         "instruct 'You are a helpful assistant.', tinyzero TinyZero's, terse none, so that no "
                         "model adds its own identity prompt); eval.py --show-prompt prints the result", check="text")
    reward: str = option("auto", "reward scheme: minies (1 correct + 0.1 for a readable answer); qiu, tinyzero "
                         "(countdown): the papers' own (docs/papers.md); auto: the prompt style's own",
                         choices=["auto", *REWARDS])
    max_new_tokens: int = option(None, "tokens generated per completion (default: the task's for the prompt "
                                 "style; instruct: arithmetic 256, countdown 1024, gsm8k 512)", check="count")
    numbers: list = option(None, "generated problems' difficulty: how many numbers each has, one count or several "
                           "(each problem draws one of them: --numbers 2 3 mixes sums of two and three numbers); "
                           "each an integer in [1, 50] (default: the task's: arithmetic sums 2, countdown gives 3 "
                           "with terse prompts, else 3 or 4; countdown takes 2 to 6)", nargs="+",
                           type=checked(int, "numbers"))
    low: int = option(None, "generated problems' difficulty: the smallest number, inclusive (default: the task's: "
                      "arithmetic 0, countdown 1; countdown takes 1 or more)", check="number_value")
    high: int = option(None, "generated problems' difficulty: the largest number, inclusive (default: the task's: "
                       "arithmetic 99, countdown 20 with terse prompts, else 99 with targets <= 100, a cap lifted "
                       "for any other range)", check="number_value")


def get_task(name=DEFAULT_TASK, seed=0, lenient_answers=False, prompt_style="terse", **flags):
    """The task called `name`, or the one a Python file defines (`name` ends in .py: task_file.py), made with the
    TaskOptions fields `flags` (each field's help says what it does; those not given keep their defaults): e.g.
    get_task("arithmetic", numbers=3). `seed`: the run's; `lenient_answers`: gsm8k's fallback to the last number
    anywhere (eval.py's, evaluation only); `prompt_style`: terse, the shipped models' style, unless given ("auto"
    needs the model's config: minies/options.py's make_task resolves it first)."""
    settings = dataclasses.asdict(TaskOptions(task=name, prompt_style=prompt_style, **flags))
    del settings["task"]
    match, score_timeout = settings.pop("match"), settings.pop("score_timeout")
    difficulty = {key: settings.pop(key) for key in ("numbers", "low", "high")}
    if match is not None and name != "answers":
        raise UserError(f"--match {match}: only --task answers reads a match; --task {name} checks its answers its "
                        "own way, so drop it")
    if is_task_file(name):
        refuse_with_files(f"--task {name} makes its own problems", **difficulty)
        task_class, own = load_task_class(name), {"score_timeout": score_timeout}
    elif name not in TASKS:
        raise UserError(f"--task {name}: unknown task; choose one of {', '.join(sorted(TASKS))}, or give a Python "
                        "file that defines one (path/to/task.py; docs/tasks.md)")
    elif name in ("gsm8k", "answers"):
        refuse_with_files(f"--task {name} reads its problems from data files", **difficulty)
        task_class = TASKS[name]
        own = {"lenient": lenient_answers} if name == "gsm8k" else {"match": match}
    else:
        task_class, own = TASKS[name], difficulty
    return task_class(seed=seed, **settings, **own)
