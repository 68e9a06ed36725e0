"""Data files read lazily (minies/tasks/data.py): the same problems, splits, draws and errors as parsing every
row up front, repeated questions merged (and counted), and bench/data.py end to end on a small file."""
import json
import os
import random
import re
import subprocess
import sys

import numpy as np
import pytest

from minies import UserError
from minies.tasks import Countdown, get_task
from minies.tasks.data import Rows, first_of_each_question, read_problems, unique_keys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def countdown_rows(count):
    return [{"nums": [i % 50 + 1, i // 50 + 1, 7], "target": i % 50 + i // 50 + 9} for i in range(count)]  # a sum


def eager(rows, style="terse"):
    """What reading did before it was lazy: every row parsed, repeats dropped, in the file's order."""
    parse, problems, seen = Countdown(prompt_style=style).parse_row, [], set()
    for row in rows:
        problem = parse(row)
        if problem.question not in seen:
            seen.add(problem.question)
            problems.append(problem)
    return problems


@pytest.mark.parametrize("as_list", [False, True])
def test_rows_are_the_problems_of_every_row_in_order(tmp_path, as_list):
    rows = countdown_rows(300) + countdown_rows(20)  # 20 repeats
    path = tmp_path / "data.json"
    path.write_text(json.dumps(rows, indent=1) if as_list else "".join(json.dumps(r) + "\n" for r in rows))
    problems, repeats = read_problems(path, Countdown(prompt_style="tinyzero").parse_row)
    assert isinstance(problems, Rows) and repeats == 20
    assert list(problems) == eager(rows, "tinyzero") and problems[-1] == eager(rows, "tinyzero")[-1]
    assert [p.reference for p in problems[5:8]] == [p.reference for p in eager(rows, "tinyzero")[5:8]]


def test_splits_and_draws_are_those_of_a_list_of_problems(tmp_path):
    rows = countdown_rows(700)
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = get_task("countdown", seed=3, data=str(path))
    problems = eager(rows)
    random.Random("countdown-split-3").shuffle(problems)  # how the fallback split a list
    assert task.test_problems() == problems[:350] and task.test_problems(4) == problems[:4]
    train = problems[350:]
    for count in (1, 256, 351, 800):  # within one pass, exactly one, and across passes
        rng, drawn = random.Random("countdown-train-9"), []
        while len(drawn) < count:
            drawn += rng.sample(train, len(train))
        assert task.train_problems(count, seed=9) == drawn[:count]


def test_line_ends_and_blank_lines_count_as_lines(tmp_path):
    good = [json.dumps(r) for r in countdown_rows(3)]
    path = tmp_path / "data.jsonl"
    path.write_bytes(f"{good[0]}\r\n\r\n  \r\n{good[1]}\r{good[2]}".encode())
    assert len(read_problems(path, Countdown().parse_row)[0]) == 3
    path.write_bytes(f"{good[0]}\r\n\r\n{good[1]}\r{{\"nums\": [1, 2]}}\n".encode())
    with pytest.raises(UserError, match=r"data.jsonl line 4: .*target"):
        read_problems(path, Countdown().parse_row)
    path.write_bytes(f"{good[0]}\n{good[1]}\n".encode() + b"\xff\xfe\n")
    with pytest.raises(UserError, match="cannot read it .not UTF-8 text."):
        read_problems(path, Countdown().parse_row)


@pytest.mark.parametrize("text", ["[1, 2", '[{"nums": [1, 2], "target": 3}, ]', "[] x", "[[[", '[{"a": 1, "a": 2}]',
                                  "[" * 100000 + "]" * 100000])
def test_a_list_that_is_not_json_gives_json_reason(tmp_path, text):
    path = tmp_path / "data.json"
    path.write_text(text)
    try:  # what reading the whole file at once said
        json.loads(text, object_pairs_hook=unique_keys)
    except RecursionError:
        reason = "nested too deeply"
    except ValueError as e:
        reason = str(e)
    with pytest.raises(UserError) as e:
        read_problems(path, Countdown().parse_row)
    assert str(e.value) == f"{path}: not valid JSON ({reason}); fix the file or write one JSON object per line"


def test_a_bad_list_row_is_named_by_its_place(tmp_path):
    path = tmp_path / "data.json"
    path.write_text(json.dumps(countdown_rows(2) + [{"nums": [1]}]))
    with pytest.raises(UserError, match=r"data.json row 3: .*numbers.*; fix or delete that row$"):
        read_problems(path, Countdown().parse_row)


def test_repeated_questions_are_merged_and_counted(tmp_path):
    rows = countdown_rows(4) + countdown_rows(3)
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = Countdown(data=path)
    assert task.notes[0] == (f"3 row(s) of {path} repeat an earlier row's question: merged into it, which leaves 4 "
                             "problem(s)")
    path.write_text("".join(json.dumps(r) + "\n" for r in countdown_rows(1) * 5))
    with pytest.raises(UserError) as e:
        Countdown(data=path)
    assert str(e.value) == (f"--data {path}: 1 problem(s) (4 more row(s) repeat a question: merged); need at least 2 "
                            "(one to test, one to train on)")


def test_equal_hashes_of_different_questions_are_not_merged(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in countdown_rows(5)))
    read, _ = read_problems(path, Countdown().parse_row)
    spans = read.spans[[0, 1, 2, 1, 3, 4]]  # the fourth repeats the second
    collided = Rows(read.text, spans, np.zeros(len(spans), dtype=np.int64), read.parse_row)  # every hash equal
    assert list(first_of_each_question(collided)) == [0, 1, 2, 4, 5]


def test_bench_data_prints_the_first_step_and_the_peak(tmp_path):
    out = subprocess.run([sys.executable, "-m", "bench.data", "--rows", "300", "--scratch", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert re.search(r"^countdown: 300 rows, [0-9.]+ MiB$", out.stdout, re.M)
    assert re.search(r"^first step after [0-9.]+ s \(100 rows: [0-9.]+ s\)$", out.stdout, re.M)
    peak = re.search(r"^peak resident memory ([0-9]+) MiB \(100 rows: ([0-9]+) MiB\): -?[0-9]+ MiB more, -?[0-9.]+x "
                     r"the file's size$", out.stdout, re.M)
    assert peak and int(peak.group(1)) > 0 and int(peak.group(2)) > 0
