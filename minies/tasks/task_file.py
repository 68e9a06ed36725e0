"""A task from the user's own Python file: `--task path/to/task.py` (docs/tasks.md gives the contract).

The file defines one subclass of minies.tasks.Task, as the built-in tasks do: `problem(rng)` for generated
problems, or `reads_data = True` and `parse_row(row)` for problems read from --data, and `score(completion,
problem)`. minies runs the user's code inside guards, so that whatever it does wrong ends a run with one `error:`
line naming the file (and the file's own line, where there is one) before a bad value reaches training:

    problems   must be Problems whose question is non-empty text and whose answer is text;
    score      must return a Score whose reward is a finite number and whose correct and malformed are
               booleans, within --score-timeout seconds a call (a score that hangs would stall a run forever).

The time limit is a SIGALRM timer of the main thread, the one every score is called from. math-verify sets and
clears that same timer around each of its own calls (minies/tasks/math_answers.py), so a score() that calls it is
bounded there by math-verify's limits, and by none for the rest of that call.

The file is one of the files a run reads (minies/runtime/resume.py, INPUT_FILES): config.json records its sha256,
and --resume refuses to continue a run with a changed file, since its rewards would no longer be the run's.
"""
import hashlib
import importlib.util
import math
import numbers
import os
import random
import signal
import sys
import threading
import traceback
from contextlib import contextmanager

import numpy as np

from minies import UserError
from minies.tasks.base import Problem, Score, Task

CONTRACT = ("a task file defines exactly one subclass of minies.tasks.Task, with score(completion, problem) "
            "(docs/tasks.md)")


def is_task_file(name):
    """Whether --task names a Python file rather than a built-in task."""
    return name.endswith(".py")


def task_label(name):
    """A task's name in run names: the built-in name, or the file's name without '.py'."""
    return os.path.splitext(os.path.basename(name))[0] if is_task_file(name) else name


def load_task_class(path):
    """The one Task subclass the file at `path` defines, guarded (module docstring); one-line errors for a
    missing or unreadable file, a file that does not run, and a file that defines no task or several."""
    where = f"--task {path}"
    if not os.path.isfile(path):
        raise UserError(f"{where}: no such file; {CONTRACT}")
    try:
        with open(path, "rb") as f:
            source = f.read()
        code = compile(source, path, "exec")  # a syntax error names the file's own line
    except OSError as e:
        raise UserError(f"{where}: cannot read it ({e.strerror})") from None
    except (SyntaxError, ValueError) as e:  # ValueError: null bytes in the source
        line = f" line {e.lineno}" if getattr(e, "lineno", None) else ""
        raise UserError(f"{where}{line}: {type(e).__name__}: {getattr(e, 'msg', e)}; fix the file") from None
    module_name = f"minies_task_file_{hashlib.sha256(os.path.abspath(path).encode()).hexdigest()[:12]}"
    spec = importlib.util.spec_from_loader(module_name, loader=None, origin=path)
    module = importlib.util.module_from_spec(spec)
    module.__file__ = path
    sys.modules[module_name] = module  # dataclasses and pickling look their classes' modules up there
    with user_code(where, path, "running the file"):
        exec(code, module.__dict__)
    found = [obj for obj in vars(module).values()
             if isinstance(obj, type) and issubclass(obj, Task) and obj.__module__ == module_name]
    if len(found) != 1:
        names = f" ({', '.join(c.__name__ for c in found)})" if found else ""
        raise UserError(f"{where}: defines {len(found)} Task subclasses{names}; {CONTRACT}")
    cls = found[0]
    if cls.score is Task.score:
        raise UserError(f"{where}: {cls.__name__} defines no score(completion, problem); {CONTRACT}")
    if cls.problem is Task.problem and cls.parse_row is Task.parse_row:
        raise UserError(f"{where}: {cls.__name__} defines neither problem(rng) (generated problems) nor "
                        "parse_row(row) (problems read from --data); docs/tasks.md")
    return guarded(cls, path)


@contextmanager
def user_code(where, path, doing):
    """Any exception of the user's code (UserError aside) as one line with the file's own line number."""
    try:
        yield
    except UserError:
        raise
    except (Exception, SystemExit) as e:  # a task file's sys.exit() would end the run without saying why
        lines = [frame.lineno for frame in traceback.extract_tb(e.__traceback__)
                 if os.path.abspath(frame.filename) == os.path.abspath(path)]
        line = f" line {lines[-1]}" if lines else ""
        raise UserError(f"{where}{line}: {doing} raised {type(e).__name__}: {one_line(e)}; fix the file") from None


