"""The command line's plumbing, shared by train.py, eval.py, plot.py and bench/: an argparse whose errors are one
line, the flags a command line names, the checks made before any work, and a script's main() run so that a
UserError is one line on stderr."""
import argparse
import os
import re
import sys

from minies import UserError


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors end with one line starting with "error:", like every other user error. No
    abbreviated flags: the scripts read --model, --algo, --recipe and --task in a first pass, where an
    abbreviation would be read differently (ES's --mode as --model). A value that starts with "-" is a value
    when it is a number in any form float() reads (`--alpha -1e-3`, `--alpha -inf`); argparse's own pattern
    knows only `-2` and `-0.5` and read the rest as an unknown flag ("expected one argument")."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, allow_abbrev=False, **kwargs)
        self._negative_number_matcher = re.compile(r"-((\d+\.?\d*|\.\d+)(e[-+]?\d+)?|inf|infinity|nan)$", re.I)

    def error(self, message):
        self.exit(2, f"error: {message}; see --help\n")


def typed_flags(argv=None):
    """The settings a command line names (`--lr-scale 2`, `--lr-scale=2`: lr_scale; `--no-greedy`: greedy),
    `argv` or else sys.argv's: a note or a refusal can then tell a value typed from a default or a recipe's.
    Reading the words is exact because no flag may be abbreviated (ArgumentParser)."""
    words = sys.argv[1:] if argv is None else map(str, argv)
    names = {word[2:].split("=")[0] for word in words if word.startswith("--")}
    return {name.removeprefix("no-").replace("-", "_") for name in names}


def check_thread_variable():
    """A UserError for an OMP_NUM_THREADS that OpenMP cannot read. libgomp ignores it (and says so on loading,
    before any script code runs): the run would take every core, and minies' load following, which yields to
    the variable whenever it is set (minies/runtime/threads.py), would stay off: a thread count nobody chose."""
    value = os.environ.get("OMP_NUM_THREADS")
    # OpenMP's grammar: a positive count, or a comma-separated count per nesting level.
    if value is not None and not all(re.fullmatch(r"\s*\+?[0-9]+\s*", part) and int(part) > 0
                                     for part in value.split(",")):
        raise UserError(f"OMP_NUM_THREADS={value!r} is not a number of threads; set it to a whole number >= 1 "
                        "(OMP_NUM_THREADS=2: two threads), or unset it to run on the cores other programs leave free")


def check_writable(directory, flag):
    """Fail at once, not after the work, when `directory` can neither be written nor created (`flag` names
    the option that chose it). Creates nothing: a run that fails later leaves no empty directories."""
    existing = os.path.abspath(directory)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise UserError(f"{flag} {directory}: {existing} is a file, not a directory; give a directory")
    if not os.access(existing, os.W_OK):
        raise UserError(f"{flag} {directory}: {existing} is not a writable directory")


def run_script(main):
    """Run a script's main(); a UserError becomes one "error: ..." line on stderr and exit status 2."""
    try:
        main()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except (MemoryError, RuntimeError) as e:  # torch's allocators raise RuntimeErrors (CUDA: a subclass)
        if not isinstance(e, MemoryError) and "out of memory" not in str(e) and "can't allocate memory" not in str(e):
            raise
        print(f"error: out of memory ({str(e).splitlines()[0][:200] if str(e) else type(e).__name__}); lower "
              "--micro-batch, or the sizes the flags ask for", file=sys.stderr)
        sys.exit(2)
