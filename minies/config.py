"""Configuration as dataclasses, turned into argparse flags: field `lr_scale` becomes `--lr-scale`,
its default and its help text (field metadata) are shown by --help. One source of truth.

A numeric field names its valid range with `check=` (a key of CHECKS), so that a bad value such as
`--alpha nan` or `--steps 0` is rejected while parsing, in one line, before any model is loaded."""
import argparse
import dataclasses
import math
import re
import sys

from minies import typed_flags
from minies.models import DTYPES
from minies.runtime import decoding
from minies.tasks import ALL_PROMPT_STYLES, DEFAULT_TASK, MATCHES, REWARDS, TASKS, is_task_file

# Numbers end up in float32 tensors and in int64 sizes: a float past float32's largest (1e308) would overflow
# there, and an int past 2**31 (10**30) would overflow a size or allocate for ever.
LARGEST = 3.4028234663852886e38
LARGEST_INT = 2**31 - 1


def within(x):
    return abs(x) <= (LARGEST_INT if isinstance(x, int) else LARGEST)


# check -> (what a valid value is, for floats and for ints; the test). The test sees a float or an int.
CHECKS = {
    "positive": ("a number in (0, 3.4e38]", "an integer in [1, 2147483647]", lambda x: within(x) and x > 0),
    "non_negative": ("a number in [0, 3.4e38]", "an integer in [0, 2147483647]", lambda x: within(x) and x >= 0),
    "finite": ("a number in [-3.4e38, 3.4e38]", "an integer in [-2147483647, 2147483647]", within),
    "probability": ("a number in [0, 1]", "0 or 1", lambda x: 0 <= x <= 1),
    "fraction": ("a number in [0, 1)", "0", lambda x: 0 <= x < 1),  # momenta: 1 would never forget
    "positive_or_inf": ("a number in (0, 3.4e38], or inf", "an integer in [1, 2147483647]",
                        lambda x: x > 0 and (within(x) or x == math.inf)),  # nan > 0 is False
    # Bounds beyond which a run cannot mean what it asks: a step of more than a million completions runs for
    # days (or fails to allocate) on any machine; seeds above 2**32 overflow the seeds derived from them; below a
    # temperature of 0.01 the logits divided by it overflow (use greedy decoding instead), above 100 sampling
    # is uniform noise.
    "count": ("a number in [1, 1e6]", "an integer in [1, 1000000]", lambda x: 1 <= x <= 10**6),
    "seed": ("a number in [0, 2**32)", "an integer in [0, 4294967295]", lambda x: 0 <= x < 2**32),
    "temperature": ("a number in [0.01, 100]", "an integer in [1, 100]", lambda x: 0.01 <= x <= 100),
    "regex": ("a valid regular expression", "", None),
    "nonempty": ("", "", None),  # a path or a name: '' would silently mean the default, or the current directory
    "text": ("", "", None),  # a message: UTF-8 text (argv carries other bytes as surrogates, which no tokenizer reads)
    "task": ("", "", None),  # a built-in task's name or a Python file's path (read when the task is made)
    "clip": ("a number in [0, 10]", "an integer in [0, 10]", lambda x: 0 <= x <= 10),  # of a ratio around 1
    # Task difficulty: no task takes more than 50 numbers (arithmetic's limit; countdown checks its own 2 to 6),
    # and no number more digits than an arithmetic answer may have (12: minies/tasks/arithmetic.py).
    "numbers": ("a number in [1, 50]", "an integer in [1, 50]", lambda x: 1 <= x <= 50),
    "number_value": ("a number in [0, 1e12)", "an integer in [0, 999999999999]", lambda x: 0 <= x < 10**12),
}


def valid_range(kind, check):
    return CHECKS[check][1 if kind is int else 0]


def checked(kind, check):
    """The argparse `type=` that parses a `kind` (int or float) and rejects values outside `check`'s range; for
    `regex`, a string that must compile as a regular expression."""
    def parse(text):
        if check in ("nonempty", "task") and not text.strip():
            raise argparse.ArgumentTypeError("empty; give a name or a path")
        if check == "task" and text not in TASKS and not is_task_file(text):
            raise argparse.ArgumentTypeError(f"{text!r} is neither a task ({', '.join(sorted(TASKS))}) nor a Python "
                                             "file (path/to/task.py)")
        if check in ("nonempty", "task"):
            return text
        if check == "text":
            undecoded = [ord(c) - 0xDC00 for c in text if 0xDC80 <= ord(c) <= 0xDCFF]  # Python's surrogateescape
            if undecoded:
                raise argparse.ArgumentTypeError(f"not UTF-8 text (byte 0x{undecoded[0]:02x} is not UTF-8); give text")
            return text
        if check == "regex":
            try:
                re.compile(text)
                return text
            except re.error as e:
                raise argparse.ArgumentTypeError(f"{text!r} is not a valid regular expression ({e})")
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not CHECKS[check][2](value):
            raise argparse.ArgumentTypeError(f"{text} is not {valid_range(kind, check)}")
        return value
    return parse


