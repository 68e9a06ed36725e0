"""Countdown: combine the given numbers with + - * / and parentheses, each number exactly once, to hit a
target. The task of the founding ES papers (TinyZero's Countdown-Tasks-3to4, Qiu et al. 2025).

Problems are generated (every one solvable by construction: the target is the value of a random expression
over the numbers) or read from a data file in the public format: JSON Lines or a JSON list whose rows hold
`numbers` (or `nums`, TinyZero's name) and `target`.

    terse     "Use 3 7 12 to make 33"; 3 numbers in 1..20, any positive integer target. Short, for a
              character-level model.
    instruct  the numbers, the target, the operators, each number exactly once, reasoning inside
              <think> </think> and the final expression inside <answer> </answer>, with an example;
              3 or 4 numbers in 1..99 and a target in 1..100, as in TinyZero's set.

The completion must contain "<answer>EXPR</answer>" (the last one counts). EXPR may hold non-negative
integer or decimal numbers, + - * /, parentheses and spaces; no unary minus, no "=", no other symbol. The
verifier parses and evaluates it by hand (recursive descent, exact Fractions, never Python's eval).
Malformed (reward 0): no answer tag, an EXPR that does not parse, is longer than MAX_CHARS, nests
parentheses deeper than MAX_DEPTH, or divides by zero (it has no value).
Well formed but wrong (reward FORMAT_BONUS): any other EXPR whose numbers are not the given ones as a
multiset (compared by value, so 3.0 counts as 3) or whose value is not exactly the target.
"""
import functools
import operator
import re
from dataclasses import dataclass, field
from fractions import Fraction

from minies.tasks.base import SolvedProblem, Task, last_answer_tag, make_score

OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}
EXPR_TOKEN = re.compile(r"[0-9]+(?:\.[0-9]+)?|\S")
EXPR_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?")
# (numbers per problem, smallest number, largest number, largest target or None) of generated problems
GENERATED = {"terse": ((3,), 1, 20, None), "instruct": ((3, 4), 1, 99, 100)}


@dataclass(frozen=True)
class CountdownProblem(SolvedProblem):
    numbers: tuple = field(default=(), compare=False)  # the numbers to use; the target is `answer`


class Countdown(Task):
    """See the module docstring. `count`, `low` and `high` override the style's generated numbers."""

    name = "countdown"
    reads_data = True
    # terse: "<answer>" and "</answer>" are one token each and 3 numbers need ~12 characters;
    # instruct: room to reason, as Qiu et al. generate up to 1024 tokens.
    default_max_new_tokens = {"terse": 32, "instruct": 1024}
    MAX_CHARS = 200  # also bounds every literal and intermediate value to a few hundred digits
    MAX_DEPTH = 10  # a real solution over a few numbers nests far less

    def __init__(self, seed=0, test_size=500, count=None, low=None, high=None, prompt_style="terse", **kwargs):
        counts, default_low, default_high, self.max_target = GENERATED.get(prompt_style, GENERATED["terse"])
        self.counts = counts if count is None else (count,)
        self.low = default_low if low is None else low
        self.high = default_high if high is None else high
        if not 1 <= self.low <= self.high:
            raise ValueError("Countdown needs 1 <= low <= high (positive numbers always sum to a target)")
        super().__init__(seed, test_size, prompt_style=prompt_style, **kwargs)

    def make_problem(self, numbers, target, reference=None):
        numbers = tuple(numbers)
        if self.prompt_style == "terse":
            question = f"Use {' '.join(map(str, numbers))} to make {target}"
        else:
            question = (f"Using the numbers [{', '.join(map(str, numbers))}], create an equation that equals {target}. "
                        "You can use +, -, *, / and parentheses, and each number must be used exactly once. Show "
                        "your reasoning inside <think> </think> tags, then give only the final equation inside "
                        "<answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>.")
        return CountdownProblem(question, str(target), reference, numbers)

    def problem(self, rng):
        while True:
            count = self.counts[0] if len(self.counts) == 1 else rng.choice(self.counts)
            numbers = [rng.randint(self.low, self.high) for _ in range(count)]
            # A few tries per draw: an all-"+" expression over positive numbers is always a positive
            # integer, so only a bound on the target can make a draw fail.
            for _ in range(100):
                value, text, _ = random_expression(rng, rng.sample(numbers, len(numbers)))
                if value > 0 and value.denominator == 1 and (self.max_target is None or value <= self.max_target):
                    return self.make_problem(numbers, int(value), text)

    def parse_row(self, row):
        if not isinstance(row, dict):
            raise ValueError("expected a JSON object with \"numbers\" (or \"nums\") and \"target\"")
        numbers, target = row.get("numbers", row.get("nums")), row.get("target")
        if not (isinstance(numbers, list) and 2 <= len(numbers) <= 6
                and all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in numbers)):
            raise ValueError("\"numbers\" (or \"nums\") must be a list of 2 to 6 positive integers")
        if not (isinstance(target, int) and not isinstance(target, bool)):
            raise ValueError("\"target\" must be an integer")
        return self.make_problem(numbers, target)

    def score(self, completion, problem):
        try:
            value, literals, form = parse_expression(last_answer_tag(completion), self.MAX_CHARS, self.MAX_DEPTH)
        except (ValueError, ZeroDivisionError):
            return make_score(False, True)
        given = sorted(Fraction(n) for n in problem.numbers)
        return make_score(sorted(literals) == given and value == Fraction(problem.answer), False, solution=form)

    def solution_count(self, problem):
        return len(_cached_solutions(problem.numbers, int(problem.answer)))

    def solution(self, problem):
        return f"<answer>{problem.reference}</answer>"


