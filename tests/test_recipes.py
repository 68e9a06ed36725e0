"""Named recipes (--recipe), and the recipe a model names for itself (minies_recipe in its config.json):
what a run resolves, what explicit flags override, what train.py prints and config.json records."""
import json
import shutil

import pytest

import train
from conftest import REPO, run_in_process
from minies import UserError
from minies.es import ES, ESConfig
from minies.models import load_config, load_model, load_tokenizer
from minies.recipes import RECIPES, naming_recipes, prompt_style_for, table
from minies.tasks import Arithmetic


def parse(*argv):
    cfg, algo_cfg, _, _ = train.parse_args(list(argv))
    return cfg, algo_cfg


def test_qiu2025_sets_the_papers_es():
    cfg, es = parse("--recipe", "qiu2025")
    assert cfg.algo == "es" and cfg.recipe == "qiu2025" and cfg.steps == 500
    assert (es.population, es.sigma, es.alpha, es.normalize, es.antithetic, es.params, es.greedy, es.mode) == (
        30, 1e-3, 5e-4, "zscore", False, ".*", True, "inplace")
    # Their data regime, prompt and reward: a fixed set of 200 problems, all scored every iteration.
    assert (cfg.task, cfg.prompt_style, cfg.reward, cfg.train_problems, es.prompts_per_step, cfg.max_new_tokens) == (
        "countdown", "qiu", "qiu", 200, 200, 1024)


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
    assert cfg.algo == "grpo" and (g.lr, g.beta, g.group_size, g.prompts) == (1e-6, 0.04, 64, 16)
    assert (cfg.task, cfg.max_new_tokens, g.temperature, cfg.steps) == ("gsm8k", 1024, 1.0, 467)


@pytest.mark.parametrize("name", ["qiu2025", "3po", "deepseekmath"])
def test_the_papers_recipes_are_complete_and_cite_their_sources(name):
    """Steps, generation length and the task of every paper's recipe are its own, not the tiny model's; each value
    names where it comes from, and docs/papers.md prints them all."""
    recipe = RECIPES[name]
    assert {"steps", "max_new_tokens", "task", "prompt_style"} <= set(recipe.values)
    assert all(source.strip() for _, source in recipe.values.values())
    assert table(name) in (REPO / "docs" / "papers.md").read_text()


@pytest.mark.parametrize("name", list(RECIPES))
def test_docs_print_every_recipe(name):
    assert table(name) in (REPO / "docs" / "papers.md").read_text()


def test_every_recipe_names_only_existing_flags():
    for name, recipe in RECIPES.items():
        for algo in recipe.algos:
            cfg, algo_cfg = parse("--recipe", name, "--algo", algo)
            fields = {**vars(cfg), **vars(algo_cfg)}
            assert all(fields[k] == v for k, v in recipe.settings(algo).items() if k in fields), (name, algo)
            known = set(vars(algo_cfg)) | set(vars(cfg))
            assert set(recipe.settings(algo)) <= known | set().union(*(
                vars(parse("--recipe", name, "--algo", a)[1]) for a in recipe.algos)), (name, algo)


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
    """The test model with no minies_recipe in its config.json: what any hub model looks like."""
    out = tmp_path_factory.mktemp("plain") / "model"
    shutil.copytree(model_dir, out)
    config = json.loads((out / "config.json").read_text())
    config.pop("minies_recipe", None)
    (out / "config.json").write_text(json.dumps(config))
    return str(out)