def one_line(error):
    """An exception's message on one line, cut short: the error line must stay one line."""
    return " ".join(str(error).split())[:200]


class ScoreTimeout(BaseException):
    """Not an Exception, so that a score() catching every Exception does not swallow its own time limit."""


@contextmanager
def time_limit(seconds):
    """Raise ScoreTimeout in the main thread after `seconds` (SIGALRM). Elsewhere, or where the platform has no
    SIGALRM, it does nothing: a signal reaches only the main thread."""
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise ScoreTimeout

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def checked_problem(problem, where, method):
    """`problem`, or a UserError saying why a task file's `method` returned no usable Problem."""
    if not isinstance(problem, Problem):
        raise UserError(f"{where}: {method} returned {type(problem).__name__}, not a Problem(question, answer)")
    if not isinstance(problem.question, str) or not problem.question.strip():
        raise UserError(f"{where}: {method} returned a Problem whose question is "
                        f"{'empty' if isinstance(problem.question, str) else type(problem.question).__name__}; "
                        "a prompt must be non-empty text")
    if not isinstance(problem.answer, str):
        raise UserError(f"{where}: {method} returned a Problem whose answer is {type(problem.answer).__name__}, "
                        "not text")
    return problem


def checked_score(score, where):
    """`score`, or a UserError saying what is wrong with it."""
    if not isinstance(score, Score):
        raise UserError(f"{where}: score() returned {score!r:.80} ({type(score).__name__}), not a Score; return "
                        "make_score(correct, malformed) or Score(reward, correct, malformed)")
    reward = score.reward
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(reward):
        raise UserError(f"{where}: score() returned a reward of {reward!r:.80}; a reward must be a finite number")
    for name in ("correct", "malformed"):
        if not isinstance(getattr(score, name), (bool, np.bool_)):
            raise UserError(f"{where}: score() returned {name}={getattr(score, name)!r:.80}; it must be True or False")
    return score


def guarded(cls, path):
    """A subclass of the user's task class whose problems and scores are checked (module docstring). It keeps the
    user's name, or takes the file's."""
    where = f"--task {path}"

    class Guarded(cls):
        name = cls.__dict__.get("name", task_label(path))
        # What the task defines says where its problems come from: parse_row reads a data file, and a task
        # without problem() has no other source.
        reads_data = cls.reads_data or cls.parse_row is not Task.parse_row
        needs_data = cls.needs_data or cls.problem is Task.problem
        data_help = getattr(cls, "data_help", f"{where} reads its problems from files: --data FILE to train on "
                            "and --eval-data FILE to evaluate on, JSON Lines its parse_row(row) reads")

        def __init__(self, *args, score_timeout=10.0, **kwargs):
            self.score_timeout = score_timeout
            with user_code(where, path, f"{cls.__name__}()"):
                super().__init__(*args, **kwargs)
            if self._train is None and cls.problem is not Task.problem:
                self.check_fresh_problems()

        def check_fresh_problems(self, tries=1000):
            """Training draws generated problems until one is not in the test split: refuse a task whose problems
            are all there, which would loop forever."""
            rng = random.Random(f"{self.name}-check")
            if not any(not self._held_out(self.problem(rng).question) for _ in range(tries)):
                raise UserError(f"{where}: all {tries} problems problem() made are in the test split of "
                                f"{len(self._test)}; make more distinct problems (docs/tasks.md)")

        def problem(self, rng):
            with user_code(where, path, "problem()"):
                made = super().problem(rng)
            return checked_problem(made, where, "problem()")

        def parse_row(self, row):  # a ValueError is the row's fault: data.py names the data file's line
            try:
                made = super().parse_row(row)
            except ValueError:
                raise
            except NotImplementedError:
                raise UserError(f"{where}: reads no data file (it defines no parse_row(row)); drop --data and "
                                "--eval-data") from None
            except Exception as e:
                raise ValueError(f"{where}: parse_row() raised {type(e).__name__}: {one_line(e)}") from None
            if isinstance(made, Problem) and isinstance(made.question, str) and not made.question.strip():
                raise ValueError("the prompt is empty: there is nothing to ask")
            return checked_problem(made, where, "parse_row()")

        def score(self, completion, problem):
            try:
                with user_code(where, path, "score()"), time_limit(self.score_timeout):
                    result = super().score(completion, problem)
            except ScoreTimeout:
                raise UserError(f"{where}: score() took more than --score-timeout {self.score_timeout:g} seconds on "
                                f"one completion; make it faster or raise --score-timeout") from None
            return checked_score(result, where)

    Guarded.__name__ = Guarded.__qualname__ = cls.__name__
    return Guarded
