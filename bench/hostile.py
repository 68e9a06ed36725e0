"""train.py and eval.py against a hostile new user: bad, extreme and damaged input, each case in a process.

    python -m bench.hostile                              # every case (~15 min on 2 cores)
    python -m bench.hostile --only 'data|resume'         # the cases whose name matches
    python -m bench.hostile --list                       # the cases, what each expects and why
    python -m bench.hostile --json hostile.json --strict # results as JSON; exit 1 on any bad class

Each case is a command line (and maybe an environment, or a prepared run directory) with what a good tool
does with it: `refuse` (exit status non-zero, stderr ending in exactly one "error:" line, no traceback; for
most cases that line must also match a pattern, e.g. name the flag), `run` (exit 0), or `note` (run or
refuse, but some line must match a pattern: a note that rows were merged). What happened is classed:

    error       a refuse-case refused in one clean line (the line is shown)
    reasonable  a run-case exited 0, or a note-case printed its note (if still running at the timeout: a slow
                run the user asked for, said so)
    traceback   "Traceback (most recent call last)" on stderr, whatever was expected
    silent      exit 0 where a refusal or a note was expected, and none came
    hang        still running after --timeout seconds (killed)
    wrong       any other mismatch: a refusal without its one line, a run-case refused, ...

Printed: one row per case (name, class, seconds, the error, note or last line), then the count per class.

Cost: starting python with torch takes about 3 s, so most of the ~500 flag-sweep cases (every numeric flag
at 0, -1, nan, inf, -inf, 1e308, 10**30, a word, an empty string) would take half an hour in their own
processes. Those whose fate is decided while the script parses its flags (argparse's errors, a recipe or
algorithm refused in parse_args) are decided in one shared process instead, calling the script's own
parse_args as its main() does first: nothing else has run at that point, so its exit status and stderr are
those of the script (marked * in the table). A command line that parse_args accepts, or that raises
anything else there, runs in its own process like every other case. --no-batch runs all of them alone.
Each case runs with OMP_NUM_THREADS=1, HF_HUB_OFFLINE=1 and its own empty working directory, one at a time.
"""
import argparse
import contextlib
import io
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

from bench.hostile_cases import ROOT, TINY_ES, cases, write_fixtures
from minies.config import add_arguments, from_args, option

TRACEBACK = "Traceback (most recent call last)"
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
BAD_CLASSES = ("traceback", "silent", "hang", "wrong")


@dataclass
class HostileConfig:
    only: str = option(None, "run only the cases whose name matches this regular expression", check="regex")
    list: bool = option(False, "list the cases with what each expects and why, and exit")
    timeout: float = option(120.0, "seconds a case may run before it is killed and classed a hang",
                            check="positive")
    json: str = option(None, "also write the results to this JSON file")
    strict: bool = option(False, "exit 1 when any case is classed traceback, silent, hang or wrong")
    batch: bool = option(True, "decide the cases that end while flags are parsed in one shared process "
                         "(module docstring); --no-batch: every case in its own process")


# ---- what happened -> its class ----

