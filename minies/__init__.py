"""minies: Evolution Strategies, GRPO and 3PO for RL with verifiable rewards, small enough to read."""
import argparse
import os
import sys


class UserError(Exception):
    """A mistake the user can fix (bad path, bad flag value, malformed data line).

    The scripts print its message as one line and exit with status 2 instead of a traceback.
    """


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors end with one line starting with "error:", like every other user error. No
    abbreviated flags: the scripts read --model, --algo, --recipe and --task in a first pass, where an
    abbreviation would be read differently (ES's --mode as --model)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def error(self, message):
        self.exit(2, f"error: {message}; see --help\n")


def check_writable(directory, flag):
    """Fail at once, not after the work, when `directory` can neither be written nor created (`flag` names
    the option that chose it). Creates nothing: a run that fails later leaves no empty directories."""
    existing = os.path.abspath(directory)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing) or not os.access(existing, os.W_OK):
        raise UserError(f"{flag} {directory}: {existing} is not a writable directory")


def run_script(main):
    """Run a script's main(); a UserError becomes one "error: ..." line on stderr and exit status 2."""
    try:
        main()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
