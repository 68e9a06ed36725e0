"""Arithmetic: the sum of a few random integers. The default task: the shipped tiny model learns it in
minutes on a CPU and stays far from perfect, which leaves room for every method to show learning."""
import re

from minies.tasks.base import Problem, Task, last_answer_tag, make_score

ANSWER = re.compile(r"-?[0-9]{1,12}")  # ASCII digits only: int() would also read "１２" or "١٢"


class Arithmetic(Task):
    """Sum of `terms` random integers in [0, max_value]. terse: "12+93" -> "<answer>105</answer>";
    instruct: a one-line instruction that asks for the number inside the answer tag."""

    name = "arithmetic"
    default_max_new_tokens = {"terse": 10, "instruct": 256}

    def __init__(self, seed=0, test_size=500, terms=2, max_value=99, **kwargs):
        self.terms, self.max_value = terms, max_value
        super().__init__(seed, test_size, **kwargs)

    def problem(self, rng):
        xs = [rng.randint(0, self.max_value) for _ in range(self.terms)]
        if self.prompt_style == "terse":
            question = "+".join(map(str, xs))
        else:
            question = (f"What is {' + '.join(map(str, xs))}? Give only the final number inside <answer> </answer> "
                        "tags, for example <answer>17</answer>.")
        return Problem(question, str(sum(xs)))

    def score(self, completion, problem):
        text = last_answer_tag(completion)
        if text is None or not ANSWER.fullmatch(text):
            return make_score(False, True)
        return make_score(int(text) == int(problem.answer), False, answer=text)
