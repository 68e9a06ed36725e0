"""Task difficulty as flags: --numbers, --low, --high for the generated tasks (arithmetic, Countdown). They
generate what they say, leave the default problems exactly as they were, refuse bad values in one line, are
recorded in config.json and checked on --resume, and eval.py takes them too."""
import hashlib
import json
import re

import pytest

import eval as eval_script
import train
from conftest import assert_one_line_error, run_in_process
from minies import UserError
from minies.tasks import Arithmetic, Countdown, get_task, solvable

pytestmark = pytest.mark.usefixtures("one_thread")

GSM8K_FILE = "tests/data/gsm8k_test.jsonl"
COUNTDOWN_STYLES = ("terse", "instruct", "qiu", "tinyzero")


def fingerprint(problems):
    return hashlib.sha256("\n".join(f"{p.question}={p.answer}" for p in problems).encode()).hexdigest()[:16]


# The problems each task generated before the flags existed (test split, then 200 training problems of seed 3),
# fingerprinted with the code of that time: with no flag, every one must stay the same.
BEFORE = {
    ("arithmetic", "terse"): ("d6bcbab9d7cd8fbf", "f88406fef1c30ecb"),
    ("arithmetic", "instruct"): ("3cd70b60724f283a", "28e9d269ad369e86"),
    ("countdown", "terse"): ("d608dcc5b288a3a6", "f80d326970fb435a"),
    ("countdown", "instruct"): ("dd5df5e69d4acdff", "4418e74884ee6ff6"),
    ("countdown", "qiu"): ("d4bafd7134bf3b28", "2e316c1372cd7049"),
    ("countdown", "tinyzero"): ("01428e866f8db51b", "71715a1e38c6b219"),
}


@pytest.mark.parametrize("name, style", sorted(BEFORE))
def test_no_flag_generates_the_same_problems_as_before(name, style):
    task = get_task(name, prompt_style=style, numbers=None, low=None, high=None)
    assert (fingerprint(task.test_problems()), fingerprint(task.train_problems(200, seed=3))) == BEFORE[name, style]


def test_the_old_defaults_spelled_out_are_the_defaults():
    default, explicit = Arithmetic(seed=0, test_size=20), Arithmetic(seed=0, test_size=20, numbers=2, low=0, high=99)
    assert [p.question for p in default.test_problems()[:5]] == ["50+91", "53+43", "32+11", "39+45", "38+8"]
    assert default.test_problems() == explicit.test_problems()
    assert default.train_problems(50, seed=1) == explicit.train_problems(50, seed=1)
    for style in COUNTDOWN_STYLES:
        low, high = (1, 20) if style == "terse" else (1, 99)
        default, explicit = Countdown(test_size=50, prompt_style=style), Countdown(test_size=50, prompt_style=style,
                                                                                   low=low, high=high)
        assert default.test_problems() == explicit.test_problems(), style
        assert explicit.max_target == (None if style == "terse" else 100)  # the papers' range keeps the cap


@pytest.mark.parametrize("style", ["terse", "instruct"])
def test_arithmetic_sums_as_many_numbers_in_the_range_as_asked(style):
    task = get_task("arithmetic", prompt_style=style, numbers=3, low=100, high=999)
    for p in task.test_problems() + task.train_problems(100, seed=0):
        question = p.question if style == "terse" else re.fullmatch(r"What is (.*)\? Give only.*", p.question)[1]
        terms = [int(x) for x in re.split(r" ?\+ ?", question)]
        assert len(terms) == 3 and all(100 <= x <= 999 for x in terms), p.question
        assert int(p.answer) == sum(terms)


@pytest.mark.parametrize("style", COUNTDOWN_STYLES)
def test_countdown_gives_as_many_numbers_in_the_range_as_asked_and_every_problem_is_solvable(style):
    task = get_task("countdown", prompt_style=style, numbers=4, low=1, high=9)
    assert task.max_target is None  # another range than the papers' lifts the target cap
    for p in task.test_problems() + task.train_problems(100, seed=0):
        assert len(p.numbers) == 4 and all(1 <= n <= 9 for n in p.numbers), p.question
        assert all(str(n) in p.question for n in p.numbers) and p.answer in p.question
        assert solvable(p.numbers, p.answer) and task.score(task.solution(p), p).correct, p


