"""The difficulty of generated problems: --numbers (how many numbers a problem has), --low and --high (the
inclusive range each number is drawn from). Arithmetic and Countdown set their own defaults and limits; these
are the checks they share, each ending in one UserError line that names the flags, and what every task tells
of its difficulty (Difficulty)."""
from minies import UserError


def refuse_with_files(source, numbers=None, low=None, high=None):
    """Refuse any difficulty flag given where the problems are read, not generated; `source` says from where."""
    given = " ".join(f"--{flag} {' '.join(map(str, value)) if isinstance(value, (list, tuple)) else value}"
                     for flag, value in (("numbers", numbers), ("low", low), ("high", high)) if value is not None)
    if given:
        raise UserError(f"{given}: the difficulty flags apply to generated problems only, and {source}; drop {given}")


def counts_of(numbers, default):
    """--numbers as a tuple of distinct counts, in the order given: `default` for None, a single int (the Python
    API's form) as one count."""
    if numbers is None:
        return tuple(default)
    return tuple(dict.fromkeys(numbers if isinstance(numbers, (list, tuple)) else (numbers,)))


def check_range(task, counts, low, high, test_size):
    """Refuse low > high, and a range too narrow for the splits. Training draws generated problems until one
    is not held out, so it would loop forever once the test split held every problem there is: ask for at
    least twice as many different draws of numbers (`counts`: the numbers per problem it may choose) as the
    test split holds, so that training throws away about half of its draws at worst."""
    if low > high:
        raise UserError(f"--low {low} --high {high}: --task {task} needs --low <= --high")
    draws = sum((high - low + 1) ** count for count in counts)
    if draws < 2 * test_size:
        raise UserError(f"--numbers, --low, --high: numbers in {low}..{high}, {' or '.join(map(str, counts))} per "
                        f"problem, can be drawn only {draws} ways, and --task {task} holds out {test_size} problems "
                        f"to evaluate on; widen the range or raise --numbers to reach {2 * test_size} ways")


class Difficulty:
    """What a task tells of its problems' difficulty: the flags as it resolves them, how many problems exist, the
    hardest one. A task that reads its problems has no difficulty flags, and tells none of these."""

    def problem_count(self):
        """How many distinct problems the generator makes, where that is known exactly (else None)."""
        return None

    def difficulty(self, numbers=None, low=None, high=None):
        """The difficulty flags as this task resolves them, None standing for its default (--resume compares
        a run's flags this way: `--numbers 2` is arithmetic's default written out). Tasks that read their
        problems have none."""
        return {"numbers": numbers, "low": low, "high": high}

    def difficulty_flags(self):
        """The resolved difficulty flags as a command line would give them, a default marked so: "--numbers 2
        (default) --low 0 (default) --high 999"."""
        given = getattr(self, "difficulty_given", (None, None, None))  # the flags' values, set by a generated task
        return " ".join(f"--{key} {' '.join(map(str, value)) if isinstance(value, list) else value}"
                        + (" (default)" if typed is None else "")
                        for (key, value), typed in zip(self.difficulty(*given).items(), given) if value is not None)

    def hardest_problem(self):
        """A generated problem whose shortest answer is as long as any can be (None: the problems are read)."""
        return None
