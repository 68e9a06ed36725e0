"""Tasks with verifiable rewards: prompts, ground truth, a seeded train/test split, a verifier.

A task is one small class: it makes `Problem`s and scores a completion against one.
The verifier only ever sees the completion (never the prompt), so examples inside the
prompt cannot earn reward (pitfall 4 of docs/papers.md section 2).

Reward = 1.0 * correct + FORMAT_BONUS * well_formed, where well_formed means an answer could be
extracted from the completion (it is not `malformed`). The bonus is small so that being right
always dominates, but it gives a learning signal to a model that has not yet found the format.
"""
import json
import operator
import random
import re
from dataclasses import dataclass, field
from fractions import Fraction

FORMAT_BONUS = 0.1
ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@dataclass(frozen=True)
class Problem:
    question: str  # the user message; the chat template turns it into the model's prompt
    answer: str  # ground truth, as text


@dataclass(frozen=True)
class Score:
    reward: float
    correct: bool
    malformed: bool


def last_answer_tag(completion):
    """The text inside the last <answer>...</answer> of a completion, or None."""
    # No match can end after the last closing tag. Cutting that tail off keeps the lazy regex linear on
    # hostile input: thousands of unclosed "<answer>" would each scan to the end (quadratic time).
    end = completion.rfind("</answer>")
    found = ANSWER_TAG.findall(completion[:end + len("</answer>")]) if end >= 0 else []
    return found[-1].strip() if found else None


def make_score(correct, malformed):
    return Score(reward=float(correct) + FORMAT_BONUS * (not malformed), correct=correct, malformed=malformed)


class Task:
    """Base class. Subclasses define `problem(rng)`, `score(completion, problem)` and `solution(problem)`.

    The test split is drawn first from `seed`; training problems are drawn from any other seed and
    never include a test problem, so the two splits never overlap.
    """

    name = "task"
    max_new_tokens = 32  # enough for the answer format; generation stops early at EOS

    def __init__(self, seed=0, test_size=500):
        rng = random.Random(f"{self.name}-test-{seed}")
        test, seen = [], set()
        # A bounded number of tries keeps a task with few distinct problems from looping forever.
        for _ in range(100 * test_size):
            if len(test) == test_size:
                break
            p = self.problem(rng)
            if p.question not in seen:
                seen.add(p.question)
                test.append(p)
        self._test, self._test_questions = test, seen

    def test_problems(self):
        return list(self._test)

    def train_problems(self, count, seed):
        """`count` training problems drawn from `seed`, none of them in the test split."""
        rng = random.Random(f"{self.name}-train-{seed}")
        out = []
        while len(out) < count:
            p = self.problem(rng)
            if p.question not in self._test_questions:
                out.append(p)
        return out

    def problem(self, rng):
        raise NotImplementedError

    def score(self, completion, problem):
        raise NotImplementedError

    def solution(self, problem):
        """A reference completion in the format the verifier expects (used for the SFT warm start)."""
        return f"<answer>{problem.answer}</answer>"


class Arithmetic(Task):
    """Sum of `terms` random integers in [0, max_value]: "12+93" -> "<answer>105</answer>".

    The default task: the shipped tiny model learns it in minutes on a CPU and stays far from
    perfect, which leaves room for every method to show learning.
    """

    name = "arithmetic"
    max_new_tokens = 10

    def __init__(self, seed=0, test_size=500, terms=2, max_value=99):
        self.terms, self.max_value = terms, max_value
        super().__init__(seed, test_size)

    def problem(self, rng):
        xs = [rng.randint(0, self.max_value) for _ in range(self.terms)]
        return Problem("+".join(map(str, xs)), str(sum(xs)))

    def score(self, completion, problem):
        text = last_answer_tag(completion)
        if text is None or not re.fullmatch(r"-?\d{1,12}", text):
            return make_score(False, True)
        return make_score(int(text) == int(problem.answer), False)


@dataclass(frozen=True)
class SolvedProblem(Problem):
    """A Problem that carries its reference solution. Equality and hashing ignore `reference`, so the
    base class's dedup on `question` works unchanged."""

    reference: str = field(compare=False)


OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}
EXPR_TOKEN = re.compile(r"[0-9]+(?:\.[0-9]+)?|\S")
EXPR_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?")


class Countdown(Task):
    """Combine the given numbers with + - * / and parentheses, each number exactly once, to hit a target.

    Question format: "Use 3 7 12 to make 33" (`count` numbers drawn from [low, high], then the target;
    short, for a character-level model). The target is the value of a random expression over the
    numbers, kept only when it is a positive integer, so every problem is solvable.

    The completion must be "<answer>EXPR</answer>". EXPR may hold non-negative integer or decimal
    numbers, + - * /, parentheses and spaces; no unary minus, no other symbol. The verifier parses and
    evaluates it by hand (recursive descent, exact Fractions, never Python's eval).
    Malformed (reward 0): no answer tag, an EXPR that does not parse, is longer than MAX_CHARS,
    nests parentheses deeper than MAX_DEPTH, or divides by zero (it has no value).
    Well formed but wrong (reward FORMAT_BONUS): any other EXPR whose numbers are not the given ones as
    a multiset (compared by value, so 3.0 counts as 3) or whose value is not exactly the target.
    """

    name = "countdown"
    max_new_tokens = 32  # "<answer>" and "</answer>" are one token each; 3 numbers need ~12 characters
    MAX_CHARS = 200  # also bounds every literal and intermediate value to a few hundred digits
    MAX_DEPTH = 10  # a real solution over a few numbers nests far less

    def __init__(self, seed=0, test_size=500, count=3, low=1, high=20):
        if not 1 <= low <= high:
            raise ValueError("Countdown needs 1 <= low <= high (positive numbers always sum to a target)")
        self.count, self.low, self.high = count, low, high
        super().__init__(seed, test_size)

    def problem(self, rng):
        numbers = [rng.randint(self.low, self.high) for _ in range(self.count)]
        while True:  # ends quickly: an all-"+" expression over positive numbers always qualifies
            value, text, _ = random_expression(rng, rng.sample(numbers, len(numbers)))
            if value > 0 and value.denominator == 1:
                return SolvedProblem(f"Use {' '.join(map(str, numbers))} to make {value}", str(value), text)

    def score(self, completion, problem):
        text = last_answer_tag(completion)
        try:
            value, literals = parse_expression(text, self.MAX_CHARS, self.MAX_DEPTH)
        except (ValueError, ZeroDivisionError):
            return make_score(False, True)
        given = sorted(Fraction(w) for w in problem.question.split()[1:-3])  # "Use 3 7 12 to make 33"
        return make_score(sorted(literals) == given and value == Fraction(problem.answer), False)

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
    prec = 1 if op in "+-" else 2
    if a_prec < prec:
        a_text = f"({a_text})"
    if b_prec < prec or (b_prec == prec and op in "-/"):  # a-(b+c) and a/(b*c) need them, a+(b-c) not
        b_text = f"({b_text})"
    return OPS[op](a, b), f"{a_text}{op}{b_text}", prec


