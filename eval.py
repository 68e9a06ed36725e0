"""Evaluate a model on a task's held-out split: pass@k, greedy accuracy, malformed rate, entropy, length.

    python eval.py                                   # the shipped model on the default task
    python eval.py --model out/es-arithmetic-seed0/step-000140 --n 32 --k 1 4 16 32 --out results.json
"""
import argparse
import json
import os

from minies import ArgumentParser, UserError, check_writable, run_script
from minies.config import checked
from minies.evaluate import evaluate
from minies.models import SHIPPED_MODEL, load_model, load_tokenizer
from minies.tasks import DEFAULT_TASK, TASKS, get_task


def main(argv=None):
    ap = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=SHIPPED_MODEL, help="hub id or local directory (default: the shipped tiny model)")
    ap.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16 (default: %(default)s)")
    ap.add_argument("--load-in-8bit", action="store_true", help="load the linear layers in 8-bit (bitsandbytes)")
    ap.add_argument("--no-chat-template", dest="chat_template", action="store_false",
                    help="feed the raw question instead of the tokenizer's chat template")
    ap.add_argument("--task", default=DEFAULT_TASK, choices=sorted(TASKS), help="task (default: %(default)s)")
    ap.add_argument("--data", default=None, help="local data file for dataset tasks (gsm8k: a JSONL file)")
    ap.add_argument("--seed", type=checked(int, "non_negative"), default=0,
                    help="task split and sampling seed; >= 0 (default: %(default)s)")
    ap.add_argument("--problems", type=checked(int, "positive"), default=500,
                    help="held-out problems to use; >= 1 (default: %(default)s)")
    ap.add_argument("--n", type=checked(int, "positive"), default=32,
                    help="samples per problem; >= 1 (default: %(default)s)")
    ap.add_argument("--k", type=checked(int, "positive"), nargs="+", default=[1, 4, 16, 32],
                    help="k values for pass@k; each >= 1 and <= n (default: %(default)s)")
    ap.add_argument("--temperature", type=checked(float, "positive"), default=1.0,
                    help="sampling temperature; > 0 (default: %(default)s)")
    ap.add_argument("--micro-batch", type=checked(int, "positive"), default=256,
                    help="sequences per generate call; >= 1 (default: %(default)s)")
    ap.add_argument("--out", default=None, help="also write the metrics to this JSON file")
    args = ap.parse_args(argv)
    too_big = [k for k in args.k if k > args.n]
    if too_big:
        raise UserError(f"--k {' '.join(map(str, too_big))}: pass@k needs n >= k samples; raise --n to {max(too_big)}")
    if args.out:
        if os.path.isdir(args.out):
            raise UserError(f"--out {args.out}: is a directory; give a file name")
        check_writable(os.path.dirname(args.out) or ".", "--out")

    task = get_task(args.task, seed=args.seed, data=args.data)
    tok = load_tokenizer(args.model)
    model = load_model(args.model, args.dtype, args.load_in_8bit)
    metrics = evaluate(model, tok, task, task.test_problems()[:args.problems], n=args.n, ks=args.k,
                       temperature=args.temperature, seed=args.seed, micro_batch=args.micro_batch,
                       chat_template=args.chat_template, progress=True)
    print(f"{args.model} on {args.task} ({metrics['problems']} held-out problems, n={args.n}, T={args.temperature})")
    for key, value in metrics.items():
        if isinstance(value, float):
            print(f"  {key:<16} {value:.4f}")
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"model": args.model, "task": args.task, "temperature": args.temperature, **metrics}, f, indent=1)


if __name__ == "__main__":
    run_script(main)
