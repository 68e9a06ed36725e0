"""Configuration as dataclasses, turned into argparse flags: field `lr_scale` becomes `--lr-scale`,
its default and its help text (field metadata) are shown by --help. One source of truth."""
import argparse
import dataclasses

from minies.models import DTYPES, SHIPPED_MODEL
from minies.tasks import DEFAULT_TASK, TASKS


def option(default, help, **kwargs):
    """A dataclass field with a help text (and optional argparse extras such as choices)."""
    return dataclasses.field(default=default, metadata={"help": help, **kwargs})


def add_arguments(parser, config_class, title=None):
    group = parser.add_argument_group(title or config_class.__name__)
    for f in dataclasses.fields(config_class):
        flag = "--" + f.name.replace("_", "-")
        extra = {k: v for k, v in f.metadata.items() if k != "help"}
        help_text = f.metadata["help"] + " (default: %(default)s)"
        if f.type in (bool, "bool"):
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default, help=help_text)
        else:
            kind = {"int": int, "float": float, "str": str}.get(f.type, f.type)
            group.add_argument(flag, default=f.default, help=help_text, **{"type": kind, **extra})
    return group


def from_args(config_class, args):
    return config_class(**{f.name: getattr(args, f.name) for f in dataclasses.fields(config_class)})


# Flags that train.py, eval.py and bench/ share, declared once.


@dataclasses.dataclass
class ModelOptions:
    model: str = option(SHIPPED_MODEL, "hub id or local directory of a causal LM (default: the shipped tiny model)")
    dtype: str = option("float32", "weights dtype", choices=list(DTYPES))
    load_in_8bit: bool = option(False, "load the linear layers in 8-bit (bitsandbytes LLM.int8)")
    chat_template: bool = option(True, "wrap questions in the tokenizer's chat template when it has one")


@dataclasses.dataclass
class TaskOptions:
    task: str = option(DEFAULT_TASK, "task", choices=sorted(TASKS))
    data: str = option(None, "local data file: gsm8k needs one (JSON Lines of question, answer ending in "
                       "'#### N'); countdown may read one (JSON Lines or a JSON list of numbers or nums, target)")
    prompt_style: str = option("auto", "terse: the short questions the shipped model was trained on; instruct: "
                               "full instructions with the answer format, for instruction-tuned models; auto: "
                               "the model's own (minies_defaults in its config.json), else instruct",
                               choices=["auto", "terse", "instruct"])
    max_new_tokens: int = option(None, "tokens generated per completion (default: the task's for the prompt "
                                 "style; instruct: arithmetic 256, countdown 1024, gsm8k 512)")
