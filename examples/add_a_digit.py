"""An example task in one file: add a one-digit number to a two-digit one, asked the shipped tiny model's way.

    python train.py --task examples/add_a_digit.py --algo grpo

The shipped model (minies/assets/tiny) learned sums of two numbers of up to two digits, mostly two; "47+6" is
rare in what it saw, and it gets about one in twelve right before training (docs/tasks.md gives its before ->
after). A task file defines one subclass of minies.tasks.Task: how a problem is made, and how a completion is
scored.
"""
import re

from minies.tasks import Problem, Task, last_answer_tag, make_score


class AddADigit(Task):
    default_max_new_tokens = {"terse": 10, "instruct": 256}  # "<answer>103</answer>": 5 tokens, then EOS

    def problem(self, rng):
        """The question the model reads (the user's chat message) and its answer, as text."""
        number, digit = rng.randint(10, 99), rng.randint(0, 9)
        return Problem(f"{number}+{digit}", str(number + digit))

    def score(self, completion, problem):
        """1.1 for the right number inside the answer tag, 0.1 for another number there, 0 for no number."""
        text = last_answer_tag(completion)
        if text is None or not re.fullmatch(r"[0-9]{1,3}", text):
            return make_score(correct=False, malformed=True)
        return make_score(correct=text == problem.answer, malformed=False, answer=text)
