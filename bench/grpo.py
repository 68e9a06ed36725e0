"""A GRPO step of minies against TRL's GRPOTrainer on the same model and batch, and where minies' step goes.

    python -m bench.grpo                  # the shipped model, 16 prompts x 8 completions, one thread
    python -m bench.grpo --skip-trl       # only minies' step and its split

Both sides train every weight of the shipped model on the same arithmetic prompts (formatted once, by
minies, and given to TRL as plain strings), with the same batch (P prompts x G completions, optimizer
steps on micro-batches of 64), learning rate, sampling temperature (top-k and top-p off), loss (`grpo`
aggregation, ε = 0.2, β = 0, group-std advantages) and gradient clipping, in float32 without gradient
checkpointing, in one process with one thread.
TRL is used only when it is installed; it is never a dependency of minies.

Printed: seconds per step of each (the fastest of --steps timed steps, after one warm-up step), and
minies' step split into generation, scoring, the log-prob forward passes, the backward pass (with the
loss) and the optimizer (clipping and AdamW): the torch.profiler ranges GRPO marks its step with, read
from one more step run under the profiler (which slows it a little; on a GPU the ranges time the host).
"""
import argparse
import tempfile
import time
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile

from minies.config import add_arguments, from_args, option, option_of
from minies.grpo import GRPO, GRPOConfig
from minies.models import SHIPPED_MODEL, default_device, load_model, load_tokenizer
from minies.runtime import set_up_process
from minies.recipes import prompt_style_for
from minies.rollout import format_prompts
from minies.tasks import get_task


@dataclass
class BenchConfig:
    prompts: int = option_of(GRPOConfig, "prompts")
    group_size: int = option_of(GRPOConfig, "group_size")
    lr: float = option_of(GRPOConfig, "lr")
    temperature: float = option_of(GRPOConfig, "temperature")
    micro_batch: int = option_of(GRPOConfig, "micro_batch")
    new_tokens: int = option(None, "max new tokens per completion (default: the task's)")
    steps: int = option(3, "timed steps of each trainer, after one warm-up step; the fastest is kept")
    skip_trl: bool = option(False, "measure minies alone")


# The parts of minies' step: the torch.profiler ranges of minies/grpo.py.
RANGES = {"generation": "grpo.generate", "scoring": "grpo.verify", "log-prob forward": "grpo.logprobs",
          "backward and loss": "grpo.loss_backward", "optimizer": "grpo.optimizer"}


def setup(args, steps):
    """The shipped model, its tokenizer, the task and the problems of `steps` steps, in order."""
    torch.manual_seed(0)
    model, tok = load_model(SHIPPED_MODEL), load_tokenizer(SHIPPED_MODEL)
    task = get_task("arithmetic", prompt_style=prompt_style_for("auto", model.config), max_new_tokens=args.new_tokens)
    return model, tok, task, task.train_problems(args.prompts * steps, seed=1)


def minies_steps(args):
    """(seconds of the fastest timed step, the split of one more step, run under torch.profiler) of minies'
    GRPO; the split's "other" is what the profiled step spent outside the ranges."""
    model, tok, task, problems = setup(args, args.steps + 2)
    algo = GRPO(model, tok, task, GRPOConfig(prompts=args.prompts, group_size=args.group_size, lr=args.lr,
                                             temperature=args.temperature, micro_batch=args.micro_batch))
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
    return min(seconds[1:]), {**split, "other": profiled_seconds - sum(split.values())}


def trl_steps(args, trl):
    """Seconds of the fastest timed step of TRL's GRPOTrainer on the same model, batch and loss."""
    import pyarrow
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
                                  train_dataset=data, callbacks=[Clock()])
        trainer.remove_callback(PrinterCallback)  # its end-of-training summary would bury the report
        start = time.perf_counter()
        trainer.train()
    times = [b - a for a, b in zip([start] + ends, ends)]
    return min(times[1:])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p, BenchConfig, "bench.grpo")
    args = from_args(BenchConfig, p.parse_args())
    set_up_process(default_device())  # every process-wide setting, as train.py makes them (minies/runtime)
    torch.set_num_threads(1)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU, {torch.get_num_threads()} thread(s)"
    print(f"# bench.grpo: shipped model, {args.prompts} prompts x {args.group_size} completions, lr {args.lr}, "
          f"temperature {args.temperature}, micro-batch {args.micro_batch}, on {device}")
    seconds, split = minies_steps(args)
    profiled = sum(split.values())
    print(f"minies GRPO step {seconds:7.2f} s; the split of one more, under torch.profiler ({profiled:.2f} s):")
    for name, value in split.items():
        print(f"  {name:18s} {value:6.2f} s  {100 * value / profiled:5.1f}%")
    try:
        import trl
    except ImportError:
        trl = None
    if args.skip_trl or trl is None:
        print("TRL GRPOTrainer: skipped (" + ("--skip-trl" if args.skip_trl else "trl is not installed") + ")")
        return
    trl_seconds = trl_steps(args, trl)
    print(f"TRL {trl.__version__} GRPOTrainer step {trl_seconds:7.2f} s")
    print(f"TRL / minies seconds per step: {trl_seconds / seconds:.2f}x")


if __name__ == "__main__":
    main()
