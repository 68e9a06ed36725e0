"""Math answers compared as mathematics: a completion's last \\boxed{} against a reference, with Hugging Face's
math-verify (the checker of the open reasoning-RL projects: Open R1, TRL's accuracy reward). "1/2", "0.5" and
"\\frac{1}{2}" are the same answer; so are the intervals "[1, 2)" written either way, the sets "\\{1, 2\\}" and
"\\{2, 1\\}", and the expressions "x + 1" and "1 + x".

math-verify is an optional dependency (`pip install math-verify`): only `--match boxed` needs it, and asking for
that without it is one error line saying how to install it. bench/boxed.py measures it against GSM8K's own
number reading (minies/tasks/gsm8k.py last_boxed) on the shipped test set; docs/tasks.md gives the counts.

math-verify bounds each parse and comparison by its own timer (SIGALRM, in the main thread), so that a
pathological expression cannot stall a run: a comparison that runs out counts as not equal.
"""
from functools import lru_cache

from minies import UserError

INSTALL = ("--match boxed compares answers as mathematics with math-verify, which is not installed: "
           "pip install math-verify")


def math_verify():
    """The math_verify module, or a UserError saying how to install it."""
    try:
        import math_verify
    except ImportError:
        raise UserError(INSTALL) from None
    return math_verify


@lru_cache(maxsize=4096)
def parsed(boxed_text):
    """math-verify's reading of `boxed_text` (the inside of a \\boxed{}): a list, empty where it reads nothing.
    Cached: a reference is read once for all its completions."""
    return math_verify().parse(f"\\boxed{{{boxed_text}}}")


def same_math(answer, reference):
    """(whether `answer` equals `reference` as mathematics, whether `answer` could be read as mathematics at all);
    both are the texts inside a \\boxed{}."""
    read = parsed(answer)
    if not read:
        return False, False
    return bool(math_verify().verify(parsed(reference), read)), True
