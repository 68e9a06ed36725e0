"""Countdown: combine the given numbers with + - * / and parentheses, each number exactly once, to hit a
target. The task of the founding ES papers (TinyZero's Countdown-Tasks-3to4, Qiu et al. 2025).

Problems are generated (every one solvable by construction: the target is the value of a random expression
over the numbers) or read from a data file in the public formats: JSON Lines or a JSON list whose rows hold
`numbers` (or `nums`, TinyZero's name) and `target`, an integer or a string holding a number (Qiu et al.'s
file writes "98", and "85.5" or "266.6666666666667" for targets reached with division), optionally
`context` (Qiu et al.'s exact prompt) and `solution` (a reference expression, or null).

Prompt styles (--prompt-style):
    terse     "Use 3 7 12 to make 33"; 3 numbers in 1..20. Short, for a character-level model.
    instruct  minies' instruction: the numbers, the target, the rules, reasoning inside <think> </think>
              and the final expression inside <answer> </answer>, with an example; chat template.
    qiu       Qiu et al.'s prompt, fed as raw text with no chat template and ending in "Let me solve this
              step by step.\\n<think>": the row's `context` as published, else the same text built from
              the numbers and target.
    tinyzero  TinyZero's: its system message and question in the chat template, the assistant's turn
              pre-filled with "Let me solve this step by step.\\n<think>" (its base-model text for a
              tokenizer without a chat template).
Generated problems of every style but terse have 3 or 4 numbers in 1..99 and a target in 1..100.

Difficulty (--numbers, --low, --high): how many numbers a generated problem has (2 to 6; default: the style's)
and the inclusive range they are drawn from (low >= 1; default: the style's). The target cap of 100 belongs to
the papers' distribution, numbers in 1..99 (TinyZero's Countdown-Tasks-3to4, Qiu et al.'s file): it holds
while the range is 1..99, whatever --numbers says, and is lifted for any other range, where the target is
whatever positive integer the random expression over the numbers reaches, as terse problems always were (a
cap of 100 over numbers in 100..999 would keep only the expressions that cancel the numbers out).

Reward schemes (--reward; `auto` takes the prompt style's own: qiu -> qiu, tinyzero -> tinyzero, else minies).
Each reads only the completion (docs/papers.md gives the formulas):
    minies    1·correct + 0.1·well_formed. The last <answer> holds EXPR: non-negative integer or decimal
              numbers, + - * /, parentheses, spaces; no unary minus, no "=". Parsed by recursive descent
              and evaluated exactly (Fractions). Malformed: no tag, an EXPR that does not parse, longer than
              MAX_CHARS, nested deeper than MAX_DEPTH, or dividing by zero.
    qiu       Qiu et al.'s: answer + 0.1·format. format is 1 when "<think>" + completion is exactly
              <think>…</think>\\n<answer>…</answer>, else 0.1 for a think block plus 0.5 for an answer block;
              answer is 1 when the last <answer>'s text is made of digits, + - * / ( ) and spaces only, its
              integers are the given numbers, and its value (Python's arithmetic) is within 1e-5 of the target.
    tinyzero  TinyZero's: 0 without an <answer> on the completion's last line, 1 when that answer uses the
              given numbers and its value is within 1e-5 of the target, else 0.1.
The expression machinery (both readers, the brute-force solver) is in minies/tasks/expressions.py. A Score's
`malformed` means the same in every scheme: no answer that reads as an expression.
"""
import math
import random
import re
from dataclasses import dataclass, field
from fractions import Fraction

from minies.tasks.base import (PROMPT_STYLES, PromptStyle, Score, SolvedProblem, Task, answer_tags, last_answer_tag,
                               make_score)
from minies import UserError
from minies.tasks.difficulty import check_range, counts_of, refuse_with_files
from minies.tasks.expressions import (TARGET, TOLERANCE, cached_solutions, parse_expression, python_value,
                                      random_expression, reaches, solvable)

# (numbers per problem, smallest number, largest number, largest target or None) of generated problems
GENERATED = {"terse": ((3,), 1, 20, None), "instruct": ((3, 4), 1, 99, 100)}