def random_expression(rng, numbers):
    """A random expression using each of `numbers` once, in order: (value, text, precedence).

    Parentheses are added only where precedence needs them, to keep the reference solution short.
    """
    if len(numbers) == 1:
        return Fraction(numbers[0]), str(numbers[0]), 3
    split = rng.randint(1, len(numbers) - 1)
    a, a_text, a_prec = random_expression(rng, numbers[:split])
    b, b_text, b_prec = random_expression(rng, numbers[split:])
    op = rng.choice("+-*/" if b else "+-*")
    return (OPS[op](a, b), *join(a_text, a_prec, op, b_text, b_prec))


def join(a_text, a_prec, op, b_text, b_prec):
    """(text, precedence) of `a op b` from its operands' texts and precedences (1: + -, 2: * /, 3: a
    number), with parentheses only where precedence needs them."""
    prec = 1 if op in "+-" else 2
    if a_prec < prec:
        a_text = f"({a_text})"
    if b_prec < prec or (b_prec == prec and op in "-/"):  # a-(b+c) and a/(b*c) need them, a+(b-c) not
        b_text = f"({b_text})"
    return f"{a_text}{op}{b_text}", prec


def solutions(numbers, target):
    """Every distinct correct expression for a Countdown problem, by brute force: {canonical form: text}.

    All expressions that use each of `numbers` exactly once with + - * / and parentheses (every binary tree
    over every ordering) are evaluated exactly (Fractions; intermediate values may be negative or
    fractional, as the verifier allows; division by zero has no value). Two correct expressions are the
    same solution when their canonical forms are equal. The canonical form flattens chains of + and -
    into one sum of signed terms and chains of * and / into one product of factors over divisors, then
    sorts each part, so it is blind to
      - the order of operands of + and * (3*7+12 = 12+7*3),
      - grouping (3+(7+12) = (3+7)+12, a/(b*c) = a/b/c),
      - moving a sign or a division across parentheses (a-(b-c) = a-b+c, a/(b/c) = a*c/b),
      - which of two equal numbers goes where.
    Everything else counts as distinct, such as 2+2 and 2*2, or x*1 and x/1. The text is the shortest
    expression with that form (the first met among equally short ones), with parentheses only where
    precedence needs them.
    """
    return {key: text for key, (value, text, _, _) in _expressions(numbers, Fraction(target)).items()}


@functools.lru_cache(maxsize=4096)
def _cached_solutions(numbers, target):  # evaluations count the same test problems' solutions again and again
    return solutions(numbers, target)


def solvable(numbers, target):
    """Whether some expression over `numbers` (each exactly once) equals `target`."""
    return bool(_expressions(numbers, Fraction(target)))


