"""A GRPO step of minies against TRL's GRPOTrainer on the same model and batch: seconds, peak memory, and where
minies' step goes.

    python -m bench.grpo                                  # the shipped model, its recipe's batch, one thread
    python -m bench.grpo --model smollm2-135m             # SmolLM2-135M-Instruct, full fine-tuning
    python -m bench.grpo --model smollm2-135m --lora-rank 16
    python -m bench.grpo --skip-trl                       # only minies' step and its split

Both sides train the same parameters of the same model (every weight, or LoRA adapters of --lora-rank on the
same projections: minies' own adapters, TRL's through peft) on the same arithmetic prompts (formatted once, by
minies, in the model's recipe's prompt style, and given to TRL as plain strings), with the same batch (P prompts x
G completions, in micro-batches of --micro-batch), learning rate, sampling temperature (top-k and top-p off), loss
(`grpo` aggregation, ε = 0.2, β = 0, group-std advantages) and gradient clipping, in float32 without gradient
checkpointing, one thread. The batch and learning rate default to the model's recipe (minies/recipes.py).
Each side runs in a process of its own, so that each one's peak resident memory is its own.
TRL is used only when it is installed (with peft for --lora-rank); it is never a dependency of minies.

Printed: seconds per step of each (the fastest of --steps timed steps, after one warm-up step) and peak resident
memory; minies' step split into generation, scoring, the log-prob forward passes, the backward pass (with the
loss) and the optimizer (clipping and AdamW), the torch.profiler ranges GRPO marks its step with, read from one
more step run under the profiler; and the memory floor of a step: weights, gradients and AdamW's two moments of
the trained parameters, and one logits chunk (rollout.logits_rows caps it), which any trainer must hold at once.
"""
import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

import torch
from torch.profiler import ProfilerActivity, profile

from minies.config import add_arguments, from_args, option, option_of
from minies.grpo import GRPO, GRPOConfig
from minies.models import SHIPPED_MODEL, default_device, load_model, load_tokenizer
from minies.recipes import RECIPES, own_recipe
from minies.rollout import LOGITS_BYTES, format_prompts, logits_rows
from minies.runtime import set_up_process
from minies.tasks import get_task

TASK_SETTINGS = ("prompt_style", "max_new_tokens", "numbers", "low", "high", "system", "reward")


@dataclass
class BenchConfig:
    model: str = option(SHIPPED_MODEL, "the model both trainers train (a name, a directory or a GGUF file)")
    prompts: int = option(None, "prompts per step (default: the model's recipe's, else GRPO's)", check="count")
    group_size: int = option(None, "completions per prompt (default: the model's recipe's, else GRPO's)",
                             check="count")
    lr: float = option(None, "learning rate (default: the model's recipe's, else GRPO's)", check="positive")
    temperature: float = option_of(GRPOConfig, "temperature")
    micro_batch: int = option_of(GRPOConfig, "micro_batch")
    lora_rank: int = option(0, "train LoRA adapters of this rank on the frozen weights (0: every weight)",
                            check="non_negative")
    new_tokens: int = option(None, "max new tokens per completion (default: the task's)")
    steps: int = option(3, "timed steps of each trainer, after one warm-up step; the fastest is kept")
    skip_trl: bool = option(False, "measure minies alone")


# The parts of minies' step: the torch.profiler ranges of minies/grpo.py.
RANGES = {"generation": "grpo.generate", "scoring": "grpo.verify", "log-prob forward": "grpo.logprobs",
          "backward and loss": "grpo.loss_backward", "optimizer": "grpo.optimizer"}


def resolve(args):
    """The batch, learning rate and task settings: the flags, else the model's recipe, else GRPO's defaults."""
    recipe = RECIPES.get(own_recipe(args.model))
    settings = recipe.settings("grpo") if recipe else {}
    for key in ("prompts", "group_size", "lr"):
        if getattr(args, key) is None:
            setattr(args, key, settings.get(key, getattr(GRPOConfig, key)))
    return {key: value for key, value in settings.items() if key in TASK_SETTINGS}


