"""Config dataclasses -> argparse: every flag has a help text and shows its default; values round-trip."""
import argparse
import dataclasses
import importlib.util
import re

import pytest

from conftest import REPO
from minies.config import add_arguments, from_args, option


def _train_script():
    spec = importlib.util.spec_from_file_location("minies_train_script", REPO / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def config_classes():
    train = _train_script()
    classes = [train.TrainConfig]
    for config_class, _ in train.algorithms().values():
        classes.append(config_class)
    return classes


def _parser(*classes):
    def wide(prog):  # one line per flag: no wrapping, help beside the flag
        return argparse.HelpFormatter(prog, max_help_position=1000, width=10_000)

    parser = argparse.ArgumentParser(formatter_class=wide)
    for c in classes:
        add_arguments(parser, c)
    return parser


def test_every_field_has_a_help_text(config_classes):
    for c in config_classes:
        for f in dataclasses.fields(c):
            assert f.metadata.get("help", "").strip(), f"{c.__name__}.{f.name} has no help text"


def test_help_shows_every_flag_with_its_default(config_classes):
    for c in config_classes:
        text = _parser(c).format_help()
        lines = text.splitlines()
        for f in dataclasses.fields(c):
            flag = "--" + f.name.replace("_", "-")
            # The flag's own line starts with it (other help texts may mention it further along).
            line = next((ln for ln in lines if re.match(rf"\s*{re.escape(flag)}(\s|,|/|$)", ln)), None)
            assert line is not None, f"{flag} missing from --help"
            described = f.default is None and "default" in f.metadata["help"]  # the help text says what None means
            shown = " ".join(map(str, f.default)) if isinstance(f.default, (list, tuple)) else f.default
            assert f.metadata["help"] in line and (described or f"(default: {shown}" in line), line


def test_parsed_values_round_trip():
    @dataclasses.dataclass
    class Demo:
        lr_scale: float = option(0.5, "a float")
        steps: int = option(3, "an int")
        name: str = option(None, "an optional string")
        mode: str = option("a", "a choice", choices=["a", "b"])
        flag: bool = option(True, "a switch")

    parser = _parser(Demo)
    assert from_args(Demo, parser.parse_args([])) == Demo()
    args = parser.parse_args(["--lr-scale", "2e-3", "--steps", "7", "--name", "x", "--mode", "b", "--no-flag"])
    assert from_args(Demo, args) == Demo(lr_scale=2e-3, steps=7, name="x", mode="b", flag=False)
    assert isinstance(from_args(Demo, args).steps, int)
    with pytest.raises(SystemExit):
        parser.parse_args(["--mode", "c"])
    with pytest.raises(SystemExit):
        parser.parse_args(["--steps", "many"])


def test_a_check_rejects_values_outside_its_range_while_parsing(capsys):
    from minies.cli import ArgumentParser

    @dataclasses.dataclass
    class Demo:
        rate: float = option(0.1, "a rate", check="positive")
        count: int = option(1, "a count", check="positive")
        clip: float = option(1.0, "a clip", check="positive_or_inf")
        share: float = option(0.5, "a share", check="probability")

    parser = ArgumentParser()
    add_arguments(parser, Demo)
    args = parser.parse_args(["--rate", "2e-3", "--count", "3", "--clip", "inf", "--share", "1"])
    assert from_args(Demo, args) == Demo(rate=2e-3, count=3, clip=float("inf"), share=1.0)
    positive, count, clip = "a number in (0, 3.4e38]", "an integer in [1, 2147483647]", "a number in (0, 3.4e38], or inf"
    for flag, value, wanted in [("--rate", "nan", positive), ("--rate", "inf", positive), ("--rate", "0", positive),
                                ("--rate", "1e308", positive),  # past float32: it would overflow in a tensor
                                ("--count", "0", count), ("--count", "1.5", count), ("--count", str(10**30), count),
                                ("--clip", "nan", clip), ("--clip", "1e39", clip), ("--share", "1.01", "a number in [0, 1]")]:
        with pytest.raises(SystemExit, match="2"):
            parser.parse_args([flag, value])
        assert capsys.readouterr().err.endswith(f"error: argument {flag}: {value} is not {wanted}; see --help\n")
    assert "a rate; a number in (0, 3.4e38] (default: 0.1)" in " ".join(parser.format_help().split())
    assert from_args(Demo, parser.parse_args(["--clip", "3.4e38", "--count", "2147483647"])).count == 2**31 - 1


def test_typed_flags_are_the_settings_a_command_line_names():
    """What a note or a --resume refusal reads to tell a value the user typed from a default or a recipe's."""
    from minies.cli import typed_flags

    argv = ["--lr-scale", "2e-3", "--steps=7", "--no-flag", "--name", "-x", "--compile-decoding"]
    assert typed_flags(argv) == {"lr_scale", "steps", "flag", "name", "compile_decoding"}
    assert typed_flags([]) == set()
