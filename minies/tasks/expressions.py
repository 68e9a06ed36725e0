"""Arithmetic expressions over a Countdown problem's numbers: random ones (to generate problems), every
distinct correct one (to count solutions), and two readers of an answer: minies' own grammar, evaluated
exactly, and Python's expression syntax, as the public Countdown graders read answers (they call `eval`;
minies walks the syntax tree instead and never runs the text).

A target is compared exactly when it is an integer; a non-integer target such as "266.6666666666667" (a
rounded value of 800/3, as Qiu et al.'s data file writes it) is reached within TOLERANCE, their graders'
tolerance.
"""
import ast
import functools
import math
import operator
import re
from fractions import Fraction

OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}
EXPR_TOKEN = re.compile(r"[0-9]+(?:\.[0-9]+)?|\S")
EXPR_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?")
TARGET = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")  # how a target may be written: an integer or a decimal
TOLERANCE = 1e-5


def target_value(target):
    """A target (an int, a Fraction, or its text: "98", "-15.727272727272727") as an exact Fraction."""
    if isinstance(target, str) and not TARGET.fullmatch(target):
        raise ValueError(f"target {target!r} is not a number")
    return Fraction(target)


def reaches(value, target, tolerance=None):
    """Whether an exact `value` hits `target`: exactly when the target is an integer, else within TOLERANCE.
    With `tolerance`, always within it (the public graders compare floats this way)."""
    goal = target_value(target)
    if tolerance is None and goal.denominator == 1:
        return value == goal
    return abs(value - goal) < (tolerance or TOLERANCE)


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
    return {key: text for key, (value, text, _, _) in _expressions(numbers, target).items()}


@functools.lru_cache(maxsize=4096)
def cached_solutions(numbers, target):  # evaluations count the same test problems' solutions again and again
    return solutions(numbers, target)


def solvable(numbers, target):
    """Whether some expression over `numbers` (each exactly once) reaches `target`, exactly (not by enumerating
    expressions as solutions() does). An expression's last operation splits the numbers into two parts, so a
    set of numbers reaches a goal when it splits into two parts such that a value x of the smaller part and
    the goal leave a value the larger part reaches: goal-x, x-goal, goal+x, goal/x, x/goal or goal*x (the
    operation undone). Parts of up to 4 numbers are looked up among every value they take, built bottom-up
    once; all the numbers are split even when there are 4 or fewer, so that a hit stops the search before
    every value of 4 numbers is built. An integer target is searched this way; a non-integer one, reached
    within TOLERANCE, is compared with every value of all the numbers. On one core: a few ms for 4 numbers,
    at most ~0.3 s for 6."""
    goal, made, full = target_value(target), {}, (1 << len(numbers)) - 1

    def values(mask):  # every value an expression over exactly the numbers in `mask` takes
        if mask not in made:
            made[mask] = ({Fraction(numbers[mask.bit_length() - 1])} if mask & (mask - 1) == 0 else
                          {v for a, b in splits(mask) for x in values(a) for y in values(b) for v in combine(x, y)})
        return made[mask]

    def reach(mask, goal):
        if mask & (mask - 1) == 0 or (mask != full and bin(mask).count("1") <= 4):
            return goal in values(mask)
        for a, b in splits(mask):
            small, large = (a, b) if bin(a).count("1") <= bin(b).count("1") else (b, a)
            for x in values(small):
                if x == 0 == goal or any(reach(large, w) for w in undone(x, goal)):  # 0 * anything = 0
                    return True
        return False

    if goal.denominator == 1:
        return reach(full, goal)
    return any(reaches(value, goal) for value in values(full))


def combine(x, y):
    """The values of x and y under + - * / in either order (division by zero has none)."""
    return {x + y, x - y, y - x, x * y, *([x / y] if y else []), *([y / x] if x else [])}