def test_the_shipped_models_name_their_recipes(model_dir, plain_model_dir, capsys):
    assert load_config(model_dir).minies_recipe == "tiny"
    tiny = RECIPES["tiny"].settings("es")
    cfg, es = parse("--model", model_dir)
    # ES on the shipped model runs in place on its embeddings and first block, as its results were measured;
    # other models get --mode auto on every weight.
    assert (cfg.prompt_style, es.mode, es.params) == ("terse", "inplace", tiny["params"])
    cfg, es = parse("--model", plain_model_dir)
    assert (cfg.prompt_style, es.mode, es.params) == ("auto", "auto", ".*")
    assert parse("--model", model_dir, "--mode", "auto")[1].mode == "auto"
    # ES's --mode is not an abbreviation of --model: the model keeps its recipe, and no flag is abbreviated.
    assert parse("--model", model_dir, "--mode", "lowrank")[0].prompt_style == "terse"
    capsys.readouterr()
    assert run_in_process("train.py", "--model", model_dir, "--mod", "lowrank")[0] == 2
    assert capsys.readouterr().err == "error: unrecognized arguments: --mod lowrank; see --help\n"
    assert prompt_style_for("auto", load_config(plain_model_dir)) == "instruct"
    assert prompt_style_for("auto", load_config(model_dir)) == "terse"
    assert prompt_style_for("terse", load_config(plain_model_dir)) == "terse"


def test_es_alone_perturbs_every_weight(model_dir):
    """The library's ES perturbs what --params names, every weight by default; the shipped model's narrower
    choice is its recipe's, applied by train.py."""
    def perturbed(**options):
        es = ES(load_model(model_dir, device="cpu"), load_tokenizer(model_dir), Arithmetic(test_size=5),
                ESConfig(population=2, prompts_per_step=2, mode="inplace", **options))
        return {t.name for t in es.tensors}

    assert len(perturbed()) == len(dict(load_model(model_dir, device="cpu").named_parameters()))
    narrow = perturbed(params=RECIPES["tiny"].settings("es")["params"])
    assert narrow and all("embed_tokens" in n or "layers.0." in n for n in narrow)


def test_config_json_records_resolved_values(tmp_path, model_dir, capsys):
    code, message = run_in_process("train.py", "--model", model_dir, "--recipe", "qiu2025", "--task", "arithmetic",
                                   "--prompt-style", "terse", "--reward", "minies", "--max-new-tokens", 10,
                                   "--train-problems", 4, "--steps", 1, "--population", 2, "--prompts-per-step", 2,
                                   "--eval-problems", 2, "--final-samples", 1, "--eval-every", 0, "--out", tmp_path)
    captured = capsys.readouterr()
    assert code == 0, captured.err + message
    # The recipes applied, weakest first, each with the values the run resolved (the command line's win);
    # qiu2025's task-level values (its task, prompt style, reward, ...) are for Countdown only.
    assert captured.out.startswith("recipe tiny: --prompt-style terse, --population 2, --sigma 0.001, --alpha 0.0005, "
                                   "--prompts-per-step 2, --antithetic False, --normalize zscore, --steps 1, --params "
                                   ".*, --mode inplace\n"
                                   "recipe qiu2025: --prompts-per-step 2, --population 2, --sigma 0.001")
    config = json.loads((tmp_path / "es-arithmetic-seed0" / "config.json").read_text())
    assert config["recipes"] == ["tiny", "qiu2025"] and config["train"]["recipe"] == "qiu2025"
    assert (config["train"]["prompt_style"], config["train"]["reward"], config["train"]["train_problems"]) == (
        "terse", "minies", 4)
    assert config["train"]["max_new_tokens"] == 10 and config["train"]["steps"] == 1
    assert (config["es"]["sigma"], config["es"]["alpha"], config["es"]["population"], config["es"]["params"]) == (
        1e-3, 5e-4, 2, ".*")


def test_a_model_names_its_recipe(tmp_path, model_dir):
    """A model's recipe sets train.py's defaults, per algorithm where it says so (steps included); --recipe and
    explicit flags still win; a name minies does not know is one line."""
    out = tmp_path / "model"
    shutil.copytree(model_dir, out)
    config = json.loads((out / "config.json").read_text())
    config["minies_recipe"] = "tiny-countdown"
    (out / "config.json").write_text(json.dumps(config))
    assert parse("--model", str(out), "--algo", "c3po")[0].steps == 200
    assert parse("--model", str(out), "--algo", "c3po", "--steps", "3")[0].steps == 3
    cfg, es = parse("--model", str(out))
    assert (cfg.task, es.alpha, es.prompts_per_step, cfg.steps) == ("countdown", 0.03, 64, 50)
    assert parse("--model", str(out), "--recipe", "qiu2025")[1].alpha == 5e-4
    assert parse("--model", str(out), "--algo", "grpo")[0].steps == 200  # none named: the algorithm's own
    config["minies_recipe"] = "bogus"
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match="minies_recipe 'bogus'"):
        parse("--model", str(out))


