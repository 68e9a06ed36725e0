"""What the shipped Qiu-format model (minies/assets/tiny-qiu, built by scripts/make_tiny.py) reads and learns from:
Qiu et al.'s raw prompt as a few dozen tokens, completions in their think/answer envelope, and a data file in their
format.

A warm-start completion continues the prompt, which ends in "<think>", with a short trace, the intermediate results
that reach the target, then the expression: "44+19=63,63+35=98</think>\n<answer>44+19+35</answer>", and the end
token. A few break the envelope on purpose (ENVELOPES), so that the model sometimes does too and Qiu et al.'s
format reward has something to teach.
"""
import ast
import json
import os
import random
import re
from fractions import Fraction

from minies.recipes import RECIPES
from minies.tasks import get_task, qiu_rows
from minies.tasks.countdown import QIU_PROMPT
from minies.tasks.expressions import OPS, TARGET, join

QIU_WORDS = ["<think>", "</think>", "<answer>", "</answer>"]
# The fixed text of Qiu et al.'s prompt between its tags, numbers and target, each piece one token, so that the
# ~430 published characters read as 25 to 49 tokens; numbers, targets and everything the model writes stay characters.
QIU_PHRASES = [piece for piece in re.split("|".join(map(re.escape, QIU_WORDS)) + r"|\{numbers\}|\{target\}",
                                           QIU_PROMPT) if len(piece) > 1]
QIU_ROWS = 2200  # the data file: the 200 rows trained on (as Qiu et al.'s first 200), then 2,000 held out
# Shares of the warm start's completions in Qiu et al.'s envelope and outside it (no newline between </think> and
# <answer>, or no answer block at all), so that the model sometimes breaks it and the format reward has
# something to teach.
ENVELOPES = {"whole": 0.92, "no newline": 0.05, "no answer": 0.03}
OP_SIGNS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


def qiu_completion(steps, expression, envelope="whole"):
    """A completion of Qiu et al.'s prompt (which ends in <think>): the `steps` as its trace, then `expression` as
    the answer, "44+19=63,63+35=98</think>\n<answer>44+19+35</answer>"; or the envelope broken as ENVELOPES names."""
    trace = ",".join(steps) + "</think>"
    return {"whole": f"{trace}\n<answer>{expression}</answer>", "no newline": f"{trace}<answer>{expression}</answer>",
            "no answer": trace}[envelope]


def chains(numbers, target):
    """Every way to reach `target` by taking `numbers` one at a time in some order, each step combining the result
    so far with the next number (r op n, or n op r for - and /), with every intermediate result a non-negative
    integer: a sorted list of (steps such as "44+19=63", the expression). Such a trace is easier for a tiny model
    than an arbitrary tree with negative or fractional intermediates."""
    found = set()

    def extend(so_far, rest, steps):  # so_far: (value, text, precedence) of the expression built so far
        if not rest:
            if so_far[0] == target:
                found.add((tuple(steps), so_far[1]))
            return
        for i, n in enumerate(rest):
            number = (n, str(n), 3)
            for (a, a_text, a_prec), op, (b, b_text, b_prec) in ([(so_far, op, number) for op in "+-*/"]
                                                                 + [(number, op, so_far) for op in "-/"]):
                if (op == "-" and a < b) or (op == "/" and (b == 0 or a % b)):
                    continue
                value = int(OPS[op](a, b))
                extend((value, *join(a_text, a_prec, op, b_text, b_prec)), rest[:i] + rest[i + 1:],
                       steps + [f"{a}{op}{b}={value}"])

    for i, n in enumerate(numbers):
        extend((n, str(n), 3), numbers[:i] + numbers[i + 1:], [])
    return sorted(found)


def expression_steps(expression):
    """(steps, expression) of any Countdown expression: its operations in evaluation order as "a/b=c" (a Fraction
    prints as 3 or 14/43), and the expression with only the parentheses it needs."""
    steps = []

    def walk(node):  # (value, text, precedence) of a subexpression
        if isinstance(node, ast.Constant):
            return Fraction(node.value), str(node.value), 3
        (a, a_text, a_prec), (b, b_text, b_prec) = walk(node.left), walk(node.right)
        op = OP_SIGNS[type(node.op)]
        steps.append(f"{a}{op}{b}={OPS[op](a, b)}")
        return (OPS[op](a, b), *join(a_text, a_prec, op, b_text, b_prec))

    return steps, walk(ast.parse(expression, mode="eval").body)[1]


def qiu_task(data):
    """Countdown on the data file `data` as the tiny-qiu recipe sets it up (minies/recipes.py): its first rows
    trained on, the rest held out, Qiu et al.'s prompt and reward, the recipe's generation length."""
    r = RECIPES["tiny-qiu"].settings(None)
    return get_task(r["task"], data=data, prompt_style=r["prompt_style"], reward=r["reward"],
                    train_problems=r["train_problems"], max_new_tokens=r["max_new_tokens"])


def qiu_problems(task, count, seed, held):
    """`count` problems for the warm start, generated as the data file's rows are (qiu_rows) but from another seed,
    none of whose prompts is in `held`, each with a completion as its reference: one of its `chains` drawn at
    random, else the generator's expression (expression_steps); the ENVELOPES shares of them break the envelope."""
    rng, out = random.Random(seed), []
    for row in qiu_rows(count, seed=seed + 1):
        # qiu_rows writes a tiny non-integer target in exponent notation ("4.3e-05") about once in 3,000 rows,
        # which the task's reader rejects: such a row is left out.
        if row["context"] in held or not TARGET.fullmatch(row["target"]):
            continue
        found = chains(row["numbers"], int(row["target"])) if row["target"].isdigit() else []
        steps, expression = rng.choice(found) if found else expression_steps(row["solution"])
        envelope = rng.choices(list(ENVELOPES), weights=list(ENVELOPES.values()))[0]
        out.append(task.parse_row(dict(row, solution=qiu_completion(steps, expression, envelope))))
    return out


def write_rows(path, rows):
    """A JSON list in Qiu et al.'s format, one row per line."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.write("[\n" + ",\n".join(json.dumps(row) for row in rows) + "\n]\n")
