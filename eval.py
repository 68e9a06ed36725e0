"""Evaluate a model on a task's held-out split: pass@k, greedy accuracy, malformed and truncated rates,
entropy, length.

    python eval.py                                   # the shipped model on the default task
    python eval.py --task countdown                  # the shipped Countdown model on Countdown
    python eval.py --model out/es-arithmetic-seed0/step-000140 --n 32 --k 1 4 16 32 --out results.json
    python eval.py --model Qwen/Qwen2.5-0.5B-Instruct --task gsm8k --eval-data tests/data/gsm8k_test.jsonl --n 4 --k 1 4
    python eval.py --model Qwen/Qwen2.5-0.5B-Instruct --task countdown --show-prompt   # what the model reads

A model that names its own recipe (the shipped models: minies/recipes.py) is asked in that recipe's prompt
style, on its task unless --task says otherwise.
"""
import argparse
import json
import os
import sys
from dataclasses import dataclass

from minies import UserError
from minies.cli import ArgumentParser, check_thread_variable, check_writable, run_script
from minies.config import checked, from_args, option
from minies.evaluate import evaluate
from minies.models import default_device, load_config, load_model, load_tokenizer, resolve_model
from minies.options import ModelOptions, TaskOptions, check_fit, first_pass, make_task, note_compile_decoding
from minies.options import own_recipe_of, parse as parse_options
from minies.recipes import set_by_recipe
from minies.rollout import encode
from minies.runtime import set_up_process


@dataclass
class EvalConfig(TaskOptions, ModelOptions):
    seed: int = option(0, "task split and sampling seed", check="seed")
    problems: int = option(None, "held-out problems to use (default: all of the test split: 500 generated, or every "
                           "row of --eval-data)", check="count")
    n: int = option(32, "samples per problem", check="count")
    k: list = option((1, 4, 16, 32), "k values for pass@k; each >= 1 and <= n", nargs="+",
                     type=checked(int, "positive"))
    temperature: float = option(1.0, "sampling temperature", check="temperature")
    micro_batch: int = option(256, "sequences per generate call", check="count")
    lenient_answers: bool = option(False, "gsm8k: when a completion has no answer tag and no \\boxed{}, take its last "
                                   "number (training rewards never do)")
    out: str = option(None, "also write the metrics to this JSON file (with --show-prompt: the prompt and its length)",
                      check="nonempty")
    show_prompt: bool = option(False, "print the first held-out problem's prompt exactly as the model reads it "
                               "(special tokens, system message and template included) and its length in tokens, "
                               "then exit: loads the tokenizer, not the model")


def parse_args(argv):
    return parse(argv)[0]


def parse(argv):
    """(EvalConfig, the model's own recipe or None)."""
    known = first_pass(argv)
    ap = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # The task-level settings of the model's own recipe (its prompt style, its task).
    own = own_recipe_of(known.model, known.task)
    return from_args(EvalConfig, parse_options(ap, argv, {"evaluation": EvalConfig}, [own], None, known.task)), own


def main(argv=None):
    cfg, own = parse(argv)
    by_recipe = set_by_recipe(argv, [own], None, cfg)
    check_thread_variable()
    set_up_process(default_device())  # every process-wide setting (threads, allocator, logging): minies/runtime
    note_compile_decoding(argv, cfg.compile_decoding, default_device())
    too_big = [k for k in cfg.k if k > cfg.n]
    if too_big:
        raise UserError(f"--k {' '.join(map(str, too_big))}: pass@k needs n >= k samples; raise --n to {max(too_big)}")
    if cfg.out:
        if os.path.isdir(cfg.out) or cfg.out.endswith(("/", os.sep)):
            raise UserError(f"--out {cfg.out}: is a directory; give a file name")
        check_writable(os.path.dirname(cfg.out) or ".", "--out")
        for flag, path in (("--data", cfg.data), ("--eval-data", cfg.eval_data)):
            if path is not None and os.path.realpath(path) == os.path.realpath(cfg.out):
                raise UserError(f"--out {cfg.out} is the {flag} file: the metrics would overwrite the problems; give "
                                "another file name")

    if cfg.lenient_answers and cfg.task != "gsm8k":
        raise UserError(f"--lenient-answers: only --task gsm8k has a lenient reading; --task {cfg.task} reads "
                        "answers one way only, so drop it")
    source = resolve_model(cfg.model)  # once: a GGUF file is converted here, or found converted
    model_config = load_config(source)
    task = make_task(cfg, model_config, by_recipe, lenient_answers=cfg.lenient_answers)
    style = task.prompt_style
    tok = load_tokenizer(source)
    check_fit(task, tok, cfg, model_config, by_recipe)
    if cfg.show_prompt:
        prompt = task.prompts(tok, task.test_problems(1), cfg.chat_template)[0]
        length = len(encode(tok, [prompt])['input_ids'][0])
        print(prompt)
        print(f"({length} tokens: {style} prompt style, {cfg.task})", file=sys.stderr)
        if cfg.out:
            write_json(cfg.out, {"model": cfg.model, "task": cfg.task, "prompt_style": style, "prompt": prompt,
                                 "tokens": length})
        return
    model = load_model(source, cfg.dtype, cfg.load_in_8bit)
    metrics = evaluate(model, tok, task, task.test_problems(cfg.problems), n=cfg.n, ks=cfg.k,
                       temperature=cfg.temperature, seed=cfg.seed, micro_batch=cfg.micro_batch,
                       chat_template=cfg.chat_template, compile_decoding=cfg.compile_decoding, progress=True)
    print(f"{cfg.model} on {cfg.task} ({metrics['problems']} held-out problems, n={cfg.n}, T={cfg.temperature}, "
          f"{style} prompts, {task.reward} reward, up to {task.max_new_tokens} new tokens)")
    for key, value in metrics.items():
        if isinstance(value, float):
            print(f"  {key:<16} {value:.4f}")
    if cfg.out:
        write_json(cfg.out, {"model": cfg.model, "task": cfg.task, "prompt_style": style, "reward": task.reward,
                             "max_new_tokens": task.max_new_tokens, "temperature": cfg.temperature, **metrics})


def write_json(path, record):
    """--out: `record` as a JSON file (with --show-prompt, the prompt and its length; else the metrics)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    run_script(main)
