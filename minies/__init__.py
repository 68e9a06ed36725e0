"""minies: Evolution Strategies, GRPO and 3PO for RL with verifiable rewards, small enough to read.

The package root holds the one error every module may raise, and imports nothing: the command line's plumbing
is minies/cli.py."""


class UserError(Exception):
    """A mistake the user can fix (bad path, bad flag value, malformed data line).

    The scripts print its message as one line and exit with status 2 instead of a traceback (minies/cli.py).
    """