def setup(args, steps):
    """The model, its tokenizer, the task and the problems of `steps` steps, in order."""
    torch.manual_seed(0)
    model, tok = load_model(args.model), load_tokenizer(args.model)
    task = get_task("arithmetic", **{"prompt_style": "terse", **resolve(args), "max_new_tokens": args.new_tokens})
    return model, tok, task, task.train_problems(args.prompts * steps, seed=1)


def minies_side(args):
    """{seconds of the fastest timed step, the split of one more step run under torch.profiler, trained
    parameters} of minies' GRPO; the split's "other" is what the profiled step spent outside the ranges."""
    model, tok, task, problems = setup(args, args.steps + 2)
    algo = GRPO(model, tok, task, GRPOConfig(prompts=args.prompts, group_size=args.group_size, lr=args.lr,
                                             temperature=args.temperature, micro_batch=args.micro_batch,
                                             lora_rank=args.lora_rank))
    batches = [problems[i:i + args.prompts] for i in range(0, len(problems), args.prompts)]
    seconds = []
    for step, batch in enumerate(batches[:-1]):
        start = time.perf_counter()
        algo.step(batch, seed=step)
        seconds.append(time.perf_counter() - start)
    with profile(activities=[ProfilerActivity.CPU]) as profiled:
        start = time.perf_counter()
        algo.step(batches[-1], seed=len(batches) - 1)
        profiled_seconds = time.perf_counter() - start
    in_range = {event.key: event.cpu_time_total / 1e6 for event in profiled.key_averages()}
    split = {label: in_range.get(name, 0.0) for label, name in RANGES.items()}
    return {"seconds": min(seconds[1:]), "split": {**split, "other": profiled_seconds - sum(split.values())},
            "floor": memory_floor(model, task, args)}


