"""One process per run directory. Two train.py commands writing one run directory would interleave their log
rows and checkpoints under one config.json, and a later --resume would continue the mixture: so the main
process holds an exclusive lock on <run directory>/run.lock from before it writes anything there until it
ends, and a second command is refused in one line naming the holder (its pid and host, written in the file).

The lock is the kernel's (flock), so a process killed with kill -9 drops it with its file descriptors: the file
it leaves behind names a process that is gone, and the next command takes the lock over (saying so). The file
is removed, with the run directory if the lock was all there was in it, when the holder ends normally.
lock_file and release, the lock without the run directory's record, also serve benches whose processes share
files to compute.
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
        release(path, fd)
        with contextlib.suppress(OSError):  # only what is empty: a run that failed before writing leaves nothing
            for directory in created:
                os.rmdir(directory)


def lock_file(path, wait=False):
    """A file descriptor of `path` (created if missing) holding its exclusive kernel lock; None when another
    process holds it, unless `wait`, which waits for it. A file its last holder removed after this process
    opened it locks nothing, so the path is opened again."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EAGAIN, errno.EACCES):
                return None
            raise
        if is_file_at(path, fd):
            return fd
        os.close(fd)


def release(path, fd):
    """Drop the lock `lock_file` gave, removing `path` first (while still locked, and only if it is still this
    lock's file): a process waiting on it then finds the path gone and opens it again."""
    with contextlib.suppress(OSError):
        if is_file_at(path, fd):
            os.unlink(path)
    os.close(fd)


def is_file_at(path, fd):
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except OSError:
        return False


def acquire(path, run_dir):
    """A file descriptor of `path` holding its exclusive lock, with this process's pid and host written in."""
    try:
        fd = lock_file(path)
    except OSError as e:
        raise UserError(f"{run_dir}: cannot lock {path} ({e.strerror}); run on a file system with locks") from None
    if fd is None:
        other = holder(path)
        who = f"pid {other['pid']} on {other.get('host', '?')}" if other else "another process"
        raise UserError(f"{run_dir} is in use by {who}, running train.py since {other.get('started', '?')}; "
                        "wait for it to end (or stop it), or pass --run-name NAME for a new run")
    left = holder(path)
    if left and not process_alive(left["pid"], left.get("host")):
        print(f"note: {path} was left by pid {left['pid']} on {left.get('host')}, which is no longer running "
              "(killed?): taking it over", file=sys.stderr)
    record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(record).encode(), 0)
    return fd
