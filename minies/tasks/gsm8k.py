"""GSM8K: grade-school math word problems from a local JSON Lines file (`--data`), e.g. the GSM8K test set.

Each row is {"question": ..., "answer": "worked solution ... #### 42"}.

    terse     the bare question.
    instruct  the question, then: reason step by step and give the final number inside <answer> </answer>.

Scoring reads one number from the completion: the last number inside the last <answer> tag if there is
one, else inside the last \\boxed{...} (the answer format of Qwen-Math's prompts; braces nest, so
\\boxed{18 \\text{ dollars}} reads 18). Numbers may have thousands commas, a sign and decimals, and are
compared exactly ("3.50" == "3.5", "$1,000." == "1000"). Malformed: no number where one is looked for.

Data: train on GSM8K's train split (--data) and evaluate on its test split (--eval-data); the test split
ships in tests/data/gsm8k_test.jsonl, and docs/real-models.md says where to get the train split.

Strict and lenient answers. Training rewards are strict: only the tag or \\boxed{} count. The lenient mode
(`lenient=True`, eval.py --lenient-answers) falls back to the last number anywhere in the completion, as
many evaluations of untuned models do; under it almost every completion is well formed, and a reasoning
trace cut off by the token limit whose last number happens to be right would earn the full reward.
"""
import re
from fractions import Fraction

from minies.tasks.base import SolvedProblem, Task, last_answer_tag, make_score

# A minus sign counts only where it cannot be subtraction, so "16-3-4=9" yields 9, not -4.
GSM8K_NUMBER = re.compile(r"(?:(?<![\w)])-)?(?:[0-9]{1,3}(?:,[0-9]{3})+(?:\.[0-9]+)?|[0-9]*\.?[0-9]+)")
# Scoring reads no number longer than this: longer ones never match a GSM8K answer, and Fraction() would be slow on
# (or refuse) huge ones. A row whose answer is longer could never be answered right, so reading refuses it.
MAX_ANSWER_CHARS = 40
ROW_FORMAT = ('expected a JSON object with string fields "question" and "answer", the answer ending in '
              '"#### <number>"')


class GSM8K(Task):
    name = "gsm8k"
    reads_data = needs_data = True
    data_help = ("--task gsm8k reads its problems from files: --data FILE to train on (GSM8K's train split) and "
                 "--eval-data FILE to evaluate on (tests/data/gsm8k_test.jsonl is its test split); each a local JSON "
                 'Lines file with one {"question": ..., "answer": "... #### <number>"} per line')
    default_max_new_tokens = {"terse": 256, "instruct": 512}

    def __init__(self, seed=0, data=None, test_size=500, lenient=False, **kwargs):
        self.lenient = lenient
        super().__init__(seed, test_size, data=data, **kwargs)

    def parse_row(self, row):
        if not (isinstance(row, dict) and isinstance(row.get("question"), str) and isinstance(row.get("answer"), str)):
            raise ValueError(ROW_FORMAT)
        reasoning, sep, final = row["answer"].rpartition("####")
        final = final.strip()
        if not sep or not GSM8K_NUMBER.fullmatch(final):
            raise ValueError(ROW_FORMAT)
        # Rows that can never be answered right are errors, as malformed rows are, not notes.
        answer = final.replace(",", "")
        if not row["question"].strip():
            raise ValueError('"question" is empty: there is nothing to ask')
        if len(answer) > MAX_ANSWER_CHARS:
            raise ValueError(f'the answer after "####" has {len(answer)} characters; scoring reads numbers of at most '
                             f"{MAX_ANSWER_CHARS}, so no completion could be right")
        question = row["question"]
        if self.prompt_style == "instruct":
            question += ("\nSolve the problem step by step. Then give the final answer, a number only, inside "
                         "<answer> </answer> tags, for example <answer>42</answer>.")
        return SolvedProblem(question, answer, reasoning.rstrip())

    def score(self, completion, problem):
        tagged = last_answer_tag(completion)
        boxed = last_boxed(completion) if tagged is None else None
        text = tagged if tagged is not None else boxed if boxed is not None else completion if self.lenient else ""
        return score_last_number(text, problem.answer)

    def solution(self, problem):
        """The worked solution of the data file, then its final number in the answer tag."""
        return f"{problem.reference}\n<answer>{problem.answer}</answer>"

    def shortest_answer(self, problem):
        """The final number alone in the answer tag, which the verifier accepts without any reasoning."""
        return f"<answer>{problem.answer}</answer>"


def score_last_number(text, answer):
    """The Score of the last number in `text` against `answer` (a number without thousands commas), compared
    exactly; malformed where `text` holds no number."""
    found = GSM8K_NUMBER.findall(text)
    if not found:
        return make_score(False, True)
    number = found[-1]
    correct = len(number) <= MAX_ANSWER_CHARS and Fraction(number.replace(",", "")) == Fraction(answer)
    return make_score(correct, False, answer=number)


def last_boxed(completion):
    """The text inside the last complete \\boxed{...} of a completion, its braces balanced ("18 \\text{ dollars}"),
    or None. One pass with a stack of open braces, so that hostile input ("\\boxed{" repeated) stays linear."""
    opened, last = [], None  # opened: (position after "{", whether that brace opens a box)
    for match in re.finditer(r"\\boxed\{|[{}]", completion):
        if match.group() == "}":
            if opened:
                begin, is_box = opened.pop()
                if is_box and (last is None or begin > last[0]):
                    last = (begin, match.start())
        else:
            opened.append((match.end(), match.group() != "{"))
    return completion[last[0]:last[1]] if last else None