# The papers' prompts, character for character (their data and code).
THE_RULES = ("create an equation that equals {target}. You can use basic arithmetic operations (+, -, *, /) and each "
             "number can only be used once. Show your work in <think> </think> tags. And return the final answer in "
             "<answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>.")
PREFILL = "Let me solve this step by step.\n<think>"
QIU_PROMPT = ("You are a helpful assistant. You first think about the reasoning process in your mind and then provide "
              "the user with the answer.Using the numbers [{numbers}], " + THE_RULES + PREFILL)
TINYZERO_QUESTION = "Using the numbers {numbers}, " + THE_RULES
TINYZERO_SYSTEM = ("You are a helpful assistant. You first thinks about the reasoning process in the mind and then "
                   "provides the user with the answer.")
TINYZERO_PLAIN = ("A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
                  "The assistant first thinks about the reasoning process in the mind and then provides the user with "
                  "the answer.\nUser: {}\nAssistant: ")
STYLES = {**PROMPT_STYLES, "qiu": PromptStyle(chat=False, reward="qiu"),
          "tinyzero": PromptStyle(system=TINYZERO_SYSTEM, user=" {}", plain=TINYZERO_PLAIN, prefill=PREFILL,
                                  reward="tinyzero")}

DIGITS = re.compile(r"\d+")
QIU_CHARACTERS = re.compile(r"[0-9+\-*/() ]+\n?")  # their `^...$`, which also lets one final newline through
TINYZERO_CHARACTERS = re.compile(r"[\d+\-*/().\s]+")


@dataclass(frozen=True)
class CountdownProblem(SolvedProblem):
    numbers: tuple = field(default=(), compare=False)  # the numbers to use; the target is `answer` (text)