def classify(rc, stdout, stderr, expect, pattern=None, timed_out=False):
    """(class, the line that tells) of a finished (or killed: `timed_out`) case; see the module docstring."""
    stderr = ANSI.sub("", stderr)  # tqdm's cursor moves
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    if timed_out:  # a note-case that said what it had to is a slow run the user asked for, not a hang
        said = expect == "note" and next((line for line in lines if re.search(pattern, line)), None)
        return ("reasonable", said + " (still running at the timeout)") if said else ("hang", last)
    if TRACEBACK in stderr:
        # The exception's own line: the first unindented one after the last traceback's frames (torch appends a
        # C++ backtrace to some messages, so the last line is not it).
        after = stderr[stderr.rindex(TRACEBACK):].splitlines()[1:]
        return "traceback", next((line for line in after if line.strip() and not line[0].isspace()), last)
    clean = rc != 0 and last.startswith("error:") and sum(line.startswith("error:") for line in lines) == 1
    told = next((line for line in reversed(lines) if line.startswith(("note:", "warning:", "error:"))),
                next((line.strip() for line in reversed(stdout.splitlines()) if line.strip()), ""))
    if expect == "refuse":
        if rc == 0:
            return "silent", told
        return ("error" if clean and (pattern is None or re.search(pattern, last)) else "wrong"), last
    if expect == "run":
        return ("reasonable", told) if rc == 0 else ("wrong", last)
    # The last line that matches: a refusal's own line rather than a library's warning before it.
    found = next((line.strip() for line in reversed((stdout + "\n" + stderr).splitlines()) if re.search(pattern, line)),
                 None)
    if found is not None and (rc == 0 or clean):
        return "reasonable", found
    return ("silent", told) if rc == 0 else ("wrong", last)


# ---- running a case ----

def script_env(fx_root, extra=None):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1",
               OMP_NUM_THREADS="1", MINIES_CACHE=os.path.join(fx_root, "cache"))  # GGUF conversions land there
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):  # torchrun's: a case sets its own
        env.pop(name, None)
    return {**env, **(extra or {})}


def command_args(case, fx_root, case_dir):
    values = {"{fx}": fx_root, "{out}": os.path.join(case_dir, "out"), "{repo}": ROOT}
    args = list(case.args) + (["--out", "{out}"] if case.script == "train.py" and "--out" not in case.args else [])
    for key, value in values.items():
        args = [a.replace(key, value) for a in args]
    return args


def run_process(script, args, env, cwd, timeout):
    """(exit status, stdout, stderr, seconds, timed out) of `python script args` in a session of its own, so that
    a hang is killed with everything it started."""
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, script), *args], cwd=cwd, env=env, text=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, errors="replace")
    try:
        out, err = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        timed_out = True
    return proc.returncode, out, err, time.perf_counter() - started, timed_out


def run_case(case, fx, case_dir, timeout):
    """run_process's answer for `case`, run in `case_dir` (which exists) after its prepare step."""
    if case.prepare:
        case.prepare(case_dir, fx)
    return run_process(case.script, command_args(case, fx.root, case_dir), script_env(fx.root, case.env), case_dir,
                       timeout)


def parse_worker():
    """The shared process (module docstring): for each [script, args] line on stdin, one JSON line on stdout:
    [exit status, stderr] where the script's parse_args decides the case, else null."""
    sys.path.insert(0, ROOT)
    import importlib

    from minies import UserError
    scripts = {name: importlib.import_module(name[:-3]) for name in ("train.py", "eval.py")}
    for line in sys.stdin:
        script, args = json.loads(line)
        err, rc = io.StringIO(), None
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                scripts[script].parse_args(args)
            except SystemExit as e:  # argparse's error line (or --help): the script ends there too
                rc = e.code if isinstance(e.code, int) else 1
                if isinstance(e.code, str):
                    print(e.code, file=sys.stderr)
            except UserError as e:  # what run_script prints for it
                print(f"error: {e}", file=sys.stderr)
                rc = 2
            except Exception:  # would be a traceback: left to its own process, which shows it whole
                pass
        print(json.dumps(None if rc is None else [rc, err.getvalue()]), flush=True)


