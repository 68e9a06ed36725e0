"""The cases of bench.hostile: bad, extreme and damaged input for train.py and eval.py, each with what a good
tool does with it and why (bench/hostile.py runs them and classes what happened), and the files they point at."""
import json
import os
import re
import shutil
from dataclasses import dataclass, field

from bench.hostile_tasks import task_cases, write_task_fixtures

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "minies", "assets", "tiny")
GSM8K_TEST = os.path.join(ROOT, "tests", "data", "gsm8k_test.jsonl")

@dataclass
class Case:
    name: str
    script: str  # train.py or eval.py
    args: list  # {fx}: the fixtures' directory, {out}: the case's own --out, {repo}: the repository
    expect: str  # refuse | run | note
    pattern: str = None  # refuse: a regex the error line must match; note: a regex some line must match
    why: str = ""  # why this expectation, where it is a choice
    env: dict = field(default_factory=dict)
    prepare: object = None  # prepare(case_dir, fixtures): a damaged run directory, ...
    skip: str = None  # why it is not run on this machine (None: it is)



# ---- fixtures: bad files, damaged models ----

def write_fixtures(root):
    def put(name, content):  # name: under root, or an absolute path
        write(os.path.join(root, name), content)

    def jsonl(rows):
        return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)

    os.makedirs(os.path.join(root, "a-dir"))
    put("empty", "")
    put("text", "just some text, not a model\n")
    put("binary", bytes(range(256)) * 64)
    put("trunc.gguf", b"GGUF\x03\x00\x00\x00" + b"\x07" * 40)  # the magic and version of a GGUF file, then cut
    put("empty.gguf", b"")
    # Countdown: 8 distinct solvable rows (TinyZero's keys), then each damage on top of them.
    cd = [{"nums": [a, b, c], "target": a + b * c} for a, b, c in
          [(1, 2, 3), (2, 3, 4), (3, 4, 5), (4, 5, 6), (5, 6, 7), (6, 7, 8), (7, 8, 9), (1, 3, 5)]]
    put("cd-good.jsonl", jsonl(cd))
    put("cd-truncated.jsonl", jsonl(cd) + '{"nums": [1, 2], "tar')
    put("cd-bad-middle.jsonl", jsonl(cd[:4] + ['{"nums": [1, 2], "target": }'] + cd[4:]))
    put("cd-fields.jsonl", jsonl([{"a": [1, 2], "b": 3}] * 4))
    put("cd-string-numbers.jsonl", jsonl(cd + [{"nums": ["1", "2"], "target": 3}]))
    put("cd-nested.jsonl", jsonl(cd + [{"nums": [[1, 2], [3]], "target": 3}]))
    put("cd-target-list.jsonl", jsonl(cd + [{"nums": [1, 2], "target": [3]}]))
    put("cd-bool.jsonl", jsonl(cd + [{"nums": [True, 2], "target": 3}]))
    put("cd-negative.jsonl", jsonl(cd + [{"nums": [-1, 2], "target": 1}]))
    put("cd-scalars.jsonl", jsonl(["1", "2", "3"]))
    put("cd-all-same.jsonl", jsonl(cd[:1] * 8))
    put("cd-some-same.jsonl", jsonl(cd[:4] * 5))
    put("cd-1e308.jsonl", jsonl(cd + ['{"nums": [1, 2], "target": 1e308}']))
    put("cd-1e400.jsonl", jsonl(cd + ['{"nums": [1, 2], "target": 1e400}']))  # json reads inf
    put("cd-nan.jsonl", jsonl(cd + ['{"nums": [1, 2], "target": NaN}']))  # json reads NaN, not JSON
    put("cd-huge-int.jsonl", jsonl(cd + [{"nums": [1, 2], "target": 10**400}]))
    put("cd-huge-line.jsonl", jsonl(cd + [{"nums": [1, 2], "target": 3, "context": "x" * 5_000_000}]))
    put("cd-long-nums.jsonl", jsonl(cd + [{"nums": [1] * 100_000, "target": 3}]))
    put("cd-bom.jsonl", "\ufeff" + jsonl(cd))
    put("cd-crlf.jsonl", jsonl(cd).replace("\n", "\r\n"))
    put("cd-one.jsonl", jsonl(cd[:1]))
    put("cd-blank.jsonl", "\n  \n\n")
    put("cd-list.json", json.dumps([{"numbers": r["nums"], "target": str(r["target"])} for r in cd]))
    put("cd-list-comma.json", json.dumps(cd)[:-1] + ",]")
    # GSM8K: 8 distinct short rows.
    gs = [{"question": f"Tom has {a} apples and buys {b} more. How many now?",
           "answer": f"{a}+{b}={a + b} #### {a + b}"}
          for a, b in [(1, 2), (3, 4), (5, 6), (7, 8), (9, 1), (2, 7), (4, 4), (6, 3)]]
    put("gs-good.jsonl", jsonl(gs))
    put("gs-truncated.jsonl", jsonl(gs) + '{"question": "How many', )
    put("gs-bad-middle.jsonl", jsonl(gs[:4] + ["{question: 1}"] + gs[4:]))
    put("gs-fields.jsonl", jsonl([{"q": r["question"], "a": r["answer"]} for r in gs]))
    put("gs-answer-number.jsonl", jsonl(gs + [{"question": "Two and two?", "answer": 4}]))
    put("gs-question-list.jsonl", jsonl(gs + [{"question": ["Two", "and two?"], "answer": "#### 4"}]))
    put("gs-all-same.jsonl", jsonl(gs[:1] * 8))
    put("gs-empty-question.jsonl", jsonl(gs + [{"question": "", "answer": "#### 4"}]))
    put("gs-blank-question.jsonl", jsonl(gs + [{"question": "  \n ", "answer": "#### 4"}]))
    put("gs-100-digits.jsonl", jsonl(gs + [{"question": "A big one?", "answer": "#### " + "9" * 100}]))
    put("gs-no-hashes.jsonl", jsonl(gs + [{"question": "Two and two?", "answer": "4"}]))
    put("gs-huge-line.jsonl", jsonl(gs + [{"question": "Why? " * 4000, "answer": "#### 4"}]))
    put("gs-bom.jsonl", "\ufeff" + jsonl(gs))
    put("gs-crlf.jsonl", jsonl(gs).replace("\n", "\r\n"))
    # Models: the shipped one copied, then damaged.
    for name, damage in [("model-no-config", lambda d: os.remove(f"{d}/config.json")),
                         ("model-bad-config", lambda d: put(f"{d}/config.json", "{nope")),
                         ("model-list-config", lambda d: put(f"{d}/config.json", "[]")),
                         ("model-unknown-type", lambda d: put(f"{d}/config.json", '{"model_type": "nope"}')),
                         ("model-trunc-weights", lambda d: truncate(f"{d}/model.safetensors", 0.5)),
                         ("model-empty-weights", lambda d: truncate(f"{d}/model.safetensors", 0)),
                         ("model-no-weights", lambda d: os.remove(f"{d}/model.safetensors")),
                         ("model-no-tokenizer", lambda d: os.remove(f"{d}/tokenizer.json")),
                         ("model-copy", lambda d: None)]:
        shutil.copytree(TINY, os.path.join(root, name))
        damage(os.path.join(root, name))
    write_task_fixtures(root)


