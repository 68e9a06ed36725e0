"""What every task shares: problems, scores, the answer tag, prompt styles, and a seeded train/test split
of problems that are either generated from a seed or read from a local data file.

The verifier only ever sees the completion (never the prompt), so examples inside the prompt cannot earn
reward (docs/papers.md, the pitfalls of ES at scale).

Reward = 1.0 * correct + FORMAT_BONUS * well_formed, where well_formed means an answer could be extracted
from the completion (it is not `malformed`). The bonus is small so that being right always dominates, but
it gives a learning signal to a model that has not yet found the format.

Prompt styles. The same problem can be asked in two ways: `terse`, the short question the shipped tiny
models were trained on ("12+93"), and `instruct`, a full instruction for an instruction-tuned model, saying
what to compute and in which format to answer. An instruction-tuned model asked the terse way answers in
prose, never inside the answer tag, so every completion scores 0 and no method can learn.
"""
import json
import random
import re
from dataclasses import dataclass, field

from minies import UserError

FORMAT_BONUS = 0.1
ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
PROMPT_STYLES = ("terse", "instruct")


@dataclass(frozen=True)
class Problem:
    question: str  # the user message; the chat template turns it into the model's prompt
    answer: str  # ground truth, as text


@dataclass(frozen=True)
class SolvedProblem(Problem):
    """A Problem that carries its reference solution. Equality and hashing ignore `reference`, so the
    split's dedup on `question` works unchanged."""

    reference: str = field(compare=False)


@dataclass(frozen=True)
class Score:
    reward: float
    correct: bool
    malformed: bool
    # Which correct solution this is, for tasks with several (Countdown: the expression's canonical form);
    # None where every correct answer is the same solution.
    solution: str = None


def last_answer_tag(completion):
    """The text inside the last <answer>...</answer> of a completion, or None."""
    # No match can end after the last closing tag. Cutting that tail off keeps the lazy regex linear on
    # hostile input: thousands of unclosed "<answer>" would each scan to the end (quadratic time).
    end = completion.rfind("</answer>")
    found = ANSWER_TAG.findall(completion[:end + len("</answer>")]) if end >= 0 else []
    return found[-1].strip() if found else None


def make_score(correct, malformed, solution=None):
    return Score(reward=float(correct) + FORMAT_BONUS * (not malformed), correct=correct, malformed=malformed,
                 solution=solution if correct else None)


class Task:
    """Base class. Subclasses define `problem(rng)` (generated tasks) or `parse_row(row)` (tasks that read
    a data file), `score(completion, problem)` and `solution(problem)`.

    Generated: the test split is drawn first from `seed`; training problems are drawn from any other seed
    and never include a test problem. From a file (`data`): the problems are shuffled with `seed`, the
    first `test_size` (at most half the file) are the test split and training draws shuffled passes over
    the rest. Either way the two splits never overlap.
    """

    name = "task"
    reads_data = False  # whether --data FILE can be given
    needs_data = False  # whether it must be
    # Generation length per prompt style: enough for the answer format, or for reasoning before it.
    # Generation stops early at EOS; a completion cut off here usually has no answer and scores 0.
    default_max_new_tokens = {"terse": 32, "instruct": 512}

    def __init__(self, seed=0, test_size=500, prompt_style="terse", max_new_tokens=None, data=None):
        if prompt_style not in PROMPT_STYLES:
            raise UserError(f"--prompt-style {prompt_style}: choose one of {', '.join(PROMPT_STYLES)}")
        self.prompt_style = prompt_style
        self.max_new_tokens = max_new_tokens or self.default_max_new_tokens[prompt_style]
        if data is not None and not self.reads_data:
            raise UserError(f"--data {data}: --task {self.name} generates its own problems and reads no data "
                            "file; drop --data")
        if data is None and self.needs_data:
            raise UserError(self.data_help)
        self._train = None
        if data is None:
            self._draw_test_split(seed, test_size)
        else:
            problems = read_problems(data, self.parse_row)
            random.Random(f"{self.name}-split-{seed}").shuffle(problems)
            n_test = min(test_size, len(problems) // 2)
            self._test, self._train = problems[:n_test], problems[n_test:]
            self._test_questions = {p.question for p in self._test}

    def _draw_test_split(self, seed, test_size):
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
        """`count` training problems drawn from `seed`, none of them in the test split. From a file:
        shuffled passes over its train part, so repeats come only after every problem was drawn once."""
        rng = random.Random(f"{self.name}-train-{seed}")
        out = []
        while len(out) < count:
            if self._train is not None:
                out += rng.sample(self._train, len(self._train))
                continue
            p = self.problem(rng)
            if p.question not in self._test_questions:
                out.append(p)
        return out[:count]

    def problem(self, rng):
        raise NotImplementedError

    def parse_row(self, row):
        """The Problem in one row of a data file (a JSON value); raises ValueError saying what is wrong."""
        raise NotImplementedError

    def score(self, completion, problem):
        raise NotImplementedError

    def solution(self, problem):
        """A reference completion in the format the verifier expects (used for the SFT warm start)."""
        return f"<answer>{problem.answer}</answer>"

    def solution_count(self, problem):
        """How many distinct correct solutions the problem has (Score.solution tells them apart)."""
        return 1


def read_problems(path, parse_row):
    """Problems from a local data file: JSON Lines (one JSON value per line) or one JSON list. A row that
    `parse_row` rejects ends with one line naming the file, the line (or list row) and what is wrong.
    Repeated questions are kept once, so that none can land in both splits."""
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) else "not UTF-8 text"
        raise UserError(f"--data {path}: cannot read it ({reason}); pass the path of a local JSON Lines file") from None
    if text.lstrip().startswith("["):
        try:
            rows = [(f"row {i}", row) for i, row in enumerate(json.loads(text), 1)]
        except ValueError as e:
            raise UserError(f"{path}: not valid JSON ({e}); fix the file or write one JSON object per line") from None
    else:
        rows = [(f"line {i}", line) for i, line in enumerate(text.splitlines(), 1) if line.strip()]
    problems, seen = [], set()
    for where, row in rows:
        try:
            problem = parse_row(json.loads(row) if isinstance(row, str) else row)
        except ValueError as e:  # bad JSON, or a row parse_row rejects
            raise UserError(f"{path} {where}: {e}; fix or delete that {where.split()[0]}") from None
        if problem.question not in seen:
            seen.add(problem.question)
            problems.append(problem)
    if len(problems) < 2:
        raise UserError(f"--data {path}: {len(problems)} problem(s); need at least 2 (one to test, one to train on)")
    return problems