def memory_floor(model, task, args):
    """Bytes any trainer of this step holds at once: the weights, the gradients and AdamW's two moments of the
    trained parameters (fp32), and one [rows, completion, vocabulary] fp32 logits chunk."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    rows = logits_rows(task.max_new_tokens, model.config.vocab_size, args.micro_batch)
    return {"weights": weights, "gradients and AdamW": 3 * 4 * trained,
            "one logits chunk": min(LOGITS_BYTES, 4 * rows * task.max_new_tokens * model.config.vocab_size)}


def trl_side(args):
    """{seconds of the fastest timed step, TRL's version} of TRL's GRPOTrainer on the same model, batch and loss."""
    import pyarrow
    import trl
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback

    model, tok, task, problems = setup(args, args.steps + 1)
    prompts = format_prompts(tok, [p.question for p in problems])
    # Given a fingerprint, datasets does not hash the table (which fails with some dill and pyarrow versions).
    data = Dataset(pyarrow.Table.from_pylist([{"prompt": text, "problem": i} for i, text in enumerate(prompts)]),
                   fingerprint="bench-grpo")

    def reward(completions, problem, **_):
        return [task.score(text, problems[i]).reward for text, i in zip(completions, problem)]

    ends = []

    class Clock(TrainerCallback):
        def on_step_end(self, *_, **__):
            ends.append(time.perf_counter())

    rows = args.prompts * args.group_size
    with tempfile.TemporaryDirectory() as out:
        config = trl.GRPOConfig(
            output_dir=out, use_cpu=not torch.cuda.is_available(), report_to=[], save_strategy="no",
            disable_tqdm=True, logging_strategy="no",
            per_device_train_batch_size=min(args.micro_batch, rows),
            gradient_accumulation_steps=max(1, rows // args.micro_batch),
            num_generations=args.group_size, max_completion_length=task.max_new_tokens, temperature=args.temperature,
            top_k=0, top_p=1.0, learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
            max_grad_norm=1.0, beta=0.0, epsilon=0.2, loss_type="grpo", scale_rewards="group",
            # TRL turns both on by default; minies computes in float32 and keeps its activations.
            bf16=False, gradient_checkpointing=False,
            max_steps=args.steps + 1, shuffle_dataset=False, seed=0)
        trainer = trl.GRPOTrainer(model=model, processing_class=tok, reward_funcs=reward, args=config,
                                  train_dataset=data, callbacks=[Clock()], peft_config=lora_config(args))
        trainer.remove_callback(PrinterCallback)  # its end-of-training summary would bury the report
        start = time.perf_counter()
        trainer.train()
    times = [b - a for a, b in zip([start] + ends, ends)]
    return {"seconds": min(times[1:]), "version": trl.__version__}


def lora_config(args):
    """peft's adapters of minies' shape: rank, scale alpha/rank and target projections as GRPOConfig's defaults,
    no dropout (None: every weight is trained)."""
    if not args.lora_rank:
        return None
    from peft import LoraConfig

    return LoraConfig(r=args.lora_rank, lora_alpha=GRPOConfig.lora_alpha, lora_dropout=0.0, bias="none",
                      target_modules=GRPOConfig.lora_targets.split(","), task_type="CAUSAL_LM")


def run_side(side, argv):
    """One side's measurements, from a process of its own: {seconds, ..., "peak_mib"}, or None when it failed
    (its error printed)."""
    out = subprocess.run([sys.executable, "-m", "bench.grpo", *argv, "--side", side], capture_output=True, text=True)
    if out.returncode:
        print(f"{side}: failed: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}")
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def report(args, mine, theirs):
    mib = 2**20
    profiled = sum(mine["split"].values())
    print(f"minies GRPO step {mine['seconds']:7.2f} s, peak resident memory {mine['peak_mib']:.0f} MiB; the split "
          f"of one more step, under torch.profiler ({profiled:.2f} s):")
    for name, value in mine["split"].items():
        print(f"  {name:18s} {value:6.2f} s  {100 * value / profiled:5.1f}%")
    floor = mine["floor"]
    print("memory floor " + " + ".join(f"{name} {value / mib:.0f}" for name, value in floor.items())
          + f" = {sum(floor.values()) / mib:.0f} MiB; minies' peak is {mine['peak_mib'] * mib / sum(floor.values()):.2f}"
          "x the floor (the rest: the Python process, torch and transformers, activations, the KV cache)")
    if theirs is None:
        return
    print(f"TRL {theirs['version']} GRPOTrainer step {theirs['seconds']:7.2f} s, peak resident memory "
          f"{theirs['peak_mib']:.0f} MiB")
    print(f"minies / TRL: seconds per step {mine['seconds'] / theirs['seconds']:.2f}x, peak memory "
          f"{mine['peak_mib'] / theirs['peak_mib']:.2f}x")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p, BenchConfig, "bench.grpo")
    p.add_argument("--side", choices=["minies", "trl"], help=argparse.SUPPRESS)  # internal: one side, this process
    parsed = p.parse_args()
    args = from_args(BenchConfig, parsed)
    set_up_process(default_device())  # every process-wide setting, as train.py makes them (minies/runtime)
    torch.set_num_threads(1)
    if parsed.side:
        result = minies_side(args) if parsed.side == "minies" else trl_side(args)
        print(json.dumps({**result, "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
        return
    resolve(args)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU, {torch.get_num_threads()} thread(s)"
    print(f"# bench.grpo: {args.model}, {'LoRA rank %d' % args.lora_rank if args.lora_rank else 'every weight'}, "
          f"{args.prompts} prompts x {args.group_size} completions, lr {args.lr}, temperature {args.temperature}, "
          f"micro-batch {args.micro_batch}, on {device}")
    argv = [arg for key, value in asdict(args).items() if value is not None and key != "skip_trl"
            for arg in (f"--{key.replace('_', '-')}", str(value))]
    mine = run_side("minies", argv)
    if mine is None:
        sys.exit(1)
    try:
        import trl  # noqa: F401 (only whether it is installed)
    except ImportError:
        trl = None
    if args.skip_trl or trl is None:
        print("TRL GRPOTrainer: skipped (" + ("--skip-trl" if args.skip_trl else "trl is not installed") + ")")
    report(args, mine, None if args.skip_trl or trl is None else run_side("trl", argv))


if __name__ == "__main__":
    main()