def write(path, content, mode="wb"):
    with open(path, mode) as f:
        f.write(content.encode() if isinstance(content, str) and "b" in mode else content)


def truncate(path, fraction):
    with open(path, "r+b") as f:
        f.truncate(int(os.path.getsize(path) * fraction))


def copy_base(damage=None):
    """A prepare step: the base run copied to the case's --out (as run "base"), then `damage(run_dir)`."""
    def prepare(case_dir, fx):
        run = shutil.copytree(fx.base(), os.path.join(case_dir, "out", "base"))
        if damage:
            damage(run)
    return prepare


# ---- the cases ----

TINY_ES = ["--steps", "1", "--population", "4", "--prompts-per-step", "4", "--eval-problems", "4",
           "--final-samples", "2", "--eval-every", "0"]
TINY_GRPO = ["--steps", "1", "--prompts", "4", "--group-size", "4", "--eval-problems", "4", "--final-samples", "2",
             "--eval-every", "0"]
SMALL_EVAL = ["--problems", "2", "--n", "2", "--k", "1"]
RESUME = ["--out", "{out}", "--run-name", "base", "--resume", *TINY_ES[2:], "--steps", "2"]
SWEEP_VALUES = {"0": "0", "-1": "-1", "nan": "nan", "inf": "inf", "-inf": "-inf", "1e308": "1e308",
                "10**30": str(10**30), "word": "abc", "empty": ""}
