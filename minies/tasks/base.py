"""What every task shares: problems, scores, the answer tag, prompt styles, reward schemes, and the split
of problems into a training set and a held-out test set, generated from a seed or read from data files.

The verifier only ever sees the completion (never the prompt), so examples inside the prompt cannot earn
reward (docs/papers.md, the pitfalls of ES at scale).

Reward (the `minies` scheme, every task's default) = 1.0 * correct + FORMAT_BONUS * well_formed, where
well_formed means an answer could be extracted from the completion (it is not `malformed`). The bonus is
small so that being right always dominates, but it gives a learning signal to a model that has not yet
found the format. Countdown also offers the public papers' schemes (minies/tasks/countdown.py).

Prompt styles. The same problem can be asked in several ways: `terse`, the short question the shipped tiny
models were trained on ("12+93"), and `instruct`, a full instruction for an instruction-tuned model, saying
what to compute and in which format to answer. An instruction-tuned model asked the terse way answers in
prose, never inside the answer tag, so every completion scores 0 and no method can learn. Countdown adds
the papers' own prompts. A style's PromptStyle says how its question becomes the model's prompt.

Splits. Generated tasks draw the test split first from the seed; training problems are drawn from any
other seed and never include a test problem. With data files (`data` to train on, `eval_data` to evaluate
on) every row of `eval_data` is a test problem, and every row of `data` that is not one trains. With `data`
alone, `train_problems=N` takes its first N rows to train on and the rest to test on, in the file's order
(Qiu et al.'s regime: the first 200 rows, then the last 2,000); without it, a fallback shuffles the file
with the seed and holds out `test_size` rows (at most half), which `notes` report. A fixed
training set (`train_problems=N`) is the same N problems every step; otherwise training draws shuffled
passes over the training rows, or fresh generated problems. A data file's problems are parsed when used
(minies/tasks/data.py): its rows are shuffled, split and drawn by position.
"""
import dataclasses
import random
import re
from array import array
from dataclasses import dataclass, field

import numpy as np

from minies import UserError
from minies.tasks.data import Rows, read_problems
from minies.tasks.difficulty import Difficulty

FORMAT_BONUS = 0.1
ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
REWARDS = ("minies", "qiu", "tinyzero")


@dataclass(frozen=True)
class PromptStyle:
    """How a question becomes the model's prompt (rollout.format_prompts): with `chat`, the user message of
    the tokenizer's chat template (when it has one and --chat-template is on), after the `system` message
    if one is given, written through the `user` format; else through `plain`. `prefill`, the start of the
    answer written for the model, follows either way ("{}" in it stands for the question). `reward`: the
    scheme that goes with it (--reward auto)."""
    chat: bool = True
    system: str = None
    user: str = "{}"
    plain: str = "{}"
    prefill: str = ""
    reward: str = "minies"


# An instruction-tuned model's chat template adds its own identity prompt when a conversation has no system
# message ("You are a helpful AI assistant named SmolLM, trained by Hugging Face", "You are Qwen, created by
# Alibaba Cloud..."): instruct prompts carry this task-neutral one instead, the same for every model (--system).
DEFAULT_SYSTEM = "You are a helpful assistant."
PROMPT_STYLES = {"terse": PromptStyle(), "instruct": PromptStyle(system=DEFAULT_SYSTEM)}


@dataclass(frozen=True)
class Problem:
    question: str  # what the prompt style writes into the prompt (Task.prompts)
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
    malformed: bool  # no answer could be read from the completion
    # Which correct solution this is, for tasks with several (Countdown: the expression's canonical form);
    # None where every correct answer is the same solution.
    solution: str = None
    format: float = 0.0  # the reward scheme's credit for the answer format, in [0, 1]
    answer: str = None  # the answer read from the completion (None when malformed)


def answer_tags(completion):
    """The texts inside every <answer>...</answer> of a completion, as written (not stripped)."""
    # No match can end after the last closing tag. Cutting that tail off keeps the lazy regex linear on
    # hostile input: thousands of unclosed "<answer>" would each scan to the end (quadratic time).
    end = completion.rfind("</answer>")
    return ANSWER_TAG.findall(completion[:end + len("</answer>")]) if end >= 0 else []


def last_answer_tag(completion):
    """The text inside the last <answer>...</answer> of a completion, stripped, or None."""
    found = answer_tags(completion)
    return found[-1].strip() if found else None


