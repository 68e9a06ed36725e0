"""One process per run directory (minies/runtime/run_lock.py): a second command is refused in one line naming
the first; the lock of a process killed with kill -9 is taken over, and the next run goes on."""
import json
import os
import signal
import subprocess
import sys

import pytest

from conftest import REPO, assert_one_line_error, run_in_process
from minies import UserError
from minies.runtime.run_lock import LOCK_FILE, run_directory_lock

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["--population", 2, "--prompts-per-step", 2, "--eval-problems", 2, "--final-samples", 1, "--eval-every", 0]
# A process that holds a run directory's lock as train.py does, then waits to be killed.
HOLD = ("import sys, time; from minies.runtime.run_lock import run_directory_lock\n"
        "with run_directory_lock(sys.argv[1]):\n    print('held', flush=True); time.sleep(60)")


def test_a_held_run_directory_is_refused_and_a_killed_holders_lock_taken_over(tmp_path, model_dir, capsys):
    out, run_dir = tmp_path / "out", tmp_path / "out" / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        train = ["--model", model_dir, "--steps", 1, "--out", out, "--run-name", "run", *TINY]
        code, message = run_in_process("train.py", *train)
        last = assert_one_line_error("second run", code, capsys.readouterr().err + message)
        assert f"is in use by pid {holder.pid} on " in last and "--run-name NAME" in last
        assert os.listdir(run_dir) == [LOCK_FILE]  # nothing of the second run
        with pytest.raises(UserError, match=f"pid {holder.pid}"):
            with run_directory_lock(run_dir):
                pass
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        assert json.loads((run_dir / LOCK_FILE).read_text())["pid"] == holder.pid  # left behind by the kill
        code, message = run_in_process("train.py", *train)
        err = capsys.readouterr().err
        assert code == 0, err + message
        assert f"left by pid {holder.pid}" in err and "taking it over" in err
        assert (run_dir / "summary.json").exists() and not (run_dir / LOCK_FILE).exists()
    finally:
        holder.kill()
        holder.wait()


def test_the_lock_is_this_processes_while_held_and_leaves_nothing(tmp_path):
    run_dir = tmp_path / "a" / "run"
    with run_directory_lock(run_dir):
        assert json.loads((run_dir / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert not (tmp_path / "a").exists()  # a run that wrote nothing leaves no directories