RUN = ("run", None)


def refuse(name, script, args, pattern=None, why="", **kw):
    return Case(name, script, args, "refuse", pattern, why, **kw)


def runs(name, script, args, why="", **kw):
    return Case(name, script, args, "run", None, why, **kw)


def note(name, script, args, pattern, why="", **kw):
    return Case(name, script, args, "note", pattern, why, **kw)


def without(args, flag):
    """`args` without `flag` and its value."""
    i = args.index(flag) if flag in args else None
    return args if i is None else args[:i] + args[i + 2:]


# (label, script, base arguments, {flag: (int or float, {value: what a value the flag accepts does})}). A value
# not listed is to be refused by an error line naming the flag; "huge" stands for 10**30 where the value itself is
# not listed (1e308, past float32's largest, is refused like any bad value unless listed).
# Note patterns look at stdout too (the recipe line shows each value), so they name the note's own words.
HUGE_DIVERGES = ("refuse", r"--lr/--alpha|grew|not finite", "a first step of that size blows the "
                 "weights up: the divergence guard should stop the run in one line")
SWEEP = [
    ("train", "train.py", TINY_ES, {
        "--steps": (int, {"huge": ("skip", None, "10**30 steps is what was asked: a run until it is killed")}),
        "--seed": (int, {"0": RUN}), "--save-every": (int, {}), "--keep-checkpoints": (int, {}),
        "--eval-every": (int, {"0": RUN}),  # 10**30 is past an int's range: refused; 2**31 - 1 means never
        "--eval-problems": (int, {}), "--eval-samples": (int, {}),
        "--final-samples": (int, {}), "--max-weight-growth": (float, {"inf": RUN, "huge": RUN}),
        "--train-problems": (int, {}),  # 10**30 distinct problems cannot exist: refuse, not draw forever
        "--max-new-tokens": (int, {}),  # 10**30 tokens cannot be generated: refuse, not allocate for ever
        "--numbers": (int, {}), "--low": (int, {"0": RUN}), "--high": (int, {})}),
    ("train es", "train.py", TINY_ES, {
        "--population": (int, {}), "--prompts-per-step": (int, {}), "--temperature": (float, {}),
        "--micro-batch": (int, {}),
        "--sigma": (float, {"huge": ("note", r"tied|error:.*--sigma", "every member's weights overflow: the members "
                                     "tie (a note says nothing was learned), or a refusal naming --sigma")}),
        "--alpha": (float, {"huge": ("note", r"--lr/--alpha|tied", HUGE_DIVERGES[2] + ", unless every "
                                     "member tied (then the tie note)")})}),
    ("train es lowrank", "train.py", [*TINY_ES, "--mode", "lowrank"], {"--rank": (int, {})}),
    ("train grpo", "train.py", ["--algo", "grpo", *TINY_GRPO], {
        "--prompts": (int, {}), "--group-size": (int, {}), "--temperature": (float, {}), "--micro-batch": (int, {}),
        "--lr": (float, {"huge": HUGE_DIVERGES}), "--epsilon-low": (float, {"0": RUN}),
        "--epsilon-high": (float, {"0": RUN}),
        "--beta": (float, {"0": RUN, "10**30": ("run", None, "the KL term and its gradient are 0 at the first step"),
                           "1e308": ("refuse", "--beta", "the KL weight overflows the loss: if it refuses, the line "
                                     "should name --beta, the flag to lower")}),
        "--max-grad-norm": (float, {"inf": RUN, "huge": RUN}), "--lora-rank": (int, {"0": RUN}),
        "--updates-per-batch": (int, {})}),
    ("train grpo lora", "train.py", ["--algo", "grpo", *TINY_GRPO, "--lora-rank", "2"], {
        "--lora-alpha": (float, {"huge": HUGE_DIVERGES[:2] + ("adapters scaled by alpha/rank overflow once "
                                                               "trained: the guard should stop it",)})}),
    ("train c3po", "train.py", ["--algo", "c3po", *TINY_GRPO], {
        "--lr": (float, {"huge": HUGE_DIVERGES}),
        "--ess": (float, {"10**30": RUN, "1e308": ("refuse", "--ess", "λ·h overflows: if it refuses, the line should "
                                                   "name --ess, the flag to lower")}),
        "--hess-init": (float, {"huge": HUGE_DIVERGES[:2] + ("--rescale-lr multiplies lr by h0 + δ",)}),
        "--beta1": (float, {"0": RUN}), "--beta2": (float, {"0": RUN}),
        "--weight-decay": (float, {"0": RUN, "huge": HUGE_DIVERGES[:2] + ("--rescale-lr multiplies lr by h0 + δ",)}),
        "--clip-radius": (float, {"inf": RUN, "huge": RUN}), "--chunks": (int, {}),
        "--ratio-truncate": (float, {"huge": RUN}), "--ratio-keep-min": (float, {"0": RUN}),
        "--ratio-keep-max": (float, {"inf": RUN, "huge": RUN})}),
    ("train m3po", "train.py", ["--algo", "m3po", *TINY_GRPO], {"--samples": (int, {})}),
    ("eval", "eval.py", SMALL_EVAL, {
        "--seed": (int, {"0": RUN}), "--problems": (int, {}), "--n": (int, {}), "--k": (int, {}),
        "--temperature": (float, {}), "--micro-batch": (int, {}),
        "--train-problems": (int, {}),  # as in train.py: 10**30 problems cannot be drawn
        "--max-new-tokens": (int, {}),  # as in train.py
        "--numbers": (int, {}), "--low": (int, {"0": RUN}), "--high": (int, {})}),
]


