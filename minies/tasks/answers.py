"""Answers: a data task with no code. `--task answers --data rows.jsonl --match exact|number|boxed|choice`.

Each row is {"prompt": ..., "answer": ...} ("question" may stand for "prompt"); the answer is text, or a JSON
number. The prompt is the user's message as written (terse), or followed by a line asking for the answer's
format (instruct). `--match` says how a completion's answer is read and compared with the row's:

    exact   the text inside the last <answer> tag equals the answer, whitespace runs and ends aside.
    number  the last number inside the last <answer> tag, else the last \\boxed{}, equals the answer's
            number exactly ("3.50" = "3.5", "1,000" = "1000"), as GSM8K reads them (minies/tasks/gsm8k.py).
    boxed   the last \\boxed{} equals the answer as mathematics (1/2 = 0.5 = \\frac{1}{2}; intervals, sets,
            expressions): math-verify, an optional dependency (minies/tasks/math_answers.py).
    choice  the answer is one letter (a multiple-choice option); the last <answer> tag holds that letter,
            alone or as "(B)", "B)" or "B.", in either case.

Malformed: no answer where one is looked for (no tag, no box, no number, not a single letter). Reading and
splitting the file (train and test splits, --eval-data, large files) is every data task's (base.py, data.py).
"""
import re

from minies import UserError
from minies.tasks.base import Problem, Task, last_answer_tag, make_score
from minies.tasks.gsm8k import GSM8K_NUMBER, MAX_ANSWER_CHARS, last_boxed, score_last_number
from minies.tasks.math_answers import math_verify, same_math

MATCHES = ("exact", "number", "boxed", "choice")
CHOICE = re.compile(r"\(?([A-Za-z])[).:]?")
# What the instruct style adds after the prompt, per match: the format the answer is read from.
ASK = {"exact": "Give the final answer inside <answer> </answer> tags.",
       "number": ("Give the final answer, a number only, inside <answer> </answer> tags, for example "
                  "<answer>42</answer>."),
       "boxed": "Put the final answer inside \\boxed{}.",
       "choice": "Give the letter of the right option inside <answer> </answer> tags, for example <answer>B</answer>."}


def normalized(text):
    return " ".join(text.split())


class Answers(Task):
    name = "answers"
    reads_data = needs_data = True
    data_help = ('--task answers reads its problems from files: --data FILE (and optionally --eval-data FILE), each a '
                 'local JSON Lines file with one {"prompt": ..., "answer": ...} per line, checked by --match')
    default_max_new_tokens = {"terse": 64, "instruct": 512}

    def __init__(self, seed=0, data=None, test_size=500, match=None, **kwargs):
        self.match = match or "exact"
        if self.match not in MATCHES:
            raise UserError(f"--match {self.match}: choose one of {', '.join(MATCHES)}")
        if self.match == "boxed":
            math_verify()  # missing: one line saying how to install it, before any file is read
        super().__init__(seed, test_size, data=data, **kwargs)

    def parse_row(self, row):
        if not isinstance(row, dict):
            raise ValueError('expected a JSON object with a "prompt" (or "question") and an "answer"')
        keys = [key for key in ("prompt", "question") if key in row]
        if len(keys) != 1:
            raise ValueError('give the prompt as "prompt" or as "question", once' if keys else
                             'no "prompt" (or "question"): there is nothing to ask')
        prompt, answer = row[keys[0]], row.get("answer")
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(f'"{keys[0]}" must be non-empty text')
        if isinstance(answer, (int, float)) and not isinstance(answer, bool):
            answer = str(answer)
        if not isinstance(answer, str) or not answer.strip():
            raise ValueError('"answer" must be non-empty text or a number')
        answer = self.checked_answer(answer.strip())
        if self.prompt_style == "instruct":
            prompt += "\n" + ASK[self.match]
        return Problem(prompt, answer)

    def checked_answer(self, answer):
        """The row's answer in the form the match compares, or ValueError where no completion could match it."""
        if self.match == "number":
            if not GSM8K_NUMBER.fullmatch(answer) or len(answer) > MAX_ANSWER_CHARS:
                raise ValueError(f'"answer" {answer[:40]!r} is not a number of at most {MAX_ANSWER_CHARS} '
                                 "characters, which --match number needs")
            return answer.replace(",", "")
        if self.match == "choice":
            found = CHOICE.fullmatch(answer)
            if not found:
                raise ValueError(f'"answer" {answer[:40]!r} is not one letter, which --match choice needs')
            return found.group(1).upper()
        return normalized(answer) if self.match == "exact" else answer

    def score(self, completion, problem):
        if self.match == "boxed":
            text = last_boxed(completion)
            correct, readable = same_math(text, problem.answer) if text is not None else (False, False)
            return make_score(correct, not readable, answer=text)
        text = last_answer_tag(completion)
        if self.match == "number":
            return score_last_number(text if text is not None else last_boxed(completion) or "", problem.answer)
        if self.match == "choice":
            found = CHOICE.fullmatch(text) if text is not None else None
            if not found:
                return make_score(False, True)
            return make_score(found.group(1).upper() == problem.answer, False, answer=found.group(1).upper())
        if text is None:
            return make_score(False, True)
        return make_score(normalized(text) == problem.answer, False, answer=text)

    def solution(self, problem):
        return f"\\boxed{{{problem.answer}}}" if self.match == "boxed" else super().solution(problem)
