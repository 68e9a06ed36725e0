"""Named recipes (--recipe) and per-model defaults (minies_defaults in config.json): what a run resolves,
what explicit flags override, and what config.json records."""
import json
import shutil

import pytest

import train
from conftest import run_in_process
from minies import UserError
from minies.es import ES, ESConfig
from minies.models import MODEL_DEFAULTS, load_config, load_model, load_tokenizer, model_defaults, prompt_style_for
from minies.recipes import RECIPES
from minies.tasks import Arithmetic


def parse(*argv):
    cfg, algo_cfg, _ = train.parse_args(list(argv))
    return cfg, algo_cfg


def test_qiu2025_sets_the_papers_es():
    cfg, es = parse("--recipe", "qiu2025")
    assert cfg.algo == "es" and cfg.recipe == "qiu2025" and cfg.steps == 500
    assert (es.population, es.sigma, es.alpha, es.normalize, es.antithetic, es.params, es.greedy, es.mode) == (
        30, 1e-3, 5e-4, "zscore", False, ".*", True, "inplace")


def test_explicit_flags_win_over_a_recipe():
    cfg, es = parse("--recipe", "qiu2025", "--sigma", "0.002", "--steps", "7")
    assert es.sigma == 0.002 and cfg.steps == 7 and es.alpha == 5e-4


@pytest.mark.parametrize("algo", ["c3po", "b3po", "m3po"])
def test_3po_recipe_sets_ivon_for_every_variant(algo):
    cfg, c = parse("--recipe", "3po", *(["--algo", algo] if algo != "c3po" else []))
    assert cfg.algo == algo
    assert (c.ess, c.hess_init, c.beta1, c.beta2, c.weight_decay, c.lr, c.clip_radius) == (
        1e9, 1e-3, 0.9, 0.9999, 1e-6, 1.0, 1e-3)
    assert (c.prompts, c.group_size, c.max_grad_norm, c.beta) == (32, 16, 1.0, 0.0)
    assert getattr(c, "chunks", 2) == 2


def test_deepseekmath_recipe():
    cfg, g = parse("--recipe", "deepseekmath")
    assert cfg.algo == "grpo" and (g.lr, g.beta, g.group_size) == (1e-6, 0.04, 64)


def test_every_recipe_names_only_existing_flags():
    for name, recipe in RECIPES.items():
        for algo in recipe.algos:
            cfg, algo_cfg = parse("--recipe", name, "--algo", algo)
            fields = {**vars(cfg), **vars(algo_cfg)}
            assert all(fields[k] == v for k, v in recipe.values.items() if k in fields), (name, algo)
        known = set().union(*(vars(parse("--recipe", name, "--algo", a)[1]) for a in recipe.algos)) | set(vars(cfg))
        assert set(recipe.values) <= known, set(recipe.values) - known


@pytest.mark.parametrize("argv,mention", [(["--recipe", "qiu2025", "--algo", "grpo"], "--recipe qiu2025"),
                                          (["--recipe", "nope"], "--recipe nope")])
def test_recipe_errors(argv, mention):
    with pytest.raises(UserError, match=mention):
        train.parse_args(argv)


def test_help_lists_the_recipes(capsys):
    code, _ = run_in_process("train.py", "--help")
    out = capsys.readouterr().out
    assert code == 0 and all(name in out for name in RECIPES) and "Qiu et al. 2025" in out


@pytest.fixture(scope="module")
def plain_model_dir(tmp_path_factory, model_dir):
    """The test model with no minies_defaults in its config.json: what any hub model looks like."""
    out = tmp_path_factory.mktemp("plain") / "model"
    shutil.copytree(model_dir, out)
    config = json.loads((out / "config.json").read_text())
    config.pop("minies_defaults", None)
    (out / "config.json").write_text(json.dumps(config))
    return str(out)


def test_model_defaults(model_dir, plain_model_dir):
    shipped = model_defaults(load_config(model_dir))
    assert shipped["prompt_style"] == "terse" and shipped["es_params"] == r"embed_tokens|layers\.0\."
    # ES on the shipped model runs in place, as its results were measured; other models get --mode auto
    assert shipped["algorithms"] == {"es": {"mode": "inplace"}}
    assert parse("--model", model_dir)[1].mode == "inplace" and parse("--model", plain_model_dir)[1].mode == "auto"
    assert parse("--model", model_dir, "--mode", "auto")[1].mode == "auto"
    assert model_defaults(load_config(plain_model_dir)) == MODEL_DEFAULTS == {
        "prompt_style": "instruct", "es_params": ".*", "algorithms": {}}
    assert prompt_style_for("auto", load_config(plain_model_dir)) == "instruct"
    assert prompt_style_for("terse", load_config(plain_model_dir)) == "terse"


def test_es_perturbs_all_weights_of_a_model_without_defaults(model_dir, plain_model_dir):
    def perturbed(path, params=None):
        es = ES(load_model(path, device="cpu"), load_tokenizer(path), Arithmetic(test_size=5),
                ESConfig(population=2, prompts_per_step=2, params=params, mode="inplace"))
        return es.cfg.params, {t.name for t in es.tensors}

    params, names = perturbed(plain_model_dir)
    assert params == ".*" and len(names) == len(dict(load_model(plain_model_dir, device="cpu").named_parameters()))
    params, names = perturbed(model_dir)
    assert params == r"embed_tokens|layers\.0\." and all("embed_tokens" in n or "layers.0." in n for n in names)
    assert perturbed(model_dir, "lm_head|norm")[0] == "lm_head|norm"


def test_config_json_records_resolved_values(tmp_path, model_dir, capsys):
    code, message = run_in_process("train.py", "--model", model_dir, "--recipe", "qiu2025", "--steps", 1,
                                   "--population", 2, "--prompts-per-step", 2, "--eval-problems", 2,
                                   "--final-samples", 1, "--eval-every", 0, "--out", tmp_path)
    assert code == 0, capsys.readouterr().err + message
    config = json.loads((tmp_path / "es-arithmetic-seed0" / "config.json").read_text())
    assert config["train"]["recipe"] == "qiu2025" and config["train"]["prompt_style"] == "terse"
    assert config["train"]["max_new_tokens"] == 10 and config["train"]["steps"] == 1
    assert (config["es"]["sigma"], config["es"]["alpha"], config["es"]["population"], config["es"]["params"]) == (
        1e-3, 5e-4, 2, ".*")


def test_a_model_names_its_tuned_settings_per_algorithm(tmp_path, model_dir):
    """minies_defaults.algorithms in config.json sets train.py's defaults for that algorithm alone (steps
    included); a recipe and explicit flags still win, and --help shows the model's values."""
    out = tmp_path / "model"
    shutil.copytree(model_dir, out)
    config = json.loads((out / "config.json").read_text())
    config["minies_defaults"]["algorithms"] = {"grpo": {"lr": 0.5, "steps": 7, "group_size": 4}}
    (out / "config.json").write_text(json.dumps(config))
    cfg, grpo = parse("--model", str(out), "--algo", "grpo")
    assert (grpo.lr, cfg.steps, grpo.group_size) == (0.5, 7, 4)
    assert parse("--model", str(out), "--algo", "grpo", "--lr", "0.1")[1].lr == 0.1
    assert parse("--model", str(out), "--recipe", "deepseekmath")[1].lr == 1e-6
    assert parse("--model", str(out), "--algo", "es")[0].steps is None  # not ES's: the algorithm's own
    assert parse("--model", str(model_dir), "--algo", "grpo")[1].lr == 1e-4