def sweep_cases():
    for label, script, base, flags in SWEEP:
        for flag, (kind, accepted) in flags.items():
            for value_name, value in SWEEP_VALUES.items():
                huge = value_name == "10**30"  # 1e308 is past float32's largest: refused like any bad value
                expected = accepted.get(value_name) or (accepted.get("huge") if huge else None)
                kind_, pattern, *why = expected or ("refuse", re.escape(flag))
                if kind_ == "skip":
                    continue
                yield Case(f"{label}: {flag} {value_name}", script, [*without(base, flag), flag, value], kind_,
                           pattern, why[0] if why else "")


def model_cases(script, small):
    for what, model, why in [
            ("nonexistent absolute path", "/nonexistent/hostile-model", ""),
            ("./nope", "./nope", ""), ("~/nope", "~/hostile-nope", ""),
            ("a bare name, offline", "hostile-nope", "read as a hub id: offline, it cannot be fetched"),
            ("a hub id, offline", "hostile-owner/hostile-model", ""),
            ("empty string", "", "an empty path names no model; taking the default would train another model "
                                 "than the user meant to name"),
            ("an empty file", "{fx}/empty", ""), ("a text file", "{fx}/text", ""),
            ("a truncated .gguf", "{fx}/trunc.gguf", ""), ("an empty .gguf", "{fx}/empty.gguf", ""),
            ("a directory without files", "{fx}/a-dir", ""), ("no config.json", "{fx}/model-no-config", ""),
            ("malformed config.json", "{fx}/model-bad-config", ""),
            ("config.json a list", "{fx}/model-list-config", ""),
            ("unknown model_type", "{fx}/model-unknown-type", ""),
            ("truncated safetensors", "{fx}/model-trunc-weights", ""),
            ("empty safetensors", "{fx}/model-empty-weights", ""),
            ("no safetensors", "{fx}/model-no-weights", ""), ("no tokenizer.json", "{fx}/model-no-tokenizer", "")]:
        yield refuse(f"{script[:-3]} model: {what}", script, [*small, "--model", model], "model", why)


