"""Problems no completion can answer are refused or counted before a run (minies/tasks/fit.py), as are
--train-problems past the problems that exist and a --system message that no chat template renders."""
import argparse
import re

import pytest

from conftest import REPO
from minies import UserError
from minies.config import checked
from minies.models import SHIPPED_MODELS, load_tokenizer
from minies.tasks import TASKS, Arithmetic, Countdown, get_task
from minies.tasks.fit import check_answer_room, check_system

GSM8K = str(REPO / "tests" / "data" / "gsm8k_test.jsonl")
ANSWERS = str(REPO / "tests" / "data" / "answers.jsonl")
QIU_MODEL = str(REPO / "minies" / "assets" / "tiny-qiu")


@pytest.fixture(scope="module")
def chat_tokenizer():
    return load_tokenizer(SHIPPED_MODELS["countdown"])  # the shipped character tokenizer, with a chat template


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_task_and_prompt_style_fits_its_default_answers(name, chat_tokenizer):
    for style in TASKS[name].prompt_styles:
        task = get_task(name, prompt_style=style, data={"gsm8k": GSM8K, "answers": ANSWERS}.get(name))
        assert check_answer_room(task, chat_tokenizer) == [], (name, style)


@pytest.mark.parametrize("name, flags, need", [
    ("arithmetic", {"numbers": 1, "low": 10**11, "high": 10**12 - 1}, 14),  # '<answer>999999999999</answer>'
    ("countdown", {"numbers": 6, "high": 10**12 - 1}, 79),  # 6 numbers of 12 digits, 5 operators, 2 tags
])
def test_generated_answers_that_cannot_fit_are_refused_with_the_length_needed(name, flags, need, chat_tokenizer):
    for style in TASKS[name].prompt_styles:
        task = get_task(name, prompt_style=style, max_new_tokens=10 if style == "terse" else None, **flags)
        if task.max_new_tokens >= need + 5:  # the reasoning styles' defaults leave room
            assert check_answer_room(task, chat_tokenizer) == []
            continue
        with pytest.raises(UserError, match=rf"--high {flags['high']}: an answer can take \d+ tokens .*past "
                                            rf"--max-new-tokens {task.max_new_tokens}"):
            check_answer_room(task, chat_tokenizer)
    with pytest.raises(UserError, match=f"take {need} tokens"):
        check_answer_room(get_task(name, prompt_style="terse", max_new_tokens=need - 1, **flags), chat_tokenizer)
    assert check_answer_room(get_task(name, prompt_style="terse", max_new_tokens=need, **flags), chat_tokenizer) == []


def test_data_rows_that_cannot_fit_are_counted_in_a_note(chat_tokenizer):
    task = get_task("gsm8k", data=GSM8K, prompt_style="instruct", max_new_tokens=3)  # '<answer>', digits, '</answer>'
    [note] = check_answer_room(task, chat_tokenizer)
    assert re.match(r"\d+ of the 1319 problems checked in the data files need an answer longer than --max-new-tokens 3 "
                    r"\(up to \d+ tokens\)", note)


def test_train_problems_past_those_that_exist_are_refused_at_once():
    with pytest.raises(UserError, match=r"--train-problems 1000000: --numbers 1 --low 0 --high 999 \(generated\) makes "
                                        r"only 500 distinct problems besides the 500 held out"):
        Arithmetic(numbers=1, low=0, high=999, train_problems=1_000_000)
    assert len(Arithmetic(numbers=1, low=0, high=999, train_problems=500).train_problems(500, seed=1)) == 500
    # Countdown's count is not known in advance: drawing stops when new problems stop coming.
    with pytest.raises(UserError, match=r"--train-problems 100000: --numbers 2 --low 1 --high 32 .*makes only \d+ "):
        Countdown(numbers=2, low=1, high=32, train_problems=100_000)


def test_train_problems_past_a_data_files_rows_are_refused(tmp_path):
    rows = open(GSM8K).readlines()
    (tmp_path / "train.jsonl").write_text("".join(rows[:5]))
    (tmp_path / "eval.jsonl").write_text("".join(rows[:2]))  # two of them: left out of training
    with pytest.raises(UserError, match=r"--train-problems 1000: --data .* makes only 3 distinct problems"):
        get_task("gsm8k", data=str(tmp_path / "train.jsonl"), eval_data=str(tmp_path / "eval.jsonl"),
                 train_problems=1000)


def test_system_must_be_text_a_template_renders_and_short(chat_tokenizer):
    with pytest.raises(argparse.ArgumentTypeError, match="byte 0xff is not UTF-8"):
        checked(str, "text")(b"\xff be brief".decode("utf-8", "surrogateescape"))
    task = Arithmetic(prompt_style="instruct", system="Be brief.")
    check_system(task, chat_tokenizer, True, "Be brief.", 128, 10)  # rendered, and short: accepted
    with pytest.raises(UserError, match="--no-chat-template the prompts are raw text"):
        check_system(task, chat_tokenizer, False, "Be brief.", 128, 10)
    with pytest.raises(UserError, match="has no chat template"):
        check_system(task, load_tokenizer(QIU_MODEL), True, "Be brief.", 128, 10)
    long = Arithmetic(prompt_style="instruct", system="x" * 500)
    with pytest.raises(UserError, match=r"--system: 500 tokens, which with --max-new-tokens 10 run past the 128"):
        check_system(long, chat_tokenizer, True, "x" * 500, 128, 10)
