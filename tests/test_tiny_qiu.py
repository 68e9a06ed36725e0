"""The shipped Qiu-format model (minies/assets/tiny-qiu): its tokenizer reads Qiu et al.'s published prompt in a few
dozen tokens and gives back every text exactly, its recipe sets up their data regime in train.py and eval.py, its own
completions score as their grader scores them, and every algorithm trains on it."""
import json
import os
import re

import pytest
import torch
from safetensors.torch import load_file

import minies.evaluate
import train
from conftest import run_in_process
from minies.models import load_model, load_tokenizer
from minies.recipes import QIU_DATA
from minies.rollout import generate
from minies.tasks import get_task, qiu_rows
from test_prompts import QIU_ROW_0, QIU_ROW_PADDED

QIU_MODEL = os.path.dirname(QIU_DATA)
pytestmark = [pytest.mark.skipif(not os.path.exists(os.path.join(QIU_MODEL, "model.safetensors")),
                                 reason="the shipped Qiu-format model is not built (docs/tiny-model.md)"),
              pytest.mark.usefixtures("one_thread")]
# Two steps of a run, as small as a run gets: few prompts, members and tokens, evaluations of 2 problems.
TINY = ["--max-new-tokens", "8", "--eval-problems", "2", "--final-samples", "1", "--eval-every", "0"]
SMALL = {"es": ["--population", "4", "--prompts-per-step", "4"], "grpo": ["--prompts", "2", "--group-size", "4"]}


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(QIU_MODEL)


def recipe_task():
    """The task train.py sets up for the model from its own recipe."""
    cfg = train.parse_args(["--model", QIU_MODEL])[0]
    return get_task(cfg.task, data=cfg.data, prompt_style=cfg.prompt_style, reward=cfg.reward,
                    train_problems=cfg.train_problems, max_new_tokens=cfg.max_new_tokens)


@pytest.mark.parametrize("text", [
    "44+19=63,63+35=98</think>\n<answer>44+19+35</answer>",
    "60-57=3,10/3=10/3,10/3*80=800/3</think><answer>(10 / (60 - 57)) * 80</answer>",  # no newline, Qiu's spacing
    "44-19=25</think>",  # no answer block
    "Let me solve this step by step.\n<think> tags, for example <answer> (1 + 2) / 3 </answer>.",  # prompt phrases
    " \t~`{}|\\\"'[83 78  1 39]",
])
def test_completions_round_trip(tok, text):
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text and tok.unk_token_id not in ids