@pytest.mark.parametrize("call, mention", [
    (lambda: Arithmetic(low=9, high=3), "--low 9 --high 3"),
    (lambda: Countdown(low=9, high=3), "--low 9 --high 3"),
    (lambda: Countdown(low=0), "--low 0"),
    (lambda: Countdown(numbers=7), "--numbers 7"),
    (lambda: Countdown(numbers=1), "--numbers 1"),
    (lambda: Arithmetic(numbers=0), "--numbers 0"),
    (lambda: Arithmetic(numbers=51), "--numbers 51"),
    (lambda: Arithmetic(numbers=50, high=10**11), "12 digits"),
    (lambda: Arithmetic(numbers=1), "only 100 ways"),  # 100 problems cannot leave 500 held out and some to train
    (lambda: get_task("gsm8k", data=GSM8K_FILE, numbers=3), "--numbers 3: the difficulty flags apply to generated"),
    (lambda: get_task("countdown", data=GSM8K_FILE, high=9), "--high 9: the difficulty flags apply to generated"),
    (lambda: get_task("countdown", eval_data=GSM8K_FILE, low=2), "--low 2: the difficulty flags apply to generated"),
])
def test_bad_values_are_one_line_user_errors(call, mention):
    with pytest.raises(UserError) as e:
        call()
    assert mention in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("script, flags, mention", [
    ("train.py", ["--low", 9, "--high", 3], "--low 9 --high 3"),
    ("train.py", ["--task", "countdown", "--low", 0], "--low 0"),
    ("train.py", ["--task", "countdown", "--numbers", 7], "--numbers 7"),
    ("train.py", ["--numbers", 0], "--numbers: 0 is not an integer in [1, 50]"),
    ("train.py", ["--high", 10**12], "--high: 1000000000000 is not an integer in [0, 999999999999]"),
    ("eval.py", ["--task", "gsm8k", "--data", GSM8K_FILE, "--numbers", 3], "generated problems only"),
    ("eval.py", ["--task", "countdown", "--data", GSM8K_FILE, "--numbers", 3], "generated problems only"),
])
def test_bad_flags_end_in_one_error_line(script, flags, mention, tmp_path, model_dir, capsys):
    out = ["--out", tmp_path / "out"] if script == "train.py" else ["--n", 1, "--k", 1]
    code, message = run_in_process(script, "--model", model_dir, *out, *flags)
    last = assert_one_line_error(f"{script} {flags}", code, capsys.readouterr().err + message)
    assert mention in last, last
    assert not (tmp_path / "out").exists()


def test_the_scripts_parse_the_flags():
    cfg = train.parse_args(["--numbers", "3", "--low", "100", "--high", "999"])[0]
    assert (cfg.numbers, cfg.low, cfg.high) == ([3], 100, 999)
    assert train.parse_args(["--numbers", "2", "3"])[0].numbers == [2, 3]
    cfg = train.parse_args([])[0]
    assert (cfg.numbers, cfg.low, cfg.high) == (None, None, None)  # each task's own
    cfg = eval_script.parse_args(["--task", "countdown", "--numbers", "4", "--low", "1", "--high", "9"])
    assert (cfg.task, cfg.numbers, cfg.low, cfg.high) == ("countdown", [4], 1, 9)


def test_config_json_records_them_and_resume_refuses_a_change(tmp_path, model_dir, capsys):
    tiny = ["--model", model_dir, "--out", tmp_path, "--population", 4, "--prompts-per-step", 4, "--eval-problems", 4,
            "--final-samples", 2, "--eval-every", 0, "--save-every", 1, "--numbers", 3, "--low", 10, "--high", 99]
    code, _ = run_in_process("train.py", *tiny, "--steps", 1)
    assert code == 0, capsys.readouterr().err[-3000:]
    run = tmp_path / "es-arithmetic-seed0"
    recorded = json.loads((run / "config.json").read_text())["train"]
    assert (recorded["numbers"], recorded["low"], recorded["high"]) == ([3], 10, 99)
    latest = (run / "latest").read_text()
    code, message = run_in_process("train.py", *tiny, "--steps", 2, "--resume", "--numbers", 4)
    last = assert_one_line_error("resume with another --numbers", code, capsys.readouterr().err + message)
    assert "--numbers 4 (the run has 3)" in last, last
    assert (run / "latest").read_text() == latest


def test_several_counts_mix_difficulties_and_one_count_draws_as_before():
    mixed = Arithmetic(numbers=[2, 3], high=20, prompt_style="equation")
    counts = [len(p.question.split(" + ")) for p in mixed.test_problems()]
    assert set(counts) == {2, 3} and 0.3 < counts.count(2) / len(counts) < 0.7
    assert all(int(p.answer) == sum(map(int, p.question.split(" + "))) for p in mixed.test_problems())
    # One count as a list spends no random draw on choosing it: the same problems as the int.
    assert fingerprint(Arithmetic(numbers=[3]).test_problems()) == fingerprint(Arithmetic(numbers=3).test_problems())
    with pytest.raises(UserError, match="--numbers 2 51"):
        Arithmetic(numbers=[2, 51])
    with pytest.raises(UserError, match="--numbers 4 7"):
        Countdown(numbers=[4, 7])


def test_a_run_an_earlier_minies_recorded_resumes(tmp_path, model_dir, capsys):
    """Its config.json has --numbers as one int, and no setting that came later (--match, --score-timeout, the
    input files' hashes): the run ran with those settings' defaults, and resumes; a setting changed from its
    default is still refused."""
    tiny = ["--model", model_dir, "--out", tmp_path, "--population", 4, "--prompts-per-step", 4, "--eval-problems", 4,
            "--final-samples", 2, "--eval-every", 0, "--save-every", 1, "--numbers", 3]
    assert run_in_process("train.py", *tiny, "--steps", 1)[0] == 0, capsys.readouterr().err[-3000:]
    config = tmp_path / "es-arithmetic-seed0" / "config.json"
    recorded = json.loads(config.read_text())
    recorded["train"]["numbers"] = 3  # as a run made when --numbers took one value recorded it
    for key in ("match", "score_timeout"):
        del recorded["train"][key]
    del recorded["inputs"]
    config.write_text(json.dumps(recorded))
    code, message = run_in_process("train.py", *tiny, "--steps", 2, "--resume", "--score-timeout", 5)
    last = assert_one_line_error("resume with a later setting changed", code, capsys.readouterr().err + message)
    assert "--score-timeout 5.0 (the run has 10.0)" in last, last
    assert run_in_process("train.py", *tiny, "--steps", 2, "--resume")[0] == 0, capsys.readouterr().err[-3000:]
