"""The options train.py and eval.py share, the model and the task, and the setup they share, written once: the
first pass that reads --model and --task (the model decides its own recipe's defaults, minies/recipes.py), the
parse with those defaults, and the task made from TaskOptions. TaskOptions lives with the tasks
(minies/tasks/options.py): a new task flag is one field there, which neither script nor this file names."""
import argparse
import dataclasses
import sys

from minies import UserError
from minies.cli import typed_flags
from minies.config import add_arguments, option
from minies.models import DTYPES, default_model, position_notes
from minies.recipes import naming_recipes, own_recipe, prompt_style_for, recipe_defaults, recipe_origins
from minies.runtime import decoding
from minies.tasks.options import DEFAULT_TASK, TASKS, TaskOptions, get_task
from minies.tasks.fit import check_answer_room, check_system


@dataclasses.dataclass
class ModelOptions:
    model: str = option(None, "hub id, local directory or GGUF file of a causal LM (default: the shipped tiny model "
                        "for --task: minies/assets/tiny-countdown for countdown, minies/assets/tiny otherwise); a "
                        "model may name its own recipe (minies/recipes.py)", check="nonempty")
    dtype: str = option("float32", "weights dtype", choices=list(DTYPES))
    load_in_8bit: bool = option(False, "load the linear layers in 8-bit (bitsandbytes LLM.int8)")
    chat_template: bool = option(True, "wrap questions in the tokenizer's chat template when it has one")
    compile_decoding: bool = option(True, "on CUDA, decode with a static KV cache and a compiled step (CUDA graphs, "
                                    "compiled by a run's first calls); --no-compile-decoding: transformers' eager "
                                    "decoding (minies/runtime/decoding.py)")


def first_pass(argv, *flags):
    """--model, --task and `flags` as `argv` gives them (None where it does not), read before the parse: they decide
    which flags exist and their defaults, which --help shows."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag in ("--model", "--task", *flags):
        pre.add_argument(flag)
    return pre.parse_known_args(argv)[0]


def own_recipe_of(model, task):
    """The recipe of the model a run loads (minies/recipes.py): --model's, else the shipped model's for `task`."""
    return own_recipe(model or default_model(task or DEFAULT_TASK))


def parse(parser, argv, groups, recipes, algo, task, defaults=(), origins=()):
    """`argv` parsed by `parser` into the fields of `groups` ({title: config dataclass}), their defaults `defaults`
    under those of `recipes` (weakest first) for `algo` (None: every algorithm's values) and `task` (the one given
    or --recipe's; recipes.Recipe.settings), and --help naming where each default comes from. --model resolves to
    the shipped model for the task, so that config.json records a path."""
    names = {f.name for config in groups.values() for f in dataclasses.fields(config)}
    chosen = recipe_defaults(recipes, algo, {"task", "prompt_style", "max_new_tokens"}, task)
    origins = {"max_new_tokens": length_origin(chosen, recipes, algo, task), **dict(origins),
               **recipe_origins(recipes, algo, names, task)}
    for title, config in groups.items():
        add_arguments(parser, config, title, origins)
    parser.set_defaults(**dict(defaults))
    parser.set_defaults(**recipe_defaults(recipes, algo, names, task))
    args = parser.parse_args(argv)
    args.model = args.model or default_model(args.task)
    return args


def length_origin(chosen, recipes, algo, task):
    """For --help, where --max-new-tokens' default (None) is the prompt style's and a recipe of `recipes` chose that
    style (`chosen`: the recipes' task, prompt style and length): "8 for equation prompts, recipe smollm2"; None
    otherwise."""
    style, task_class = chosen.get("prompt_style"), TASKS.get(task or chosen.get("task") or DEFAULT_TASK)
    if "max_new_tokens" in chosen or task_class is None or style not in task_class.default_max_new_tokens:
        return None
    origin = recipe_origins(recipes, algo, {"prompt_style"}, task)["prompt_style"]
    return f"{task_class.default_max_new_tokens[style]} for {style} prompts, {origin}"


def make_task(cfg, model_config, by_recipe, speak=True, lenient_answers=False, to_train=False):
    """The task of `cfg`'s TaskOptions, its prompt style "auto" the model's recipe's (`model_config`: the model's
    config), with its notes printed when `speak`. A task that needs --data refuses to train without one."""
    settings = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(TaskOptions)}
    settings["prompt_style"] = prompt_style_for(cfg.prompt_style, model_config, cfg.task)
    with naming_recipes(cfg, by_recipe):
        task = get_task(settings.pop("task"), seed=cfg.seed, lenient_answers=lenient_answers, **settings)
    if to_train and cfg.data is None and task.needs_data:
        raise UserError(task.data_help)
    if speak:
        for note in task.notes + position_notes(model_config, task.max_new_tokens):
            print(f"note: {note}", file=sys.stderr)
    return task


def task_settings(task):
    """The settings whose value the task decides when the flag leaves it open (--prompt-style auto, --reward
    auto, --max-new-tokens), as it decided them: config.json records these."""
    return {"prompt_style": task.prompt_style, "reward": task.reward, "max_new_tokens": task.max_new_tokens}


def check_fit(task, tok, cfg, model_config, by_recipe, speak=True):
    """Refuse a system message the model cannot read, and note answers that may not fit --max-new-tokens (printed
    when `speak`): checks that need the tokenizer (minies/tasks/fit.py)."""
    with naming_recipes(cfg, by_recipe):
        notes = check_answer_room(task, tok)
        check_system(task, tok, cfg.chat_template, cfg.system, getattr(model_config, "max_position_embeddings", None),
                     task.max_new_tokens)
    if speak:
        for note in notes:
            print(f"note: {note}", file=sys.stderr)


def note_compile_decoding(argv, compile_decoding, device):
    """One note when --compile-decoding is given on a machine where decoding is not compiled. On by default, it
    says nothing: a default that does nothing here asks nothing of the user."""
    if compile_decoding and "compile_decoding" in typed_flags(argv) and device.type not in decoding.DEVICES:
        print("note: --compile-decoding does nothing here: decoding is compiled only on CUDA, and this machine "
              "decodes eagerly on its CPU (minies/runtime/decoding.py)", file=sys.stderr)
