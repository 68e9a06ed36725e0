"""bench.hostile: its classes on canned outputs, its case table, and two real cases (a refusal, in its own process
and in the shared parsing process; a note) run end to end."""
import types

import pytest

from bench import hostile, hostile_cases

TRACE = 'Traceback (most recent call last):\n  File "train.py", line 1\nValueError: bad\n'


@pytest.mark.parametrize("rc, stdout, stderr, expect, pattern, timed_out, cls, line", [
    # refuse
    (2, "", "progress 10%\rprogress 100%\nerror: --alpha nan is bad\n", "refuse", "--alpha", False, "error",
     "error: --alpha nan is bad"),
    (2, "", "error: --alpha nan is bad\n", "refuse", None, False, "error", "error: --alpha nan is bad"),
    (2, "", "error: something else\n", "refuse", "--alpha", False, "wrong", "error: something else"),
    (2, "", "error: one\nerror: two\n", "refuse", None, False, "wrong", "error: two"),
    (1, "", "it broke\n", "refuse", None, False, "wrong", "it broke"),
    (2, "", "error: fine\nbut a line after it\n", "refuse", None, False, "wrong", "but a line after it"),
    (0, "after: pass@1 0.2\n", "", "refuse", None, False, "silent", "after: pass@1 0.2"),
    (0, "", "note: merged 3 rows\n", "refuse", None, False, "silent", "note: merged 3 rows"),
    (1, "", TRACE, "refuse", None, False, "traceback", "ValueError: bad"),
    (None, "", "half a line", "refuse", None, True, "hang", "half a line"),
    (None, "", "generating: 12%\n\x1b[A", "refuse", None, True, "hang", "generating: 12%"),
    (1, "", TRACE.replace("ValueError: bad", 'RuntimeError: boom\nframe #0: f in libc10.so\n"'), "refuse", None, False,
     "traceback", "RuntimeError: boom"),
    # run
    (0, "run directory: out/x\n", "", "run", None, False, "reasonable", "run directory: out/x"),
    (0, "done\n", "warning: log line 3 dropped\n", "run", None, False, "reasonable", "warning: log line 3 dropped"),
    (2, "", "error: --data x: cannot read it\n", "run", None, False, "wrong", "error: --data x: cannot read it"),
    (0, "", TRACE, "run", None, False, "traceback", "ValueError: bad"),
    (None, "", "", "run", None, True, "hang", ""),
    # note
    (0, "", "note: 7 row(s) repeat: merged\n", "note", "merged", False, "reasonable", "note: 7 row(s) repeat: merged"),
    (2, "", "error: 1 problem(s) (7 merged)\n", "note", "merged", False, "reasonable",
     "error: 1 problem(s) (7 merged)"),
    (0, "recipe tiny: --population 6\n", "", "note", r"--population 6\b", False, "reasonable",
     "recipe tiny: --population 6"),
    (0, "done\n", "", "note", "merged", False, "silent", "done"),
    (None, "", "note: a prompt of 9 tokens runs past\ngenerating: 1%\n", "note", "runs past", True, "reasonable",
     "note: a prompt of 9 tokens runs past (still running at the timeout)"),
    (None, "", "generating: 1%\n", "note", "runs past", True, "hang", "generating: 1%"),
    (2, "", "error: other reason\n", "note", "merged", False, "wrong", "error: other reason"),
    (1, "", "merged, then it crashed\n", "note", "merged", False, "wrong", "merged, then it crashed"),
    (1, "", "note: merged\n" + TRACE, "note", "merged", False, "traceback", "ValueError: bad"),
])
def test_classify(rc, stdout, stderr, expect, pattern, timed_out, cls, line):
    assert hostile.classify(rc, stdout, stderr, expect, pattern, timed_out) == (cls, line)


def test_the_case_table():
    cases = hostile_cases.cases()
    names = [c.name for c in cases]
    assert len(names) == len(set(names)) and len(cases) > 120
    assert all(c.expect in ("refuse", "run", "note") and c.script in ("train.py", "eval.py") for c in cases)
    assert all(c.pattern for c in cases if c.expect == "note")
    assert hostile_cases.without(["--a", "1", "--b", "2"], "--a") == ["--b", "2"]


def _case(name):
    return next(c for c in hostile_cases.cases() if c.name == name)


def test_two_real_cases(tmp_path):
    fx = types.SimpleNamespace(root=str(tmp_path))
    refusal, noted = _case("train es: --alpha nan"), _case("eval: OMP_NUM_THREADS='abc'")
    for i, case in enumerate((refusal, noted)):
        case_dir = tmp_path / str(i)
        case_dir.mkdir()
        rc, out, err, _, timed_out = hostile.run_case(case, fx, str(case_dir), timeout=120)
        cls, line = hostile.classify(rc, out, err, case.expect, case.pattern, timed_out)
        assert cls == ("error" if case is refusal else "reasonable"), (cls, err[-2000:])
        assert line.startswith("error: argument --alpha: nan" if case is refusal else "error: OMP_NUM_THREADS='abc'")
    # The shared parsing process decides the refusal the same way, and leaves an accepted command line undecided.
    accepted = hostile.command_args(_case("train es: --alpha 10**30"), str(tmp_path), str(tmp_path / "2"))
    decided = hostile.screen([(0, ["train.py", hostile.command_args(refusal, str(tmp_path), str(tmp_path / "0"))]),
                              (1, ["train.py", accepted])], str(tmp_path), types.SimpleNamespace(timeout=120))
    assert list(decided) == [0] and decided[0][0] == 2
    assert decided[0][1].strip().splitlines()[-1].startswith("error: argument --alpha: nan")
