"""Countdown rows in Qiu et al.'s published format, generated: the data file the shipped Qiu-format model was
trained and is evaluated on (minies/assets/tiny-qiu/countdown.json, scripts/make_tiny.py), and tests'."""
import random
from fractions import Fraction

from minies.tasks.countdown import QIU_PROMPT, qiu_numbers


def qiu_rows(count, seed=0):
    """`count` generated rows in Qiu et al.'s published format (id, context, numbers, target as text, solution):
    3 or 4 numbers in 1..99, the target the value of a random fully parenthesised expression over them, kept
    when it is an integer in 1..100, and one time in 25 whatever it is (their file's share of other targets,
    non-integers among them)."""
    rng, rows = random.Random(f"qiu-rows-{seed}"), []
    while len(rows) < count:
        numbers = [rng.randint(1, 99) for _ in range(rng.choice((3, 4)))]
        value, text = qiu_expression(rng, rng.sample(numbers, len(numbers)))
        if value is None or not ((value.denominator == 1 and 1 <= value <= 100) or rng.random() < 0.04):
            continue
        target = str(int(value)) if value.denominator == 1 else repr(float(value))
        context = QIU_PROMPT.format(numbers=qiu_numbers(numbers), target=target)
        rows.append({"id": len(rows), "context": context, "numbers": numbers, "target": target, "solution": text})
    return rows


def qiu_expression(rng, numbers):
    """(value, text) of a random expression over `numbers` in order, every operation in parentheses and spaced
    as Qiu et al.'s solutions are ("((44 + 19) + 35)"); value None when it divides by zero."""
    if len(numbers) == 1:
        return Fraction(numbers[0]), str(numbers[0])
    split = rng.randint(1, len(numbers) - 1)
    (a, a_text), (b, b_text) = qiu_expression(rng, numbers[:split]), qiu_expression(rng, numbers[split:])
    op = rng.choice("+-*/")
    if a is None or b is None or (op == "/" and b == 0):
        return None, ""
    value = {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else None}[op]
    return value, f"({a_text} {op} {b_text})"