class Countdown(Task):
    """See the module docstring. `numbers`, `low` and `high` override the style's generated numbers."""

    name = "countdown"
    reads_data = True
    prompt_styles = STYLES
    rewards = ("minies", "qiu", "tinyzero")
    # terse: "<answer>" and "</answer>" are one token each and 3 numbers need ~12 characters;
    # the others: room to reason, as Qiu et al. and TinyZero generate up to 1024 tokens.
    default_max_new_tokens = {"terse": 32, "instruct": 1024, "qiu": 1024, "tinyzero": 1024}
    MAX_CHARS = 200  # also bounds every literal and intermediate value to a few hundred digits
    MAX_DEPTH = 10  # a real solution over a few numbers nests far less
    # 2 to 6 numbers, as in a data file's rows (parse_row). One number is no puzzle. Evaluation counts the
    # distinct solutions of every solved problem by brute force (expressions.solutions: every expression over
    # every subset of the numbers), about 30 times the work per added number: on one core 0.02 s for 4
    # numbers, 0.3 s for 5, 9 s for 6, and minutes for 7.
    MIN_NUMBERS, MAX_NUMBERS = 2, 6
    # Training rows solved to tell the user of those with no solution: a few ms a row of 4 numbers, up to ~0.3 s
    # of 6 (expressions.solvable); a larger file is sampled (check_training_rows).
    CHECKED_ROWS = 200
    # A target written with a point or an exponent is a float in JSON; Python writes it out in digits (as the
    # prompt shows it) only from 1e-4 to 1e16 in size, and past 1e16 a float has lost digits of the number.
    FLOAT_TARGETS = (1e-4, 1e16)

    def __init__(self, seed=0, test_size=500, numbers=None, low=None, high=None, prompt_style="terse", **kwargs):
        for flag in ("data", "eval_data"):
            if kwargs.get(flag) is not None:
                refuse_with_files(f"the problems come from --{flag.replace('_', '-')} {kwargs[flag]}", numbers, low,
                                  high)
        self.counts, self.low, self.high = generated(prompt_style, numbers, low, high)
        self.difficulty_given = (numbers, low, high)
        _, default_low, default_high, max_target = GENERATED["terse" if prompt_style == "terse" else "instruct"]
        self.max_target = max_target if (self.low, self.high) == (default_low, default_high) else None  # docstring
        if not all(self.MIN_NUMBERS <= count <= self.MAX_NUMBERS for count in self.counts):
            raise UserError(f"--numbers {' '.join(map(str, self.counts))}: --task countdown takes {self.MIN_NUMBERS} "
                            f"to {self.MAX_NUMBERS} numbers (counting the solutions of more takes minutes per problem)")
        if self.low < 1:
            raise UserError(f"--low {self.low}: --task countdown draws numbers >= 1 (positive numbers always reach a "
                            "target: their sum)")
        check_range(self.name, self.counts, self.low, self.high, test_size)
        super().__init__(seed, test_size, prompt_style=prompt_style, **kwargs)

    def difficulty(self, numbers=None, low=None, high=None):
        if self.reads_files:
            return super().difficulty(numbers, low, high)
        counts, low, high = generated(self.prompt_style, numbers, low, high)
        return {"numbers": list(counts), "low": low, "high": high}

    def hardest_problem(self):
        if self.reads_files:
            return None
        return CountdownProblem("", "1", None, (self.high,) * max(self.counts))

    def shortest_answer(self, problem):
        """Every number once, joined by one operator each and no parentheses: no answer is shorter."""
        return f"<answer>{'+'.join(map(str, problem.numbers))}</answer>"

    def make_problem(self, numbers, target, reference=None, context=None):
        """The problem of reaching `target` (a number or its text) with `numbers`, asked in this task's style;
        `context`, a published prompt, is the question of the qiu style when given."""
        numbers, target = tuple(numbers), str(target)
        if self.prompt_style == "terse":
            question = f"Use {' '.join(map(str, numbers))} to make {target}"
        elif self.prompt_style == "qiu":
            question = context if context is not None else QIU_PROMPT.format(numbers=qiu_numbers(numbers),
                                                                               target=target)
        elif self.prompt_style == "tinyzero":
            question = TINYZERO_QUESTION.format(numbers=list(numbers), target=target)
        else:
            question = (f"Using the numbers [{', '.join(map(str, numbers))}], create an equation that equals {target}. "
                        "You can use +, -, *, / and parentheses, and each number must be used exactly once. Show "
                        "your reasoning inside <think> </think> tags, then give only the final equation inside "
                        "<answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>.")
        return CountdownProblem(question, target, reference, numbers)

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
        if "numbers" in row and "nums" in row:
            raise ValueError("both \"numbers\" and \"nums\": give one of them")
        numbers, target = row.get("numbers", row.get("nums")), row.get("target")
        if not (isinstance(numbers, list) and 2 <= len(numbers) <= 6
                and all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in numbers)):
            raise ValueError("\"numbers\" (or \"nums\") must be a list of 2 to 6 positive integers")
        low, high = self.FLOAT_TARGETS
        if isinstance(target, float) and not math.isnan(target) and target and not low <= abs(target) < high:
            raise ValueError(f"\"target\" {target!r} is out of range: a target written with a point or an exponent "
                             f"must be 0 or from {low:g} to {high:g} in size (an integer may be larger)")
        if isinstance(target, (int, float)) and not isinstance(target, bool):
            target = str(target)
        if not (isinstance(target, str) and TARGET.fullmatch(target)):
            raise ValueError("\"target\" must be a number, or a string holding one (\"98\", \"85.5\")")
        for key in ("context", "solution"):
            if row.get(key) is not None and not isinstance(row[key], str):
                raise ValueError(f"\"{key}\" must be a string (or null)")
        return self.make_problem(numbers, target, row.get("solution"), row.get("context"))

    def check_training_rows(self, data):
        """Note the training rows with no solution (they can only score 0), and refuse a file where none has
        one. Past CHECKED_ROWS rows, a sample of CHECKED_ROWS drawn at random (always the same for the same
        number of rows) stands for them: solving every row of a large file would take minutes to hours."""
        rows, n = self._train, len(self._train)
        checked = range(n) if n <= self.CHECKED_ROWS else (
            random.Random(f"countdown-check-{n}").sample(range(n), self.CHECKED_ROWS))
        unsolvable = sum(not solvable(rows[i].numbers, rows[i].answer) for i in checked)
        sampled = f" of {len(checked)} drawn at random from its {n}" if len(checked) < n else ""
        if unsolvable == len(checked):
            raise UserError(f"--data {data}: no training problem{sampled} can be solved (no expression over its "
                            "numbers reaches its target); check the file's numbers and targets")
        if unsolvable and sampled:
            self.notes.append(f"about {unsolvable / len(checked):.0%} of the {n} training problems of {data} have no "
                              f"solution ({unsolvable} of {len(checked)} checked at random): they can only score 0")
        elif unsolvable:
            self.notes.append(f"{unsolvable} of the {n} training problems of {data} have no solution "
                              "(no expression over their numbers reaches the target): they can only score 0")

    def score(self, completion, problem):
        return {"minies": self.minies_score, "qiu": qiu_score, "tinyzero": tinyzero_score}[self.reward](
            completion, problem)

    def minies_score(self, completion, problem):
        text = last_answer_tag(completion)
        try:
            value, literals, form = parse_expression(text, self.MAX_CHARS, self.MAX_DEPTH)
        except (ValueError, ZeroDivisionError):
            return make_score(False, True)
        given = sorted(Fraction(n) for n in problem.numbers)
        return make_score(sorted(literals) == given and reaches(value, problem.answer), False, form, text)

    def solution_count(self, problem):
        return len(cached_solutions(problem.numbers, problem.answer))

    def solution(self, problem):
        return f"<answer>{problem.reference}</answer>"


