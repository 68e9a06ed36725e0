"""Configuration as dataclasses, turned into argparse flags: field `lr_scale` becomes `--lr-scale`,
its default and its help text (field metadata) are shown by --help. One source of truth.

A numeric field names its valid range with `check=` (a key of CHECKS), so that a bad value such as
`--alpha nan` or `--steps 0` is rejected while parsing, in one line, before any model is loaded.

It imports nothing from minies but the root's UserError, so that every module may declare its flags here: the flags
train.py and eval.py share (the model, the task) are minies/options.py's."""
import argparse
import dataclasses
import math
import re

from minies import UserError

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
        if check == "nonempty":
            return nonempty(text)
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


def nonempty(text):
    if not text.strip():
        raise argparse.ArgumentTypeError("empty; give a name or a path")
    return text


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


def option_of(config_class, name):
    """Field `name` of another config dataclass, for a script that takes the same flag: declared once."""
    f = next(f for f in dataclasses.fields(config_class) if f.name == name)
    return dataclasses.field(default=f.default, metadata=f.metadata)


def refuse_large_step(counts):
    """A UserError for a step of over a million completions (`counts`: {flag: value}, whose product is the step's
    completions): it would run for days, or fail to allocate, on any machine (CHECKS["count"])."""
    if math.prod(counts.values()) > 10**6:
        raise UserError(f"{' × '.join(f'{flag} {value}' for flag, value in counts.items())}: over a million "
                        "completions a step; lower one of them")