def parse_expression(text, max_chars, max_depth):
    """Exact value and number literals of an arithmetic expression, by recursive descent:

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

    def expr(depth):
        value = term(depth)
        while peek() in ("+", "-"):
            op = take()
            value = OPS[op](value, term(depth))
        return value

    def term(depth):
        value = atom(depth)
        while peek() in ("*", "/"):
            op = take()
            value = OPS[op](value, atom(depth))
        return value

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
        return literals[-1]

    value = expr(0)
    if pos != len(tokens):
        raise ValueError(f"unexpected {tokens[pos]!r}")
    return value, literals


# A minus sign counts only where it cannot be subtraction, so "16-3-4=9" yields 9, not -4.
GSM8K_NUMBER = re.compile(r"(?:(?<![\w)])-)?(?:[0-9]{1,3}(?:,[0-9]{3})+(?:\.[0-9]+)?|[0-9]*\.?[0-9]+)")
BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


class GSM8K(Task):
    """Grade-school math word problems from a local JSONL file (`--data`), e.g. the GSM8K test set.

    Each line is {"question": ..., "answer": "worked solution ... #### 42"}. The file is split into
    test and train parts by a shuffle seeded with `seed`; the test part gets `test_size` problems but
    at most half the file, so there is always something to train on.

    Scoring reads one number from the completion: the last number inside the last <answer> tag if
    there is one, else inside the last \\boxed{...}, else the last number anywhere (so the reference
    solution's "#### 42" line counts). Numbers may have thousands commas, a sign and decimals, and are
    compared exactly ("3.50" == "3.5", "$1,000." == "1000"). Malformed: no number where one is looked for.
    """

    name = "gsm8k"
    needs_data = True
    max_new_tokens = 256

    def __init__(self, seed=0, data=None, test_size=500):
        problems = load_gsm8k(data)
        random.Random(f"{self.name}-split-{seed}").shuffle(problems)
        n_test = min(test_size, len(problems) // 2)
        self._test, self._train = problems[:n_test], problems[n_test:]

    def train_problems(self, count, seed):
        """`count` problems from the train part: shuffled passes over it, so repeats come only after
        every problem has been drawn once."""
        rng = random.Random(f"{self.name}-train-{seed}")
        out = []
        while len(out) < count:
            out += rng.sample(self._train, len(self._train))
        return out[:count]

    def score(self, completion, problem):
        tagged = last_answer_tag(completion)
        boxed = BOXED.findall(completion)
        text = tagged if tagged is not None else boxed[-1] if boxed else completion
        found = GSM8K_NUMBER.findall(text)
        if not found:
            return make_score(False, True)
        # Longer numbers never match a GSM8K answer, and Fraction() would be slow on (or refuse) huge ones.
        correct = len(found[-1]) <= 40 and Fraction(found[-1].replace(",", "")) == Fraction(problem.answer)
        return make_score(correct, False)

    def solution(self, problem):
        return problem.reference


def load_gsm8k(path):
    """SolvedProblems from a GSM8K JSONL file; the answer is the number after "####", without commas."""
    from minies import UserError

    if not path:
        raise UserError("--task gsm8k needs --data FILE: a local JSONL file with one "
                        '{"question": ..., "answer": "... #### <number>"} per line (e.g. tests/data/gsm8k_test.jsonl)')
    try:
        with open(path, "rb") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise UserError(f"--data {path}: cannot read it ({e.strerror}); "
                        "pass the path of a local GSM8K JSONL file") from None
    problems, seen = [], set()
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        problem = parse_gsm8k_line(line)
        if problem is None:
            raise UserError(f"{path} line {i}: expected a JSON object with string fields \"question\" and "
                            f"\"answer\", the answer ending in \"#### <number>\"; fix or delete that line")
        if problem.question not in seen:  # a repeated question could otherwise land in both splits
            seen.add(problem.question)
            problems.append(problem)
    if len(problems) < 2:
        raise UserError(f"--data {path}: {len(problems)} problem(s); need at least 2 (one to test, one to train on)")
    return problems


def parse_gsm8k_line(line):
    """The SolvedProblem on one JSONL line, or None if the line is not a valid GSM8K row."""
    try:
        row = json.loads(line)
    except ValueError:  # bad JSON or bad UTF-8
        return None
    if not (isinstance(row, dict) and isinstance(row.get("question"), str) and isinstance(row.get("answer"), str)):
        return None
    _, sep, final = row["answer"].rpartition("####")
    final = final.strip()
    if not sep or not GSM8K_NUMBER.fullmatch(final):
        return None
    return SolvedProblem(row["question"], final.replace(",", ""), row["answer"])


TASKS = {"arithmetic": Arithmetic, "countdown": Countdown, "gsm8k": GSM8K}
DEFAULT_TASK = "arithmetic"


def get_task(name=DEFAULT_TASK, seed=0, data=None):
    """The task called `name`; `data` is the local file of a dataset-backed task (e.g. gsm8k)."""
    from minies import UserError

    if name not in TASKS:
        raise UserError(f"--task {name}: unknown task; choose one of {', '.join(sorted(TASKS))}")
    return TASKS[name](seed=seed, data=data) if getattr(TASKS[name], "needs_data", False) else TASKS[name](seed=seed)