def data_cases():
    cd = ["--task", "countdown", *TINY_ES, "--data"]
    gs = ["--task", "gsm8k", *TINY_ES, "--max-new-tokens", "8", "--data"]
    for prefix, args in (("cd", cd), ("gs", gs)):
        task = "countdown" if prefix == "cd" else "gsm8k"
        for what, file in [("missing", "{fx}/no-such-file.jsonl"), ("empty", "{fx}/empty"),
                           ("a directory", "{fx}/a-dir"), ("binary garbage", "{fx}/binary"),
                           ("truncated last line", f"{{fx}}/{prefix}-truncated.jsonl"),
                           ("bad JSON in the middle", f"{{fx}}/{prefix}-bad-middle.jsonl"),
                           ("wrong field names", f"{{fx}}/{prefix}-fields.jsonl")]:
            yield refuse(f"data {task}: {what}", "train.py", [*args, file], re.escape(os.path.basename(file)),
                         "a cut last line is a damaged file: refuse, naming the line" if "truncated" in what else "")
        yield note(f"data {task}: every row the same", "train.py", [*args, f"{{fx}}/{prefix}-all-same.jsonl"],
                   "merged", "one problem is left: a refusal is right, and it should say rows were merged")
        yield runs(f"data {task}: UTF-8 BOM", "train.py", [*args, f"{{fx}}/{prefix}-bom.jsonl"],
                   "editors on Windows write a BOM nobody sees; JSON (RFC 8259) lets a reader ignore it")
        yield runs(f"data {task}: CRLF line ends", "train.py", [*args, f"{{fx}}/{prefix}-crlf.jsonl"],
                   "a file written on Windows: same rows")
        yield refuse(f"data {task}: --eval-data empty", "train.py", [*args, f"{{fx}}/{prefix}-good.jsonl",
                                                                     "--eval-data", "{fx}/empty"], "--eval-data")
    for what, file, expect in [
            ("numbers as strings", "string-numbers.jsonl", "numbers"), ("nested lists", "nested.jsonl", "numbers"),
            ("target a list", "target-list.jsonl", "target"), ("a boolean number", "bool.jsonl", "numbers"),
            ("negative numbers", "negative.jsonl", "numbers"), ("rows that are not objects", "scalars.jsonl", "object"),
            ("target 1e308", "1e308.jsonl", "target"), ("target 1e400 (inf)", "1e400.jsonl", "target"),
            ("target NaN", "nan.jsonl", "target"), ("100000 numbers in a row", "long-nums.jsonl", "numbers"),
            ("one row", "one.jsonl", "at least 2"), ("only blank lines", "blank.jsonl", "0 problem"),
            ("JSON list with a trailing comma", "list-comma.json", "JSON")]:
        yield refuse(f"data countdown: {what}", "train.py", [*cd, f"{{fx}}/cd-{file}"], expect)
    yield note("data countdown: many rows the same", "train.py", [*cd, "{fx}/cd-some-same.jsonl"], "merged")
    yield note("data countdown: a 400-digit integer target", "train.py", [*cd, "{fx}/cd-huge-int.jsonl"],
               "no solution", "an integer target may be large; it has no solution, which the project notes")
    yield runs("data countdown: a 5 MB line (unused context)", "train.py", [*cd, "{fx}/cd-huge-line.jsonl"],
               "the terse prompt does not read the context")
    yield runs("data countdown: a JSON list (Qiu's keys)", "train.py", [*cd, "{fx}/cd-list.json"])
    for what, file, expect in [
            ("answer a number", "answer-number", "answer"), ("question a list", "question-list", "question"),
            ("empty question", "empty-question", "question"), ("blank question", "blank-question", "question"),
            ("100-digit answer", "100-digits", "answer"), ("answer without ####", "no-hashes", "####")]:
        yield refuse(f"data gsm8k: {what}", "train.py", [*gs, f"{{fx}}/gs-{file}.jsonl"], expect)
    yield note("data gsm8k: a 20,000-character question", "train.py", [*gs, "{fx}/gs-huge-line.jsonl"],
               r"(note|warning|error):.*(position|too long|longer)", "a prompt 150 times the model's 128 "
               "positions: the project notes --max-new-tokens past them, and should note (or refuse) prompts past "
               "them too")
    yield refuse("data arithmetic: --data given", "train.py", [*TINY_ES, "--data", "{fx}/cd-good.jsonl"], "--data")
    yield runs("eval gsm8k: the shipped test split", "eval.py", [*SMALL_EVAL, "--task", "gsm8k", "--eval-data",
                                                                GSM8K_TEST, "--max-new-tokens", "8"])