def _expressions(numbers, target):
    """{canonical form: (value, text, precedence, (kind, parts))} of all expressions over `numbers` that
    equal `target`. Built bottom-up over subsets of the numbers: every expression over a subset splits at
    its last operation into expressions over two disjoint parts, and expressions whose canonical forms are
    equal combine into equal forms, so each subset keeps one expression per form."""
    full = (1 << len(numbers)) - 1
    table = {1 << i: {str(n): (Fraction(n), str(n), 3, ("n", (str(n),), ()))} for i, n in enumerate(numbers)}
    for mask in sorted(range(1, full + 1), key=lambda m: bin(m).count("1")):
        if mask in table:
            continue
        found = table[mask] = {}
        sub = (mask - 1) & mask
        while sub:
            rest = mask ^ sub
            if sub < rest:  # each unordered split once; both orders are tried below
                for a in table[sub].values():
                    for b in table[rest].values():
                        for x, y in ((a, b), (b, a)):
                            for op in "+-*/" if x is a else "-/":  # + and * commute: once is enough
                                if op == "/" and not y[0]:
                                    continue
                                value = OPS[op](x[0], y[0])
                                if mask == full and value != target:
                                    continue
                                key, shape = _canonical(x[3], y[3], op)
                                text, prec = join(x[1], x[2], op, y[1], y[2])
                                if key not in found or len(text) < len(found[key][1]):
                                    found[key] = (value, text, prec, shape)
            sub = (sub - 1) & mask
    # The loop above filters what it combines; a single number is not combined.
    return {key: found for key, found in table[full].items() if found[0] == target}


def _canonical(a, b, op):
    """The canonical form of `a op b` from its operands' shapes (kind, plus parts, minus parts): a sum
    "(p+q-r)" or a product "(p*q/r)" of sorted parts, flattened through operands of the same kind."""
    kind = "+" if op in "+-" else "*"
    a_plus, a_minus = a[1:] if a[0] == kind else ((_key(a),), ())
    b_plus, b_minus = b[1:] if b[0] == kind else ((_key(b),), ())
    inverse = op in "-/"
    plus = tuple(sorted(a_plus + (b_minus if inverse else b_plus)))
    minus = tuple(sorted(a_minus + (b_plus if inverse else b_minus)))
    shape = (kind, plus, minus)
    return _key(shape), shape


def _key(shape):
    kind, plus, minus = shape
    if kind == "n":
        return plus[0]
    return "(" + kind.join(plus) + "".join(("-" if kind == "+" else "/") + m for m in minus) + ")"


def parse_expression(text, max_chars, max_depth):
    """Exact value, number literals and canonical form (the one solutions() uses) of an arithmetic
    expression, by recursive descent:

        expr := term (("+" | "-") term)*      term := atom (("*" | "/") atom)*
        atom := NUMBER | "(" expr ")"

    Raises ValueError if `text` is None, too long, nested too deeply or not an expression, and
    ZeroDivisionError on division by zero. The caps bound both the time and the recursion depth.
    """
    if text is None or len(text) > max_chars:
        raise ValueError("no expression, or too long")
    tokens, pos, literals = EXPR_TOKEN.findall(text), 0, []

    def peek():
        return tokens[pos] if pos < len(tokens) else None

    def take():
        nonlocal pos
        token, pos = peek(), pos + 1
        return token

    # Each rule returns (value, shape); shapes combine as in solutions(), so equal forms mean one solution.
    def chain(depth, operand, ops):
        value, shape = operand(depth)
        while peek() in ops:
            op = take()
            b_value, b_shape = operand(depth)
            value, shape = OPS[op](value, b_value), _canonical(shape, b_shape, op)[1]
        return value, shape

    def expr(depth):
        return chain(depth, term, ("+", "-"))

    def term(depth):
        return chain(depth, atom, ("*", "/"))

    def atom(depth):
        token = take()
        if token == "(":
            if depth == max_depth:
                raise ValueError("nested too deeply")
            value = expr(depth + 1)
            if take() != ")":
                raise ValueError("unbalanced parentheses")
            return value
        if token is None or not EXPR_NUMBER.fullmatch(token):
            raise ValueError(f"unexpected {token!r}")
        literals.append(Fraction(token))
        return literals[-1], ("n", (str(literals[-1]),), ())

    value, shape = expr(0)
    if pos != len(tokens):
        raise ValueError(f"unexpected {tokens[pos]!r}")
    return value, literals, _key(shape)
