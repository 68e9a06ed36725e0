"""Build a shipped tiny model: a character tokenizer, a small Qwen2 decoder, and a supervised warm
start on a task's reference solutions.

    python -m scripts.make_tiny            # rewrites minies/assets/tiny (deterministic from --seed)
    python -m scripts.make_tiny --task countdown --steps 3000 --eval-every 100   # minies/assets/tiny-countdown
    python -m scripts.make_tiny --task countdown --prompt-style qiu --steps 2000 --eval-every 100   # .../tiny-qiu

The third reads Qiu et al.'s raw prompt and answers in their think/answer envelope; what it learns from, and
its data file, written beside it in their format, are in scripts/tiny_qiu.py.

The warm start is stopped early on purpose, as soon as held-out pass@1 at temperature 1 reaches
--stop-at-pass1 (20%): the model knows the answer format, often has the right answer among its
samples, but is still wrong most of the time, so reinforcement learning has something to learn.
Around that point the model is learning fast (it is "getting" the carry), which is exactly where a
small push from RL shows. The evaluation is seeded, so the stopping step is deterministic too.
"""
import argparse
import dataclasses
import operator
import os
import random
import re
import statistics
import string
import time
from dataclasses import dataclass

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from minies.config import add_arguments, from_args, option
from minies.evaluate import evaluate
from minies.models import SHIPPED_MODELS
from minies.recipes import QIU_DATA
from minies.tasks import Arithmetic, Countdown, qiu_rows, solutions
from scripts.tiny_qiu import QIU_PHRASES, QIU_ROWS, QIU_WORDS, qiu_problems, qiu_task, write_rows

SPECIAL = ["<pad>", "<eos>", "<unk>"]
WORDS = ["<answer>", "</answer>", "<|user|>", "<|assistant|>"]  # single tokens, kept when decoding
# Each shipped model names its own recipe (minies/recipes.py: what was tuned on it), saved in its config.json.
RECIPE = {"arithmetic": "tiny", "countdown": "tiny-countdown"}
CHAT_TEMPLATE = ("{% for m in messages %}<|user|>{{ m['content'] }}{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def build_tokenizer(words=WORDS, phrases=(), chat_template=CHAT_TEMPLATE):
    """One token per printable ASCII character, plus the special tokens, the `words` (tags) and the `phrases`:
    fixed text that the pre-tokenizer keeps whole wherever it occurs (longest first)."""
    chars = [c for c in string.printable if c not in "\x0b\x0c\r"]
    phrases = sorted(phrases, key=len, reverse=True)
    vocab = {t: i for i, t in enumerate(SPECIAL + words + phrases + chars)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    # Python's re.escape writes a newline as a backslash and a newline; the tokenizers' regex wants \n.
    pattern = "".join(re.escape(p).replace("\\\n", r"\n") + "|" for p in phrases) + r"[\s\S]"
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tk.add_special_tokens(SPECIAL)
    tk.add_tokens(words)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    tok.chat_template = chat_template
    tok.padding_side = "left"
    return tok


def build_model(tok, hidden, layers, seed, recipe="tiny", positions=128):
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=hidden, intermediate_size=4 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=positions, tie_word_embeddings=True, pad_token_id=tok.pad_token_id,
                         eos_token_id=tok.eos_token_id, bos_token_id=None)
    # The recipe train.py and eval.py apply to this model (minies/recipes.py); saved in config.json, so every
    # checkpoint trained from it names it too.
    config.minies_recipe = recipe
    return Qwen2ForCausalLM(config)


def sft_batch(tok, task, problems, solution=None):
    """Token ids of prompt + solution + EOS, right-padded, with labels only on the completion. `solution(problem)`:
    the completion to learn, by default the task's reference solution."""
    prompts = task.prompts(tok, problems)
    rows, labels = [], []
    for prompt, p in zip(prompts, problems):
        prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
        answer_ids = tok((solution or task.solution)(p), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        rows.append(prompt_ids + answer_ids)
        labels.append([-100] * len(prompt_ids) + answer_ids)
    width = max(map(len, rows))
    ids = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in rows])
    lab = torch.tensor([r + [-100] * (width - len(r)) for r in labels])
    return ids, (ids != tok.pad_token_id).long(), lab


@dataclass
class TinyConfig:
    task: str = option("arithmetic", "the task to warm-start on", choices=sorted(SHIPPED_MODELS))
    prompt_style: str = option("terse", "terse: the short questions; qiu (--task countdown): Qiu et al.'s raw prompt "
                               "and envelope, on a data file in their format written beside the model",
                               choices=["terse", "qiu"])
    out: str = option(None, "output directory (None: the shipped model of --task, minies.models.SHIPPED_MODELS; "
                      "with --prompt-style qiu, minies/assets/tiny-qiu)")
    seed: int = option(0, "seed for weights and data")
    hidden: int = option(128, "hidden size")
    layers: int = option(4, "number of decoder layers")
    steps: int = option(600, "at most this many SFT steps")
    stop_at_pass1: float = option(0.2, "stop once held-out pass@1 (T=1, 200 problems x 8 samples) reaches this "
                                  "(0: never)")
    batch: int = option(128, "sequences per SFT step")
    lr: float = option(2e-3, "AdamW learning rate (after a linear warmup)")
    eval_every: int = option(25, "evaluate on 200 test problems every k steps")