def readme_commands():
    """The real-model commands of the README and docs/real-models.md (a hub id after --model), as argv lists."""
    import shlex

    commands = []
    for doc in (REPO / "README.md", REPO / "docs" / "real-models.md"):
        for line in doc.read_text().splitlines():
            words = shlex.split(line.split("#")[0]) if "Qwen/" in line and "--model" in line else []
            if words and words[0] in ("python", "torchrun"):
                script = next(w for w in words if w.endswith(".py"))
                commands.append((doc.name, script, words[words.index(script) + 1:]))
    return commands


def test_the_readme_real_model_commands_parse(tmp_path):
    """Every real-model command of the docs, with a local ChatML model of Qwen2.5's shape in place of the hub id
    and the papers' files in their formats, parses, loads its data and resolves a complete recipe."""
    import eval as eval_script
    from bench.qwen_shapes import save_random_qwen2, scaled_shape
    from minies.tasks import get_task, qiu_rows

    qwen = save_random_qwen2(tmp_path / "qwen", scaled_shape("0.5b"))
    (tmp_path / "countdown.json").write_text(json.dumps(qiu_rows(300, seed=0)))
    (tmp_path / "gsm8k_train.jsonl").write_text("".join(
        json.dumps({"question": f"Tom has {i} apples and buys 2. How many now?", "answer": f"{i}+2\n#### {i + 2}"})
        + "\n" for i in range(50)))
    local = {"Qwen/Qwen2.5-0.5B-Instruct": qwen, "countdown.json": str(tmp_path / "countdown.json"),
             "gsm8k_train.jsonl": str(tmp_path / "gsm8k_train.jsonl"),
             "tests/data/gsm8k_test.jsonl": str(REPO / "tests" / "data" / "gsm8k_test.jsonl")}
    commands = readme_commands()
    assert len(commands) >= 12 and {script for _, script, _ in commands} == {"train.py", "eval.py"}
    for doc, script, argv in commands:
        argv = [local.get(word, word) for word in argv]
        if script == "eval.py":
            cfg = eval_script.parse_args(argv)
        else:
            cfg, algo_cfg, _, recipes = train.parse_args(argv)
            assert cfg.recipe in recipes and cfg.steps is not None and cfg.max_new_tokens is not None, (doc, argv)
        style = prompt_style_for(cfg.prompt_style, load_config(cfg.model))
        task = get_task(cfg.task, data=cfg.data, eval_data=cfg.eval_data, train_problems=cfg.train_problems,
                        prompt_style=style, reward=cfg.reward, max_new_tokens=cfg.max_new_tokens)
        assert task.test_problems() and (cfg.data is None or task.train_problems(2, seed=0)), (doc, argv)


def plain_copy(tmp_path):
    """The shipped model without its recipe: what any model that names none gets."""
    shutil.copytree(REPO / "minies" / "assets" / "tiny", tmp_path, dirs_exist_ok=True)
    config = json.loads((tmp_path / "config.json").read_text())
    config.pop("minies_recipe")
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def test_a_model_without_a_recipe_gets_the_papers_defaults(tmp_path):
    model = plain_copy(tmp_path)
    cfg, es = parse("--model", model)
    assert (es.population, es.sigma, es.alpha, es.normalize, es.antithetic, es.greedy, es.prompts_per_step) == (
        30, 1e-3, 5e-4, "zscore", False, True, 200)
    assert cfg.steps == 500 and cfg.prompt_style == "auto"
    _, g = parse("--model", model, "--algo", "grpo")
    assert (g.lr, g.prompts, g.group_size, g.epsilon_low, g.epsilon_high, g.beta) == (1e-6, 32, 16, 0.2, 0.2, 0.0)
    _, c = parse("--model", model, "--algo", "c3po")
    assert (c.lr, c.clip_radius, c.prompts, c.group_size, c.chunks) == (1.0, 1e-3, 32, 16, 2)


