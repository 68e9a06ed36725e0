"""How math-verify (--match boxed) and minies' own number reading of a \\boxed{} answer agree, on the GSM8K test set.

    python -m bench.boxed                  # the 1,319 rows of tests/data/gsm8k_test.jsonl, every form
    python -m bench.boxed --rows 100       # the first 100 rows

Each row's reference answer is written inside \\boxed{} in several forms a model writes (FORMS: "18", "18.0",
"\\frac{36}{2}", "18.00", "1,234", "\\$18", "18 \\text{ dollars}", "18\\%", "x = 18", "\\$18.00", "18^{\\circ}"), and
read back two ways: minies' own (gsm8k.py: last_boxed, then the last number inside it, compared exactly, as
--task gsm8k scores a boxed answer) and math-verify's (math_answers.py: the box and the reference compared as
mathematics). Every form is the right answer, so a reading that says "wrong" is the reading's miss. Printed:
per form, the rows where the two agree and where they differ (which one says right), then three differing rows.
Needs math-verify (pip install math-verify); docs/tasks.md keeps the printed numbers.
"""
import argparse
import json
import os
from dataclasses import dataclass

from minies.cli import run_script
from minies.config import add_arguments, from_args, option
from minies.tasks.gsm8k import last_boxed, score_last_number
from minies.tasks.math_answers import math_verify, same_math

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GSM8K_TEST = os.path.join(ROOT, "tests", "data", "gsm8k_test.jsonl")


def thousands(n):
    return f"{n:,}"


# form -> how an integer answer n is written inside the box, or None where that form would repeat "plain".
FORMS = {
    "plain": str,
    "decimal .0": lambda n: f"{n}.0",
    "fraction": lambda n: f"\\frac{{{2 * n}}}{{2}}",
    "decimal .00": lambda n: f"{n}.00",
    "thousands comma": lambda n: thousands(n) if abs(n) >= 1000 else None,
    "dollar sign": lambda n: f"\\${n}",
    "units text": lambda n: f"{n} \\text{{ dollars}}",
    "percent": lambda n: f"{n}\\%",
    "equation": lambda n: f"x = {n}",
    "dollars and cents": lambda n: f"\\${n}.00",
    "degrees": lambda n: f"{n}^{{\\circ}}",
}


@dataclass
class BoxedConfig:
    rows: int = option(None, "the first this many rows of the test set (default: all 1,319)", check="count")
    examples: int = option(3, "differing rows printed", check="non_negative")


def reference_answers(limit):
    """The integer answers of the GSM8K test set's first `limit` rows (every answer there is an integer)."""
    with open(GSM8K_TEST) as f:
        rows = [json.loads(line) for line in f][:limit]
    return [int(row["answer"].rpartition("####")[2].strip().replace(",", "")) for row in rows]


def compare(answers):
    """{form: [(reference, completion, own right, math-verify right)]} for every row where the form applies."""
    results = {}
    for form, write in FORMS.items():
        results[form] = []
        for n in answers:
            inside = write(n)
            if inside is None:
                continue
            completion = f"The answer is \\boxed{{{inside}}}."
            own = score_last_number(last_boxed(completion), str(n)).correct
            verified = same_math(last_boxed(completion), str(n))[0]
            results[form].append((n, completion, own, verified))
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, BoxedConfig)
    cfg = from_args(BoxedConfig, parser.parse_args())
    math_verify()  # one error line when it is missing
    results = compare(reference_answers(cfg.rows))
    print(f"{'form':<18} {'rows':>5} {'agree':>6} {'differ':>6} {'only own right':>15} {'only math-verify right':>23}")
    differing = []
    for form, rows in results.items():
        differ = [r for r in rows if r[2] != r[3]]
        differing += [(form, *r) for r in differ]
        print(f"{form:<18} {len(rows):>5} {len(rows) - len(differ):>6} {len(differ):>6} "
              f"{sum(own for _, _, own, _ in differ):>15} {sum(mv for _, _, _, mv in differ):>23}")
    total = sum(len(rows) for rows in results.values())
    print(f"{'all':<18} {total:>5} {total - len(differing):>6} {len(differing):>6}")
    # The first differing row of each form, in FORMS' order, then the others.
    firsts = list({form: (form, *row) for form, *row in reversed(differing)}.values())[::-1]
    for form, n, completion, own, verified in (firsts + [r for r in differing if r not in firsts])[:cfg.examples]:
        print(f"differs ({form}): {completion!r} against {n}: own {'right' if own else 'wrong'}, "
              f"math-verify {'right' if verified else 'wrong'}")


if __name__ == "__main__":
    run_script(main)