def generated(prompt_style, numbers=None, low=None, high=None):
    """(numbers per problem it may choose, smallest, largest) of generated problems: the flags, else the style's."""
    counts, default_low, default_high, _ = GENERATED["terse" if prompt_style == "terse" else "instruct"]
    return counts_of(numbers, counts), default_low if low is None else low, default_high if high is None else high


def qiu_score(completion, problem):
    """Qiu et al.'s reward (module docstring): answer + 0.1·format."""
    format_credit = 1.0 if qiu_envelope("<think>" + completion) else (
        0.1 * ("</think>" in completion) + 0.5 * bool(answer_tags(completion)))
    tags = answer_tags(completion)
    text = tags[-1] if tags else ""
    value = python_value(text) if QIU_CHARACTERS.fullmatch(text) else None
    correct = (value is not None and sorted(map(int, DIGITS.findall(text))) == sorted(problem.numbers)
               and reaches(value, problem.answer, TOLERANCE))
    return public_score(float(correct) + 0.1 * format_credit, correct, value is None, format_credit, text)


def qiu_envelope(text):
    """Whether `text` is exactly <think>…</think>\\n<answer>…</answer> (one final newline allowed), as Qiu et
    al.'s regular expression ^<think>.*?</think>\\n<answer>.*?</answer>$ decides, in one pass: their
    backtracking match is quadratic on a completion that repeats the separator."""
    core = text[:-1] if text.endswith("</answer>\n") else text
    if not (core.startswith("<think>") and core.endswith("</answer>")):
        return False
    middle = core.find("</think>\n<answer>", len("<think>"))
    return middle >= 0 and middle + len("</think>\n<answer>") <= len(core) - len("</answer>")


def tinyzero_score(completion, problem):
    """TinyZero's reward (module docstring): 0, 0.1 or 1."""
    tags = answer_tags(completion.split("\n")[-1])
    if not tags:
        return public_score(0.0, False, True, 0.0, "")
    text = tags[-1].strip()
    value = python_value(text) if TINYZERO_CHARACTERS.fullmatch(text) else None
    correct = (value is not None and sorted(map(int, DIGITS.findall(text))) == sorted(problem.numbers)
               and reaches(value, problem.answer, TOLERANCE))
    return public_score(1.0 if correct else 0.1, correct, value is None, 1.0, text)


def public_score(reward, correct, malformed, format_credit, text):
    """The Score of a public scheme; a correct answer's solution is its canonical form where minies' own
    grammar reads it (solutions() counts those), else its text."""
    solution = None
    if correct:
        try:
            solution = parse_expression(text.strip(), Countdown.MAX_CHARS, Countdown.MAX_DEPTH)[2]
        except (ValueError, ZeroDivisionError):
            solution = text.strip()
    return Score(reward, correct, malformed, solution, format_credit, None if malformed else text.strip())


def qiu_numbers(numbers):
    """The numbers as Qiu et al.'s prompts print them (numpy's style): [44 19 35], [83 78  1 39]."""
    width = max(len(str(n)) for n in numbers)
    return " ".join(str(n).rjust(width) for n in numbers)