def test_the_published_prompt_is_a_few_dozen_tokens(tok):
    for row in (QIU_ROW_0, QIU_ROW_PADDED):
        ids = tok(row["context"], add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == row["context"] and tok.unk_token_id not in ids
        assert len(ids) < 50 < len(row["context"])
    assert all(len(tok(tag, add_special_tokens=False)["input_ids"]) == 1
               for tag in ("<think>", "</think>", "<answer>", "</answer>"))
    model = load_model(QIU_MODEL, device="cpu")
    longest = max(len(tok(r["context"])["input_ids"]) for r in qiu_rows(2200, seed=0))
    assert longest + recipe_task().max_new_tokens <= model.config.max_position_embeddings


def test_its_recipe_is_qius_data_regime_in_train_and_eval(tok, monkeypatch, capsys):
    """The first 200 rows of the shipped file are trained on, the 2,000 after them held out, with the published
    prompt as it is and Qiu et al.'s reward; eval.py evaluates the same held-out rows."""
    cfg, es_cfg, _, recipes = train.parse_args(["--model", QIU_MODEL])
    assert recipes == ["tiny-qiu"] and es_cfg.prompts_per_step == 200
    assert (cfg.task, cfg.prompt_style, cfg.reward, cfg.data, cfg.train_problems) == (
        "countdown", "qiu", "qiu", QIU_DATA, 200)
    with open(QIU_DATA) as f:
        rows = json.load(f)
    assert rows == qiu_rows(2200, seed=0)
    task = recipe_task()
    assert sorted(p.question for p in task.train_problems(200, seed=0)) == sorted(r["context"] for r in rows[:200])
    assert [p.question for p in task.test_problems()] == [r["context"] for r in rows[200:]]
    assert task.prompts(tok, task.test_problems()[:2]) == [rows[200]["context"], rows[201]["context"]]

    seen = []
    real = minies.evaluate.evaluate
    monkeypatch.setattr(minies.evaluate, "evaluate", lambda model, tok, task, problems, **kw: (
        seen.append((task, problems)), real(model, tok, task, problems, **kw))[1])
    code, _ = run_in_process("eval.py", "--model", QIU_MODEL, "--problems", "2", "--n", "1", "--k", "1")
    assert code == 0 and "qiu prompts, qiu reward" in capsys.readouterr().out
    [(evaluated, problems)] = seen
    assert evaluated.reward == "qiu" and [p.question for p in problems] == [r["context"] for r in rows[200:202]]


def qiu_grader(response, numbers, target):
    """(reward, format reward) as Qiu et al.'s countdown_task.py computes them: reward_function, from its
    format_reward_function and answer_reward_function (eval only ever sees digits, + - * / ( ) and spaces)."""
    text = "<think>" + response
    if re.match(r"^<think>.*?<\/think>\n<answer>.*?<\/answer>$", text, re.DOTALL):
        form = 1.0
    else:
        form = (0.1 * bool(re.search(r"<think>.*?<\/think>", text, re.DOTALL))
                + 0.5 * bool(re.search(r"<answer>.*?<\/answer>", text, re.DOTALL)))
    answers, answer = re.findall(r"<answer>(.*?)<\/answer>", response, re.DOTALL), 0.0
    if answers and re.match(r"^[0-9+\-*/() ]+$", answers[-1]) and (
            sorted(int(n) for n in re.findall(r"\d+", answers[-1])) == sorted(numbers)):
        try:
            answer = float(abs(float(eval(answers[-1], {"__builtins__": None}, {})) - float(target)) < 1e-5)
        except Exception:  # noqa: BLE001 - their grader scores any failure 0
            answer = 0.0
    return 0.1 * form + answer, form


def test_its_own_completions_score_as_qius_grader_scores_them(tok):
    """The model's sampled completions of held-out prompts, graded by minies and by Qiu et al.'s code: the same
    reward and format credit each, over the kinds of the reward table (tests/test_prompts.py) the model writes:
    right and wrong answers in the envelope, and answers outside it."""
    model, task = load_model(QIU_MODEL, device="cpu"), recipe_task()
    problems = task.test_problems()[:32] * 4
    texts = generate(model, tok, task.prompts(tok, problems), task.max_new_tokens, seed=0).texts
    kinds = set()
    for text, p in zip(texts, problems):
        score, (reward, form) = task.score(text, p), qiu_grader(text, p.numbers, p.answer)
        assert (score.reward, score.format) == (pytest.approx(reward), pytest.approx(form)), text
        kinds.add((score.correct, form))
    assert {(True, 1.0), (False, 1.0)} <= kinds and any(form < 1 for _, form in kinds)


@pytest.mark.parametrize("algo", ["es", "grpo", "b3po", "m3po", "c3po"])
def test_two_steps_of_every_algorithm(tmp_path, capsys, algo):
    code, message = run_in_process("train.py", "--model", QIU_MODEL, "--algo", algo, "--steps", "2", "--out", tmp_path,
                                   *TINY, *SMALL.get(algo, SMALL["grpo"]))
    assert code == 0, message
    assert "recipe tiny-qiu: --task countdown" in capsys.readouterr().out
    run = tmp_path / f"{algo}-countdown-seed0"
    assert len((run / "log.jsonl").read_text().splitlines()) == 2
    config = json.loads((run / "config.json").read_text())["train"]
    assert (config["prompt_style"], config["reward"], config["data"], config["train_problems"]) == (
        "qiu", "qiu", QIU_DATA, 200)


def test_es_resumes_bit_identically(tmp_path):
    def run(*args):
        code, message = run_in_process("train.py", "--model", QIU_MODEL, "--out", tmp_path, *TINY, *SMALL["es"], *args)
        assert code == 0, message

    run("--steps", "4", "--save-every", "2", "--run-name", "straight")
    run("--steps", "2", "--save-every", "2", "--run-name", "resumed")
    run("--steps", "4", "--save-every", "2", "--run-name", "resumed", "--resume")
    a, b = (load_file(tmp_path / name / "step-000004" / "model.safetensors") for name in ("straight", "resumed"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    logs = [[{k: v for k, v in json.loads(line).items() if "second" not in k}  # all but the timings
             for line in (tmp_path / name / "log.jsonl").read_text().splitlines()] for name in ("straight", "resumed")]
    assert logs[0] == logs[1]