def resume_cases():
    yield note("resume: no run", "train.py", RESUME, "note:.*no checkpoint",
               why="nothing to continue: start from step 0 and say so (or refuse)")
    yield refuse("resume: without --resume", "train.py", [a for a in RESUME if a != "--resume"], "--resume",
                 prepare=copy_base())
    for flags, named in [(["--sigma", "0.01"], "--sigma"), (["--seed", "1"], "--seed"),
                         (["--task", "countdown"], "--task"), (["--population", "6"], "--population"),
                         (["--model", "{fx}/model-copy"], "--model")]:
        yield refuse(f"resume: {flags[0]} changed", "train.py", [*RESUME, *flags], named, prepare=copy_base())
    yield refuse("resume: --algo grpo changed", "train.py", ["--out", "{out}", "--run-name", "base", "--resume",
                                                             "--algo", "grpo", *TINY_GRPO[2:], "--steps", "2"],
                 "--algo", prepare=copy_base())
    yield runs("resume: --recipe tiny (its own)", "train.py", [*RESUME, "--recipe", "tiny"], prepare=copy_base())
    yield runs("resume: --steps 1 (done already)", "train.py", [*RESUME, "--steps", "1"],
               "nothing left to train: evaluate and exit, as a finished run", prepare=copy_base())
    state = "step-000001/training_state.pt"
    for what, damage in [
            ("truncated training state", lambda d: truncate(f"{d}/{state}", 0.5)),
            ("empty training state", lambda d: truncate(f"{d}/{state}", 0)),
            ("garbage training state", lambda d: write(f"{d}/{state}", b"\x80\x04garbage" * 99)),
            ("truncated checkpoint weights", lambda d: truncate(f"{d}/step-000001/model.safetensors", 0.5)),
            ("checkpoint directory deleted", lambda d: shutil.rmtree(f"{d}/step-000001")),
            ("config.json deleted", lambda d: os.remove(f"{d}/config.json")),
            ("config.json garbage", lambda d: write(f"{d}/config.json", "{nope")),
            ("log.jsonl a directory", lambda d: (os.remove(f"{d}/log.jsonl"), os.mkdir(f"{d}/log.jsonl")))]:
        yield refuse(f"resume: {what}", "train.py", RESUME, "base", prepare=copy_base(damage))
    yield note("resume: log.jsonl deleted", "train.py", RESUME, "is gone",
               prepare=copy_base(lambda d: os.remove(f"{d}/log.jsonl")))
    yield note("resume: log.jsonl with garbage", "train.py", RESUME, "not a log row",
               prepare=copy_base(lambda d: write(f"{d}/log.jsonl", b"\x00\xff garbage\n", "ab")))
    yield note("resume: latest garbage", "train.py", RESUME, "does not name",
               "the step directory is whole: resume from it and warn",
               prepare=copy_base(lambda d: write(f"{d}/latest", "../../etc")))
    yield refuse("resume: the run directory a file", "train.py", RESUME, None,
                 prepare=lambda case_dir, fx: (os.makedirs(f"{case_dir}/out"), write(f"{case_dir}/out/base", "")))