def option(default, help, check=None, source=None, **kwargs):
    """A dataclass field with a help text, optionally the valid range of a number (`check`, see CHECKS), where its
    default comes from (`source`: a paper, for the values minies takes from one), and optional argparse extras
    such as choices."""
    return dataclasses.field(default=default, metadata={"help": help, "check": check, "source": source, **kwargs})


def add_arguments(parser, config_class, title=None, origins=None):
    """The fields of `config_class` as flags. --help shows each default and where it comes from: `origins`
    (field -> e.g. "recipe tiny", for defaults a recipe sets), else the field's `source`. A None default is
    described by the help text itself."""
    group = parser.add_argument_group(title or config_class.__name__)
    for f in dataclasses.fields(config_class):
        flag = "--" + f.name.replace("_", "-")
        extra = {k: v for k, v in f.metadata.items() if k not in ("help", "check", "source")}
        kind = {"int": int, "float": float, "str": str, "bool": bool}.get(f.type, f.type)
        check = f.metadata.get("check")
        help_text = f.metadata["help"] + (f"; {valid_range(kind, check)}" if check and valid_range(kind, check) else "")
        help_text += default_text(f, (origins or {}).get(f.name) or f.metadata.get("source"))
        if kind is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default, help=help_text)
        else:
            group.add_argument(flag, default=f.default, help=help_text,
                               **{"type": checked(kind, check) if check else kind, **extra})
    return group


def default_text(f, origin):
    """" (default: VALUE; ORIGIN)" for --help; VALUE is filled in by argparse when it prints (%(default)s), so
    that a default set later (set_defaults) shows. Lists print as they are typed, space-separated."""
    if f.default is None and "default" in f.metadata["help"]:  # the help text says what None means
        # ... unless a recipe sets a value, or decides the one None stands for (its prompt style's length).
        return "" if origin is None else f" (here: %(default)s, {origin})" if origin.startswith("recipe") else \
            f" (here: {origin})"
    value = " ".join(map(str, f.default)) if isinstance(f.default, (list, tuple)) else "%(default)s"
    return f" (default: {value}{'; ' + origin if origin else ''})"


def from_args(config_class, args):
    return config_class(**{f.name: getattr(args, f.name) for f in dataclasses.fields(config_class)})


# Flags that train.py, eval.py and bench/ share, declared once.


@dataclasses.dataclass
class ModelOptions:
    model: str = option(None, "hub id, local directory or GGUF file of a causal LM (default: the shipped tiny model "
                        "for --task: minies/assets/tiny-countdown for countdown, minies/assets/tiny otherwise); a "
                        "model may name its own recipe (minies/recipes.py)", check="nonempty")
    dtype: str = option("float32", "weights dtype", choices=list(DTYPES))
    load_in_8bit: bool = option(False, "load the linear layers in 8-bit (bitsandbytes LLM.int8)")
    chat_template: bool = option(True, "wrap questions in the tokenizer's chat template when it has one")
    compile_decoding: bool = option(True, "on CUDA, decode with a static KV cache and a compiled step (CUDA graphs, "
                                    "compiled by a run's first calls); --no-compile-decoding: transformers' eager "
                                    "decoding (minies/runtime/decoding.py)")


@dataclasses.dataclass
class TaskOptions:
    task: str = option(DEFAULT_TASK, f"the task: one of {', '.join(sorted(TASKS))} (answers: the rows of --data, "
                       "checked by --match), or a Python file that defines one, path/to/task.py (docs/tasks.md)",
                       check="task")
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


def option_of(config_class, name):
    """Field `name` of another config dataclass, for a script that takes the same flag: declared once."""
    f = next(f for f in dataclasses.fields(config_class) if f.name == name)
    return dataclasses.field(default=f.default, metadata=f.metadata)


def note_compile_decoding(argv, compile_decoding, device):
    """One note when --compile-decoding is given on a machine where decoding is not compiled. On by default, it
    says nothing: a default that does nothing here asks nothing of the user."""
    if compile_decoding and "compile_decoding" in typed_flags(argv) and device.type not in decoding.DEVICES:
        print("note: --compile-decoding does nothing here: decoding is compiled only on CUDA, and this machine "
              "decodes eagerly on its CPU (minies/runtime/decoding.py)", file=sys.stderr)