def undone(x, goal):
    """The values y with x op y or y op x equal to `goal` (x + y, x - y, y - x, x * y, x / y, y / x); the
    products and quotients need x != 0 (and x / y a goal != 0)."""
    return {goal - x, x - goal, goal + x, *([goal / x, goal * x] if x else []), *([x / goal] if x and goal else [])}


def splits(mask):
    """Each split of the numbers in `mask` into two non-empty parts (a, b), once (a < b)."""
    sub = (mask - 1) & mask
    while sub:
        if sub < mask ^ sub:
            yield sub, mask ^ sub
        sub = (sub - 1) & mask


def _expressions(numbers, target):
    """{canonical form: (value, text, precedence, (kind, parts))} of all expressions over `numbers` that
    reach `target` (reaches()). Built bottom-up over subsets of the numbers: every expression over a subset splits at
    its last operation into expressions over two disjoint parts, and expressions whose canonical forms are
    equal combine into equal forms, so each subset keeps one expression per form."""
    full = (1 << len(numbers)) - 1
    table = {1 << i: {str(n): (Fraction(n), str(n), 3, ("n", (str(n),), ()))} for i, n in enumerate(numbers)}
    for mask in sorted(range(1, full + 1), key=lambda m: bin(m).count("1")):
        if mask in table:
            continue
        found = table[mask] = {}
        for sub, rest in splits(mask):  # each unordered split once; both orders are tried below
            for a in table[sub].values():
                for b in table[rest].values():
                    for x, y in ((a, b), (b, a)):
                        for op in "+-*/" if x is a else "-/":  # + and * commute: once is enough
                            if op == "/" and not y[0]:
                                continue
                            value = OPS[op](x[0], y[0])
                            if mask == full and not reaches(value, target):
                                continue
                            key, shape = _canonical(x[3], y[3], op)
                            text, prec = join(x[1], x[2], op, y[1], y[2])
                            if key not in found or len(text) < len(found[key][1]):
                                found[key] = (value, text, prec, shape)
    # The loop above filters what it combines; a single number is not combined.
    return {key: found for key, found in table[full].items() if reaches(found[0], target)}


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


# Python's arithmetic, as the public graders evaluate an answer with `eval`: unary signs, ** and // too.
PYTHON_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
              ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
# Bounds where Python would compute for minutes (or hang on 9**9**9); no Countdown answer comes near them.
MAX_EXPONENT = 64
MAX_BITS = 4096  # of a numerator or denominator


def python_value(text):
    """The exact value of `text` read as a Python expression of numbers, + - * / // ** and parentheses, as
    `eval(text)` would compute it (leading spaces and tabs ignored, as eval ignores them), or None where eval
    would raise: a syntax error, division by zero, a name, a call, a tuple (which eval returns and the graders
    then fail to compare). Also None for a non-integer exponent, and beyond the bounds above."""
    try:
        tree = ast.parse(text.lstrip(" \t"), mode="eval").body
        return _python_value(tree, depth=0)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError, MemoryError):
        return None


def _python_value(node, depth):
    if depth > 100:
        raise ValueError("nested too deeply")
    if isinstance(node, ast.Constant) and type(node.value) in (int, float) and math.isfinite(node.value):
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _python_value(node.operand, depth + 1)
        return value if isinstance(node.op, ast.UAdd) else -value
    if isinstance(node, ast.BinOp) and type(node.op) in PYTHON_OPS:
        left, right = _python_value(node.left, depth + 1), _python_value(node.right, depth + 1)
        if isinstance(node.op, ast.Pow) and (right.denominator != 1 or abs(right) > MAX_EXPONENT
                                             or _bits(left) * abs(right) > MAX_BITS):
            raise ValueError("exponent out of range")
        value = Fraction(PYTHON_OPS[type(node.op)](left, right))
        if _bits(value) > MAX_BITS:
            raise ValueError("too large")
        return value
    raise ValueError(f"not arithmetic: {type(node).__name__}")


def _bits(value):
    return max(value.numerator.bit_length(), value.denominator.bit_length())
