"""One process per run directory. Two train.py commands writing one run directory would interleave their log
rows and checkpoints under one config.json, and a later --resume would continue the mixture: so the main
process holds an exclusive lock on <run directory>/run.lock from before it writes anything there until it
ends, and a second command is refused in one line naming the holder (its pid and host, written in the file).

The lock is the kernel's (flock), so a process killed with kill -9 drops it with its file descriptors: the file
it leaves behind names a process that is gone, and the next command takes the lock over (saying so). The file
is removed, with the run directory if the lock was all there was in it, when the holder ends normally.
"""
import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import time

from minies import UserError

LOCK_FILE = "run.lock"


def process_alive(pid, host):
    """Whether process `pid` of `host` may still run: on this host, whether it exists; on another, assumed so."""
    if host != socket.gethostname():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process exists
        return True
    return True


def holder(path):
    """{"pid", "host", "started"} recorded in lock file `path`, or {} when it holds nothing readable."""
    try:
        with open(path) as f:
            found = json.load(f)
        return found if isinstance(found, dict) and isinstance(found.get("pid"), int) else {}
    except (OSError, ValueError):
        return {}


@contextlib.contextmanager
def run_directory_lock(run_dir):
    """Hold `run_dir`'s lock while the block runs (creating `run_dir`); a UserError naming the other process
    when one holds it."""
    created, missing = [], os.path.abspath(run_dir)
    while not os.path.exists(missing):  # run_dir and the parents it is made in, innermost first
        created.append(missing)
        missing = os.path.dirname(missing)
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, LOCK_FILE)
    fd = acquire(path, run_dir)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)  # while still locked: a waiting process then finds the path gone and retries
        os.close(fd)
        with contextlib.suppress(OSError):  # only what is empty: a run that failed before writing leaves nothing
            for directory in created:
                os.rmdir(directory)


def acquire(path, run_dir):
    """A file descriptor of `path` holding its exclusive lock, with this process's pid and host written in."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno not in (errno.EAGAIN, errno.EACCES):
                raise UserError(f"{run_dir}: cannot lock {path} ({e.strerror}); run on a file system with locks")
            other = holder(path)
            who = f"pid {other['pid']} on {other.get('host', '?')}" if other else "another process"
            raise UserError(f"{run_dir} is in use by {who}, running train.py since {other.get('started', '?')}; "
                            "wait for it to end (or stop it), or pass --run-name NAME for a new run") from None
        try:
            same_file = os.path.exists(path) and os.stat(path).st_ino == os.fstat(fd).st_ino
        except OSError:
            same_file = False
        if same_file:  # not a file its last holder removed after this process opened it
            break
        os.close(fd)
    left = holder(path)
    if left and not process_alive(left["pid"], left.get("host")):
        print(f"note: {path} was left by pid {left['pid']} on {left.get('host')}, which is no longer running "
              "(killed?): taking it over", file=sys.stderr)
    record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(record).encode(), 0)
    return fd