@pytest.mark.parametrize("algo", ["es", "grpo", "b3po", "m3po", "c3po"])
def test_the_shipped_models_keep_their_tuned_values(algo):
    """Their recipes hold what the flags defaulted to when they were tuned: the pinned logs and the README's
    numbers stay what they were."""
    old = {"es": dict(population=32, sigma=8e-3, alpha=1e-2, prompts_per_step=256, antithetic=True, normalize="rank"),
           "grpo": dict(lr=1e-4, prompts=16, group_size=8)}
    old.update({name: dict(lr=1.0, clip_radius=0.1, prompts=16, group_size=8) for name in ("b3po", "m3po", "c3po")})
    steps = {"es": 140, "grpo": 200, "b3po": 200, "m3po": 200, "c3po": 300}
    for model in ("tiny", "tiny-countdown", "tiny-qiu"):
        cfg, algo_cfg = parse("--model", str(REPO / "minies" / "assets" / model), "--algo", algo)
        expected = {**old[algo], **{k: v for k, v in RECIPES[model].settings(algo).items() if k in old[algo]}}
        assert {k: getattr(algo_cfg, k) for k in expected} == expected, model
        if model == "tiny":
            assert cfg.steps == steps[algo]


def test_help_shows_each_default_and_where_it_comes_from(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # one line per flag: argparse would break a source at its hyphens
    with pytest.raises(SystemExit):
        train.parse_args(["--model", plain_copy(tmp_path), "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: 0.001; Qiu et al. 2025, countdown/es_fine-tuning_countdown.py: SIGMA)" in text
    assert "(default: 500; minies/es.py: ES.default_steps)" in text
    assert "run name (default: <algo>-<task>-seed<seed>) " in text and "(default: None)" not in text.split("--run-name")[2][:80]
    with pytest.raises(SystemExit):
        train.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: 0.008; recipe tiny)" in text and "(default: 140; recipe tiny)" in text
    import eval as eval_script
    with pytest.raises(SystemExit):
        eval_script.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: 1 4 16 32)" in text and "(default: terse; recipe tiny)" in text


def test_docs_list_the_papers_defaults():
    from minies.recipes import defaults_table

    configs = train.algorithms()
    rows = defaults_table({"es": configs["es"][0], "grpo": configs["grpo"][0], "b3po, m3po, c3po": configs["c3po"][0]})
    assert rows.count("\n") >= 20 and rows in (REPO / "docs" / "papers.md").read_text()


def test_a_recipes_task_level_values_apply_with_its_task_only():
    """SmolLM2's recipe asks arithmetic as equations: with --task countdown its prompt style is not imposed (the run
    would fail naming --prompt-style equation, a flag nobody typed), while its other values still apply."""
    cfg, _ = parse("--model", "smollm2-135m", "--task", "countdown")
    assert (cfg.task, cfg.prompt_style, cfg.eval_problems, cfg.final_samples) == ("countdown", "auto", None, 8)
    assert parse("--model", "smollm2-135m")[0].prompt_style == "equation"
    assert RECIPES["smollm2"].settings("es", "countdown").get("prompt_style") is None


def test_an_error_names_the_recipe_that_set_the_flag():
    with pytest.raises(UserError, match=r"--max-new-tokens 3 \(from recipe tiny-qiu\)"):
        with naming_recipes(parse("--max-new-tokens", "3")[0], {"max_new_tokens": "recipe tiny-qiu"}):
            raise UserError("--max-new-tokens 3: too few")
