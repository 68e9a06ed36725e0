"""Arithmetic: the sum of a few random integers. The default task: the shipped tiny model learns it in
minutes on a CPU and stays far from perfect, which leaves room for every method to show learning.

Difficulty (--numbers, --low, --high): how many integers are summed (default 2, at most MAX_NUMBERS) and the
inclusive range each is drawn from (default 0..99, never below 0: a question writes the sum as 12+93). The
largest possible sum must fit in an answer's ANSWER_DIGITS digits. Several counts (--numbers 2 3) mix
difficulties: each problem draws its count, so one task holds problems a model solves at different rates, the
ground on which a policy that sharpens can lose the problems it solved only by sampling (docs/results.md).

Prompt styles: terse and instruct (minies/tasks/base.py) ask for the sum inside the answer tag. `equation` is
for small instruction-tuned models, which write "14 + 25 = 39" but not the tag (SmolLM2-135M-Instruct: 0%
well-formed answers on instruct prompts, docs/real-models.md): the chat asks "What is 14 + 25?" and the answer
is started for the model as "14 + 25 =", so the number it writes next is its answer. Whatever follows the
number is not read."""
import re

from minies import UserError
from minies.tasks.base import DEFAULT_SYSTEM, PROMPT_STYLES, Problem, PromptStyle, Task, last_answer_tag, make_score
from minies.tasks.difficulty import check_range, counts_of

ANSWER_DIGITS = 12
ANSWER = re.compile(rf"-?[0-9]{{1,{ANSWER_DIGITS}}}")  # ASCII digits only: int() would also read "１２" or "١٢"
LEADING_ANSWER = re.compile(rf"\s*(-?[0-9]{{1,{ANSWER_DIGITS}}})(?![0-9])")  # equation style: the number written first
# Past 50 terms a question tests reading a long prompt more than adding (an instruct question of 50 numbers of
# 12 digits is already ~800 characters).
MAX_NUMBERS = 50


class Arithmetic(Task):
    """Sum of `numbers` random integers in [low, high] (None: 2 in 0..99); `numbers` may be a list of counts,
    one drawn per problem. terse: "12+93" ->
    "<answer>105</answer>"; instruct: a one-line instruction that asks for the number inside the answer tag;
    equation: "What is 12 + 93?", answered after "12 + 93 =" -> " 105"."""

    name = "arithmetic"
    prompt_styles = {**PROMPT_STYLES, "equation": PromptStyle(system=DEFAULT_SYSTEM, user="What is {}?",
                                                              plain="What is {}?\n", prefill="{} =")}
    # equation: room for the number and a little after it, which is not read.
    default_max_new_tokens = {"terse": 10, "instruct": 256, "equation": 8}

    def __init__(self, seed=0, test_size=500, numbers=None, low=None, high=None, **kwargs):
        counts, self.low, self.high = self.difficulty(numbers, low, high).values()
        self.counts = tuple(counts)
        self.difficulty_given = (numbers, low, high)
        if not all(1 <= count <= MAX_NUMBERS for count in self.counts):
            raise UserError(f"--numbers {' '.join(map(str, self.counts))}: --task arithmetic sums 1 to {MAX_NUMBERS} "
                            "numbers")
        if self.low < 0:
            raise UserError(f"--low {self.low}: --task arithmetic sums numbers >= 0 (a question reads 12+93)")
        check_range(self.name, self.counts, self.low, self.high, test_size)
        largest = max(self.counts) * self.high
        if len(str(largest)) > ANSWER_DIGITS:
            raise UserError(f"--numbers {max(self.counts)} --high {self.high}: sums reach {largest}, "
                            f"past the {ANSWER_DIGITS} digits an answer may have; lower --high or --numbers")
        super().__init__(seed, test_size, **kwargs)

    def difficulty(self, numbers=None, low=None, high=None):
        return {"numbers": list(counts_of(numbers, (2,))), "low": 0 if low is None else low,
                "high": 99 if high is None else high}

    def problem_count(self):
        # The question writes the numbers in order: 12+93 and 93+12 are two problems.
        return sum((self.high - self.low + 1) ** count for count in self.counts)

    def hardest_problem(self):
        return Problem("", str(max(self.counts) * self.high))

    def problem(self, rng):
        count = self.counts[0] if len(self.counts) == 1 else rng.choice(self.counts)  # one count: no draw spent
        xs = [rng.randint(self.low, self.high) for _ in range(count)]
        if self.prompt_style == "terse":
            question = "+".join(map(str, xs))
        elif self.prompt_style == "equation":
            question = " + ".join(map(str, xs))
        else:
            question = (f"What is {' + '.join(map(str, xs))}? Give only the final number inside <answer> </answer> "
                        "tags, for example <answer>17</answer>.")
        return Problem(question, str(sum(xs)))

    def score(self, completion, problem):
        if self.prompt_style == "equation":
            found = LEADING_ANSWER.match(completion)
            text = found.group(1) if found else None
        else:
            text = last_answer_tag(completion)
        if text is None or not ANSWER.fullmatch(text):
            return make_score(False, True)
        return make_score(int(text) == int(problem.answer), False, answer=text)

    def solution(self, problem):
        return f" {problem.answer}" if self.prompt_style == "equation" else super().solution(problem)