def screen(batchable, fx_root, cfg):
    """{case index: (exit status, stderr)} for the cases the shared process decides."""
    work = tempfile.mkdtemp(dir=fx_root)
    proc = subprocess.Popen([sys.executable, "-c", "from bench.hostile import parse_worker; parse_worker()"],
                            cwd=work, env={**script_env(fx_root), "PYTHONPATH": ROOT}, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    decided = {}
    try:
        for index, args in batchable:
            proc.stdin.write(json.dumps(args) + "\n")
            proc.stdin.flush()
            answer = json.loads(lines.get(timeout=cfg.timeout + 30))  # the first waits for the imports
            if answer is not None:
                decided[index] = tuple(answer)
    except (queue.Empty, BrokenPipeError, ValueError):
        pass  # the rest run in their own processes
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return decided


def sweep(cases, fx, cfg):
    case_dirs = [os.path.join(fx.root, "cases", str(i)) for i in range(len(cases))]
    batchable = [(i, [c.script, command_args(c, fx.root, case_dirs[i])]) for i, c in enumerate(cases)
                 if cfg.batch and not c.env and c.prepare is None and c.skip is None]
    decided = screen(batchable, fx.root, cfg) if batchable else {}
    results = []
    print(f"{'case':<58} {'class':<10} {'s':>6}  line", flush=True)
    for i, case in enumerate(cases):
        if case.skip:
            print(f"{case.name:<58} {'skipped':<10} {'':>6}  {case.skip}", flush=True)
            continue
        os.makedirs(case_dirs[i])
        args = command_args(case, fx.root, case_dirs[i])
        if i in decided:
            (rc, err), out, seconds, timed_out, batched = decided[i], "", 0.0, False, True
        else:
            rc, out, err, seconds, timed_out = run_case(case, fx, case_dirs[i], cfg.timeout)
            batched = False
        cls, line = classify(rc, out, err, case.expect, case.pattern, timed_out)
        print(f"{case.name[:58]:<58} {cls:<10} {seconds:6.1f}{'*' if batched else ' '} {line[:100]}", flush=True)
        results.append({"name": case.name, "script": case.script, "args": args, "env": case.env,
                        "expect": case.expect, "pattern": case.pattern, "why": case.why, "class": cls,
                        "seconds": round(seconds, 2), "line": line, "exit_status": rc, "batched": batched,
                        "stderr_tail": err[-2000:]})
        shutil.rmtree(case_dirs[i], ignore_errors=True)
    return results


# ---- fixtures: bad files, damaged models, a run to resume ----

class Fixtures:
    """Every file a case points at, written under `root` (one temporary directory); the run that resume cases
    copy is trained on first use."""

    def __init__(self, root):
        self.root, self._base = root, None
        write_fixtures(root)

    def base(self):
        """A 1-step ES run of the shipped model saved at step 1: <root>/base-out/base."""
        if self._base is None:
            out = os.path.join(self.root, "base-out")
            rc, _, err, _, _ = run_process("train.py", [*TINY_ES, "--save-every", "1", "--run-name", "base",
                                                        "--out", out], script_env(self.root), self.root, 600)
            if rc:
                sys.exit(f"error: the run the resume cases continue failed:\n{err[-2000:]}")
            self._base = os.path.join(out, "base")
        return self._base



def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, HostileConfig, "bench.hostile")
    cfg = from_args(HostileConfig, parser.parse_args(argv))
    selected = [c for c in cases() if cfg.only is None or re.search(cfg.only, c.name)]
    if cfg.list:
        for c in selected:
            print(f"{c.name:<58} {c.expect:<6} {c.pattern or '':<30} {c.why}")
        return
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="minies-hostile-") as root:
        results = sweep(selected, Fixtures(root), cfg)
        for path in (os.path.join(root, "read-only"),):  # let the cleanup delete what a case made read-only
            if os.path.isdir(path):
                os.chmod(path, 0o700)
    counts = {cls: sum(r["class"] == cls for r in results) for cls in ("error", "reasonable", *BAD_CLASSES)}
    print(" ".join(f"{cls} {n}" for cls, n in counts.items()) + f" total {len(results)}"
          f" ({len(selected) - len(results)} skipped; {time.time() - started:.0f} s; * decided while parsing flags)")
    if cfg.json:
        with open(cfg.json, "w") as f:
            json.dump(results, f, indent=1)
    sys.exit(1 if cfg.strict and any(counts[cls] for cls in BAD_CLASSES) else 0)


if __name__ == "__main__":
    main()