def sft(model, tok, task, problems, batch, lr, warmup=1, after_step=None, solution=None):
    """Supervised training on the reference solutions of `problems` (or on `solution(problem)`), `batch` at a
    time, with AdamW whose lr rises linearly over `warmup` steps and then stays constant. after_step(step, loss),
    if given, is called after every step; when it returns True training stops there. Leaves the model in eval
    mode."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min((s + 1) / warmup, 1.0))
    model.train()
    for step in range(len(problems) // batch):
        ids, mask, labels = sft_batch(tok, task, problems[step * batch:(step + 1) * batch], solution)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if after_step is not None and after_step(step, loss.item()):
            break
    model.eval()


def varied_references(problems, seed):
    """Countdown problems, each with one of its distinct correct expressions (brute force, `solutions`)
    drawn at random as its reference, so that SFT teaches several ways to reach a target, not only the
    generator's; and the number of distinct solutions of each problem."""
    rng, known = random.Random(seed), {}  # problems repeat often in a large draw: solve each once
    out, counts = [], []
    for p in problems:
        key = (p.numbers, p.answer)
        texts = known[key] = known.get(key) or sorted(solutions(p.numbers, int(p.answer)).values())
        out.append(dataclasses.replace(p, reference=rng.choice(texts)))
        counts.append(len(texts))
    return out, counts


def describe_counts(counts):
    """One line on the number of distinct correct expressions per problem."""
    return (f"{len(counts)} problems, distinct correct expressions per problem: mean {statistics.mean(counts):.2f}, "
            f"median {statistics.median(counts):g}, max {max(counts)}, "
            f"share with >= 2 {sum(c >= 2 for c in counts) / len(counts):.1%}")


def save(model, tok, out):
    model.generation_config.top_k = None  # sample from the full distribution by default
    model.save_pretrained(out)
    tok.save_pretrained(out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, TinyConfig)
    args = from_args(TinyConfig, parser.parse_args(argv))
    qiu = args.prompt_style == "qiu"
    if qiu and args.task != "countdown":
        parser.error("--prompt-style qiu is Qiu et al.'s Countdown prompt: add --task countdown")

    start = time.time()
    countdown = args.task == "countdown"
    out = args.out or (os.path.dirname(QIU_DATA) if qiu else SHIPPED_MODELS[args.task])
    if qiu:
        rows = qiu_rows(QIU_ROWS, seed=0)
        data = os.path.join(out, os.path.basename(QIU_DATA))
        write_rows(data, rows)
        task, tok = qiu_task(data), build_tokenizer(QIU_WORDS, QIU_PHRASES, chat_template=None)
    else:
        task, tok = Countdown() if countdown else Arithmetic(), build_tokenizer()
    model = build_model(tok, args.hidden, args.layers, args.seed, "tiny-qiu" if qiu else RECIPE[args.task])
    print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters")

    def report(step, loss):
        if step % 50 == 0:
            print(f"step {step} loss {loss:.4f}", flush=True)
        if (step + 1) % args.eval_every:
            return False
        model.eval()
        m = evaluate(model, tok, task, task.test_problems()[:200], n=8, ks=(1, 8))
        model.train()
        print(f"step {step + 1}: " + " ".join(f"{k} {v:.3f}" for k, v in m.items() if isinstance(v, float)),
              f"({time.time() - start:.0f}s)", flush=True)
        return m["pass@1"] >= args.stop_at_pass1 > 0

    solution = None
    if qiu:
        problems = qiu_problems(task, args.steps * args.batch, args.seed, {row["context"] for row in rows})
        solution = operator.attrgetter("reference")
    else:
        problems = task.train_problems(args.steps * args.batch, seed=args.seed)
    if countdown and not qiu:
        problems, counts = varied_references(problems, args.seed)
        print("train:", describe_counts(counts))
        print("test: ", describe_counts(varied_references(task.test_problems(), args.seed)[1]), flush=True)
    # Constant after warmup, no decay: the run is stopped mid-way on purpose, while the model is still
    # improving fast, so that RL starts from a model that is close to getting many answers right.
    sft(model, tok, task, problems, args.batch, args.lr, warmup=max(1, args.steps // 20), after_step=report,
        solution=solution)
    save(model, tok, out)
    print(f"saved to {out} in {time.time() - start:.0f}s")


if __name__ == "__main__":
    main()
