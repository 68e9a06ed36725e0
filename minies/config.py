"""Configuration as dataclasses, turned into argparse flags: field `lr_scale` becomes `--lr-scale`,
its default and its help text (field metadata) are shown by --help. One source of truth."""
import argparse
import dataclasses


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
            group.add_argument(flag, type=kind, default=f.default, help=help_text, **extra)
    return group


def from_args(config_class, args):
    return config_class(**{f.name: getattr(args, f.name) for f in dataclasses.fields(config_class)})


def option_of(config_class, name):
    """Field `name` of another config dataclass, for a script that takes the same flag: declared once."""
    f = next(f for f in dataclasses.fields(config_class) if f.name == name)
    return dataclasses.field(default=f.default, metadata=f.metadata)
