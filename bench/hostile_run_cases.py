"""The cases of bench.hostile about a run as a whole (bench/hostile_cases.py holds the rest): two commands on one
run directory, a lock left by a killed process, a --resume whose data file or settings changed (or are only
spelled another way), problems whose answers cannot fit --max-new-tokens, --train-problems past the problems
that exist, --system messages no model can read, and eval.py --out aimed at its own data."""
import os
import shutil
import signal
import subprocess
import sys

from bench.hostile_cases import GSM8K_TEST, RESUME, ROOT, SMALL_EVAL, TINY_ES, copy_base, note, refuse, runs

QIU_MODEL = os.path.join(ROOT, "minies", "assets", "tiny-qiu")
# A process that holds a run directory's lock as train.py does, until the case's directory is deleted.
HOLD = ("import os, sys, time; from minies.runtime.run_lock import run_directory_lock\n"
        "with run_directory_lock(sys.argv[1]):\n    print('held', flush=True)\n"
        "    end = time.time() + 600\n    while os.path.exists(sys.argv[1]) and time.time() < end: time.sleep(0.2)")


def hold_lock(kill=False):
    """A prepare step: a process holds {out}/base's lock (and is killed with -9 when `kill`: it leaves its file)."""
    def prepare(case_dir, fx):
        proc = subprocess.Popen([sys.executable, "-c", HOLD, os.path.join(case_dir, "out", "base")], cwd=ROOT,
                                stdout=subprocess.PIPE, text=True, start_new_session=True)
        proc.stdout.readline()
        if kill:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    return prepare


def countdown_run(change_data):
    """A prepare step: a 1-step Countdown run on a copy of a data file, saved as {out}/base; then
    `change_data(path)`."""
    def prepare(case_dir, fx):
        from bench.hostile import run_process, script_env  # the runner of the cases, which imports this module

        data = os.path.join(case_dir, "rows.jsonl")
        shutil.copy(os.path.join(fx.root, "cd-good.jsonl"), data)
        rc, _, err, _, _ = run_process("train.py", [*DATA_RUN, "--out", os.path.join(case_dir, "out")],
                                       script_env(fx.root), case_dir, 300)
        if rc:
            sys.exit(f"error: the Countdown run a resume case continues failed:\n{err[-2000:]}")
        change_data(data)
    return prepare


DATA_RUN = ["--task", "countdown", "--data", "rows.jsonl", "--run-name", "base", *TINY_ES, "--save-every", "1"]


def swap_two_rows(path):
    with open(path) as f:
        lines = f.readlines()
    with open(path, "w") as f:
        f.writelines([lines[1], lines[0], *lines[2:]])


def run_cases():
    es = TINY_ES
    yield refuse("run dir: another process holds it", "train.py", [*es, "--out", "{out}", "--run-name", "base"],
                 r"in use by pid \d+", "two commands writing one run mix their logs and checkpoints",
                 prepare=hold_lock())
    yield note("run dir: a lock left by a process killed with -9", "train.py",
               [*es, "--out", "{out}", "--run-name", "base"], "no longer running.*taking it over",
               "the kernel dropped the dead process's lock: the run goes on, and says whose file it took over",
               prepare=hold_lock(kill=True))
    yield refuse("resume: the --data file's content changed", "train.py", [*DATA_RUN, "--out", "{out}", "--resume",
                                                                           "--steps", "2"],
                 r"--data rows.jsonl changed since the run read it", prepare=countdown_run(swap_two_rows))
    yield runs("resume: the --data file unchanged", "train.py", [*DATA_RUN, "--out", "{out}", "--resume", "--steps",
                                                                 "2"], prepare=countdown_run(lambda path: None))
    yield runs("resume: the default difficulty written out", "train.py", [*RESUME, "--numbers", "2", "--low", "0",
                                                                           "--high", "99"],
               "the values the run used, spelled out", prepare=copy_base())
    yield refuse("resume: --high 50 changed", "train.py", [*RESUME, "--high", "50"], r"--high 50 \(the run has 99\)",
                 "the recorded value, resolved: never 'None'", prepare=copy_base())
    yield refuse("train: 12-digit answers past --max-new-tokens", "train.py",
                 [*es, "--numbers", "1", "--low", "100000000000", "--high", "999999999999"],
                 r"14 tokens.*--max-new-tokens 10", "no completion can hold the answer: hours at reward 0")
    yield refuse("train: countdown, 6 numbers of 12 digits", "train.py",
                 [*es, "--task", "countdown", "--numbers", "6", "--high", "999999999999"], r"--max-new-tokens 32")
    yield refuse("train: --train-problems 1000000 of 1000 values", "train.py",
                 [*es, "--numbers", "1", "--low", "0", "--high", "999", "--train-problems", "1000000"],
                 r"--train-problems 1000000: .*only 500", "1,000 problems exist, 500 of them held out")
    yield refuse("data gsm8k: --train-problems past the rows", "train.py",
                 [*es, "--task", "gsm8k", "--data", "{fx}/gs-good.jsonl", "--eval-data", GSM8K_TEST,
                  "--train-problems", "1000"], r"--train-problems 1000: .*only 8")
    for script, args in (("train.py", es), ("eval.py", SMALL_EVAL)):
        yield refuse(f"{script[:-3]}: --system not UTF-8", script, [*args, "--system", "\udcff\udcfe be brief"],
                     "--system.*UTF-8", "bytes that are no text: no tokenizer reads them")
    yield refuse("train: --system with --no-chat-template", "train.py", [*es, "--system", "Be brief.",
                                                                         "--no-chat-template"], "--system",
                 "raw prompts have no system message: the text would be dropped")
    yield refuse("train: --system of 100 KB", "train.py", [*es, "--system", "x" * 100_000], "--system.*positions",
                 "every prompt runs past the model's 128 positions because of the system message")
    yield refuse("eval: --system, a tokenizer without a chat template", "eval.py",
                 [*SMALL_EVAL, "--model", QIU_MODEL, "--prompt-style", "tinyzero", "--system", "Be brief."],
                 "--system.*no chat template")
    yield runs("train: a model's recipe for another --task", "train.py",
               [*es, "--model", QIU_MODEL, "--task", "arithmetic", "--max-new-tokens", "10"],
               "the Qiu-format model's recipe asks Countdown in the qiu style: with arithmetic, the style is not "
               "imposed (it failed naming --prompt-style qiu, a flag nobody typed)")
    yield refuse("eval: --out the --data file", "eval.py", [*SMALL_EVAL, "--task", "countdown", "--data",
                                                            "{out}.jsonl", "--out", "{out}.jsonl"],
                 r"--out .* is the --data file", "the metrics would overwrite the problems",
                 prepare=lambda case_dir, fx: shutil.copy(os.path.join(fx.root, "cd-good.jsonl"),
                                                          os.path.join(case_dir, "out.jsonl")))
    yield runs("eval: --show-prompt --out F", "eval.py", ["--show-prompt", "--out", "{out}.json"],
               "writes the prompt and its length to F")