def make_score(correct, malformed, solution=None, answer=None):
    """The `minies` scheme's Score: 1 for a correct answer, FORMAT_BONUS for any answer that could be read."""
    return Score(reward=float(correct) + FORMAT_BONUS * (not malformed), correct=correct, malformed=malformed,
                 solution=solution if correct else None, format=float(not malformed),
                 answer=None if malformed else answer)


class Task(Difficulty):
    """Base class. Subclasses define `problem(rng)` (generated tasks) or `parse_row(row)` (tasks that read
    a data file), `score(completion, problem)` and `solution(problem)`; the module docstring describes the
    splits."""

    name = "task"
    reads_data = False  # whether --data FILE can be given
    needs_data = False  # whether it must be
    prompt_styles = PROMPT_STYLES
    rewards = ("minies",)  # the reward schemes it offers
    # Generation length per prompt style: enough for the answer format, or for reasoning before it.
    # Generation stops early at EOS; a completion cut off here usually has no answer and scores 0.
    default_max_new_tokens = {"terse": 32, "instruct": 512}

    def __init__(self, seed=0, test_size=500, prompt_style="terse", max_new_tokens=None, data=None, eval_data=None,
                 train_problems=None, reward="auto", system=None):
        if prompt_style not in self.prompt_styles:
            raise UserError(f"--prompt-style {prompt_style}: --task {self.name} offers "
                            f"{', '.join(self.prompt_styles)}")
        self.prompt_style, self.style = prompt_style, self.prompt_styles[prompt_style]
        self.reads_files = data is not None or eval_data is not None
        self.system_given = system is not None  # checked against the tokenizer's chat template (fit.py)
        if system is not None:
            if not self.style.chat:
                raise UserError(f"--system: --prompt-style {prompt_style} is raw text with no chat template, so it "
                                "has no system message; drop --system")
            self.style = dataclasses.replace(self.style, system=system)
        self.reward = self.style.reward if reward == "auto" else reward
        if self.reward not in self.rewards:
            raise UserError(f"--reward {self.reward}: --task {self.name} offers {', '.join(self.rewards)}")
        self.max_new_tokens = max_new_tokens or self.default_max_new_tokens[prompt_style]
        for flag, path in (("--data", data), ("--eval-data", eval_data)):
            if path is not None and not self.reads_data:
                raise UserError(f"{flag} {path}: --task {self.name} generates its own problems and reads no data "
                                f"file; drop {flag}")
        if data is None and eval_data is None and self.needs_data:
            raise UserError(self.data_help)
        self.notes = []  # what the scripts print for the user: how the data was split, what was left out
        rows = self.read(data, "--data") if data is not None else None
        if eval_data is not None:
            self._test = self.read(eval_data, "--eval-data", least=1)
        elif rows is not None and train_problems is not None:
            if len(rows) <= train_problems:
                raise UserError(f"--train-problems {train_problems}: {data} has {len(rows)} problems, which leaves "
                                "none to evaluate on; pass --eval-data FILE or lower --train-problems")
            rows, self._test = rows[:train_problems], rows[train_problems:]
        elif rows is not None:
            order = array("q", range(len(rows)))  # shuffling positions draws as shuffling the rows would
            random.Random(f"{self.name}-split-{seed}").shuffle(order)
            n_test, order = min(test_size, len(rows) // 2), np.frombuffer(order, dtype=np.int64)
            self._test, rows = rows.pick(order[:n_test]), rows.pick(order[n_test:])
            self.notes.append(f"no --eval-data: holding out {n_test} of the {n_test + len(rows)} problems of {data} "
                              "(shuffled with --seed) to evaluate on")
        else:
            self._test = self._draw(random.Random(f"{self.name}-test-{seed}"), test_size, lambda question: False)
        self._held_out = (self._test.has_question if isinstance(self._test, Rows) else
                          {p.question for p in self._test}.__contains__)
        if rows is not None and eval_data is not None:  # the rows of one file are distinct already
            shared = rows.shared_with(self._test)
            if len(shared) == len(rows):
                raise UserError(f"--data {data}: every problem is also in --eval-data {eval_data}; nothing to train on")
            if shared:
                self.notes.append(f"{len(shared)} problem(s) of --data are also in --eval-data: left out of "
                                  "training")
                rows = rows.pick(np.setdiff1d(np.arange(len(rows)), shared))
        if train_problems is not None and rows is None:
            rows = self._draw(random.Random(f"{self.name}-train-fixed-{seed}"), train_problems, self._held_out,
                              len(self._test))
        if train_problems is not None and len(rows) < train_problems:
            source = f"--data {data}" if data is not None else f"{self.difficulty_flags()} (generated)"
            raise UserError(f"--train-problems {train_problems}: {source} makes only {len(rows)} distinct problems "
                            f"besides the {len(self._test)} held out; pass --train-problems {len(rows)} or fewer"
                            + ("" if data is not None else ", or widen --low/--high or raise --numbers"))
        self._train = rows[:train_problems] if rows is not None and train_problems is not None else rows
        if data is not None:
            self.check_training_rows(data)

    def read(self, path, flag, least=2):
        """The problems of a data file (minies/tasks/data.py), with a note where rows repeat a question."""
        rows, repeats = read_problems(path, self.parse_row, flag, least)
        if repeats:
            self.notes.append(f"{repeats} row(s) of {path} repeat an earlier row's question: merged into it, which "
                              f"leaves {len(rows)} problem(s)")
        return rows

    def check_training_rows(self, data):
        """A task that can tell a problem with no solution (Countdown) reports those of its training rows here."""

    def _draw(self, rng, count, held_out, reserved=0):
        """`count` distinct generated problems, none of whose questions is `held_out` (a test); fewer when the
        generator runs out of new ones. A task with fewer problems than asked stops when it knows (problem_count)
        or after 10 tries per problem drawn found nothing new: with one new problem left among P, P tries find it
        on average, so stopping at 10 P misses it about once in e^10 ≈ 22,000 times, after seconds, not minutes."""
        known = self.problem_count()
        if known is not None:
            count = min(count, max(0, known - reserved))
        drawn, seen, fruitless = [], set(), 0
        while len(drawn) < count and fruitless <= max(1000, 10 * len(drawn)):
            p = self.problem(rng)
            fruitless += 1
            if p.question not in seen and not held_out(p.question):
                seen.add(p.question)
                drawn.append(p)
                fruitless = 0
        return drawn

    def shortest_answer(self, problem):
        """The shortest completion the verifier can accept for `problem` (tasks/fit.py checks that it fits
        --max-new-tokens)."""
        return self.solution(problem)

    def test_problems(self, count=None):
        """The first `count` problems of the test split (None: all of them)."""
        return list(self._test[:count])

    def train_problems(self, count, seed):
        """`count` training problems drawn from `seed`, none of them in the test split. From a list of training
        problems (a data file, or a fixed set): shuffled passes over it, so repeats come only after every
        problem was drawn once; a fixed set of `count` problems is therefore the whole set every step."""
        if self._train is None and self.needs_data:
            raise UserError(self.data_help)
        rng = random.Random(f"{self.name}-train-{seed}")
        if self._train is not None:
            return [self._train[i] for i in shuffled_passes(rng, len(self._train), count)]
        out = []
        while len(out) < count:
            p = self.problem(rng)
            if not self._held_out(p.question):
                out.append(p)
        return out

    def prompts(self, tokenizer, problems, chat_template=True):
        """The model's prompt strings for `problems`, in this task's prompt style (PromptStyle)."""
        from minies.rollout import format_prompts  # the engine's formatting; tasks stay importable alone

        style = self.style
        chat = style.chat and chat_template and bool(tokenizer.chat_template)
        questions = [(style.user if chat else style.plain).format(p.question) for p in problems]
        prefills = [style.prefill.replace("{}", p.question) for p in problems]
        return format_prompts(tokenizer, questions, chat, style.system if chat else None, prefills)

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


def shuffled_passes(rng, n, count):
    """The first `count` positions of rng.sample(range(n), n), then of another such pass, and so on: CPython's
    sample of all n draws each position in turn from a pool of those not yet drawn, one randrange each, and so
    does this, but stops after `count`. The problems of a step are those of sampling the whole list each pass,
    at the cost of `count` draws, not n (a data file of half a million rows)."""
    positions = []
    while len(positions) < count:
        pool = array("q", range(n))
        for i in range(min(n, count - len(positions))):
            j = rng.randrange(n - i)
            positions.append(pool[j])
            pool[j] = pool[n - i - 1]
    return positions