def other_cases():
    es, grpo = TINY_ES, ["--algo", "grpo", *TINY_GRPO]
    # Wrong choices, unknown and repeated flags: each line names the flag.
    for flag, value, args in [("--algo", "nope", es), ("--task", "nope", es), ("--dtype", "float8", es),
                              ("--normalize", "nope", es), ("--mode", "nope", es), ("--master-device", "tpu", es),
                              ("--recipe", "nope", es), ("--prompt-style", "nope", es), ("--reward", "nope", es),
                              ("--scale-rewards", "nope", grpo), ("--loss-aggregation", "nope", grpo),
                              ("--optim", "sgd", grpo), ("--prompt-style", "qiu", es), ("--reward", "qiu", es),
                              ("--params", "(", es), ("--params", "no_parameter_has_this_name", es),
                              ("--recipe", "qiu2025", grpo), ("--lora-targets", "nope", [*grpo, "--lora-rank", "2"])]:
        yield refuse(f"train: {flag} {value}", "train.py", [*args, flag, value], re.escape(flag))
    for flag, value in [("--task", "nope"), ("--dtype", "nope"), ("--prompt-style", "nope"), ("--reward", "nope")]:
        yield refuse(f"eval: {flag} {value}", "eval.py", [*SMALL_EVAL, flag, value], re.escape(flag))
    yield refuse("train: unknown flag --nope", "train.py", [*es, "--nope"], "--nope")
    yield refuse("train: --lr under es", "train.py", [*es, "--lr", "0.1"], "--lr", "ES has --alpha, not --lr")
    yield refuse("train: abbreviated --alph", "train.py", [*es, "--alph", "0.1"], "--alph")
    yield refuse("train: a stray word", "train.py", [*es, "grpo"], "grpo")
    yield refuse("train: -x", "train.py", [*es, "-x"], "-x")
    yield refuse("eval: --steps (a train.py flag)", "eval.py", [*SMALL_EVAL, "--steps", "5"], "--steps")
    yield refuse("train es: --alpha=-inf", "train.py", [*es, "--alpha=-inf"], "--alpha")
    yield refuse("train: --alpha with no value", "train.py", [*es, "--alpha"], "--alpha")
    yield runs("train: --seed 0 twice", "train.py", [*es, "--seed", "0", "--seed", "0"])
    yield note("train: --population 4 then 6", "train.py", [*without(es, "--population"), "--population", "4",
                                                            "--population", "6"], r"--population 6\b",
               "the last value wins, as in every argparse or getopt tool (a script's flags can be overridden by "
               "appending); the recipe line must show 6")
    yield runs("eval: --k 1 1", "eval.py", [*SMALL_EVAL, "--k", "1", "1"])
    yield note("eval: --problems 1000000 of 500", "eval.py", ["--n", "1", "--k", "1", "--problems", "1000000"],
               r"\b500 held-out problems|(note|warning):.*500|error:.*--problems", "only 500 held-out problems exist: "
               "the result line says it used 500 (a note, or a refusal, would do too)")
    yield runs("train: --params '' (matches all)", "train.py", [*es, "--params", ""])
    yield runs("train: --dtype float16 on a CPU", "train.py", [*es, "--dtype", "float16"])
    yield runs("train grpo: --dtype bfloat16", "train.py", [*grpo, "--dtype", "bfloat16"])
    yield runs("train: --load-in-8bit on a CPU", "train.py", [*es, "--load-in-8bit"],
               "README: ES perturbs 8-bit weights directly; bitsandbytes runs on a CPU")
    yield refuse("train: --max-new-tokens 1", "train.py", [*es, "--max-new-tokens", "1"], "--max-new-tokens 1",
                 "no answer fits in one token: every completion would be cut off and score 0")
    yield runs("train: --train-problems 1", "train.py", [*es, "--train-problems", "1"])
    yield refuse("train: --task countdown --numbers 7", "train.py", [*es, "--task", "countdown", "--numbers", "7"],
                 "--numbers")
    yield refuse("train: --low 5 --high 2", "train.py", [*es, "--low", "5", "--high", "2"], "--low")
    yield refuse("train: --numbers 50 --high 999999999999", "train.py", [*es, "--numbers", "50", "--high",
                                                                          "999999999999"], "--numbers")
    yield refuse("train: --eval-data for arithmetic", "train.py", [*es, "--eval-data", "{fx}/cd-good.jsonl"],
                 "--eval-data")
    yield refuse("train: --population 3 antithetic", "train.py", [*without(es, "--population"), "--population", "3"],
                 "--population")
    yield refuse("train c3po: --chunks 3 of --group-size 4", "train.py", ["--algo", "c3po", *TINY_GRPO,
                                                                          "--chunks", "3"], "--chunks")
    # Where output goes.
    yield refuse("train: --out under a regular file", "train.py", [*es, "--out", "{fx}/text/sub"], "--out")
    yield refuse("train: --out /dev/null", "train.py", [*es, "--out", "/dev/null"], "--out")
    yield refuse("train: --out ''", "train.py", [*es, "--out", ""], "--out",
                 "an empty path names no directory: writing the run into the working directory is a guess")
    yield refuse("train: --out unwritable", "train.py", [*es, "--out", "{fx}/read-only/out"], "--out",
                 prepare=lambda case_dir, fx: (os.makedirs(f"{fx.root}/read-only", exist_ok=True),
                                               os.chmod(f"{fx.root}/read-only", 0o500)),
                 skip="root writes anyway" if os.geteuid() == 0 else None)
    yield runs("train: --run-name a/b", "train.py", [*es, "--run-name", "a/b"],
               "a run inside a folder of runs: a sub-directory of --out, as the flag says")
    for name in ("..", "../x", "a/../../b", "/abs", ""):
        yield refuse(f"train: --run-name '{name}'", "train.py", [*es, "--run-name", name], "--run-name")
    yield refuse("eval: --out under a regular file", "eval.py", [*SMALL_EVAL, "--out", "{fx}/text/x.json"], "--out")
    yield refuse("eval: --out a directory", "eval.py", [*SMALL_EVAL, "--out", "{fx}/a-dir"], "--out")
    yield refuse("eval: --out ''", "eval.py", [*SMALL_EVAL, "--out", ""], "--out",
                 "an empty file name: the metrics the user asked to keep would be written nowhere")
    yield runs("eval: --model a checkpoint", "eval.py", [*SMALL_EVAL, "--model", "{out}/base/step-000001"],
               prepare=copy_base())
    yield refuse("eval: --model a run directory", "eval.py", [*SMALL_EVAL, "--model", "{out}/base"],
                 prepare=copy_base())
    # The environment, and flags that do nothing here.
    for script, args in (("train.py", es), ("eval.py", SMALL_EVAL)):
        for value in ("abc", "0", "", "-2", "1.5"):
            yield note(f"{script[:-3]}: OMP_NUM_THREADS='{value}'", script, args, "OMP_NUM_THREADS",
                       "OpenMP ignores it: the run would take every core; a note or a refusal",
                       env={"OMP_NUM_THREADS": value})
        yield note(f"{script[:-3]}: --compile-decoding on a CPU", script, [*args, "--compile-decoding"],
                   "does nothing here")
    yield refuse("train: RANK=0 without torchrun", "train.py", es, "RANK", env={"RANK": "0"})
    yield note("train es: every member ties (--sigma 1e30)", "train.py", [*es, "--sigma", "1e30"], "tied")


def cases():
    from bench.hostile_run_cases import run_cases  # which builds on this module's helpers

    return [*sweep_cases(), *model_cases("train.py", TINY_ES), *model_cases("eval.py", SMALL_EVAL), *data_cases(),
            *resume_cases(), *other_cases(), *run_cases(), *task_cases(refuse, runs, TINY_ES, SMALL_EVAL, RESUME)]


