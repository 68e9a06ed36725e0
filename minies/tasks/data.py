"""Data files: JSON Lines (one JSON value per line) or one JSON list, read so that a file of half a million
rows reaches training in seconds and holds little more than its own bytes in memory.

Reading checks every row once, in the file's order: a row its task's `parse_row` rejects (or bad JSON, or
text that is not UTF-8) ends with one line naming the file, the line (or list row) and what is wrong. A
problem is not kept: what stays is the file's bytes, where each row starts and ends, and a hash of its
question. `Rows` parses a row again each time it is used (a few microseconds), so a run holds only the
problems of the step at hand.

Repeated questions are kept once (the first), so that none can land in both splits. The hashes find the
candidates; questions are compared in full among rows whose hashes are equal, so two different questions
are never merged.
"""
import codecs
import json
import re
from array import array
from collections.abc import Sequence

import numpy as np

from minies import UserError

LINE_BREAK = re.compile(rb"\r\n?|\n")
LIST_START = re.compile(rb"\s*\[")
JSON_SPACE = re.compile(r"[ \t\n\r]*")  # the whitespace JSON allows between values


class Rows(Sequence):
    """The problems of a data file (or a part of it), each parsed from the file's text when it is used:
    `text` the file's bytes (JSON Lines) or text (a JSON list), `spans` the (start, end) of each row in it,
    `hashes` the hash of each row's question."""

    def __init__(self, text, spans, hashes, parse_row):
        self.text, self.spans, self.hashes, self.parse_row = text, spans, hashes, parse_row

    def __len__(self):
        return len(self.spans)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.pick(index)
        start, end = self.spans[index]
        return self.parse_row(json.loads(self.text[start:end]))  # checked when read: it parses

    def pick(self, indices):
        """The rows at `indices` (a slice, or a list of positions), in that order."""
        return Rows(self.text, self.spans[indices], self.hashes[indices], self.parse_row)

    def has_question(self, question):
        """Whether some row's question is `question` (a scan of the hashes, then the rows that match)."""
        return any(self[i].question == question for i in np.flatnonzero(self.hashes == hash(question)))

    def shared_with(self, other):
        """Positions of the rows whose question is also one of `other`'s."""
        theirs = {other[i].question for i in np.flatnonzero(np.isin(other.hashes, self.hashes))}
        return [i for i in np.flatnonzero(np.isin(self.hashes, other.hashes)) if self[i].question in theirs]


def read_problems(path, parse_row, flag="--data", least=2):
    """(Rows, repeats): the problems of a local data file in the file's order, each question once, and how
    many rows repeated an earlier row's question (merged into it). Every row is checked here (module
    docstring); fewer than `least` problems is an error too."""
    try:
        with open(path, "rb") as f:
            text = f.read()
        text = text.removeprefix(codecs.BOM_UTF8)  # the byte-order mark some editors write first: not a row's
        if LIST_START.match(text):
            text = text.decode("utf-8")  # a JSON list is read as text; JSON Lines stays bytes, decoded line by line
    except (OSError, UnicodeDecodeError) as e:
        raise unreadable(flag, path, e) from None
    kind, spans = ("row", list_spans(text, path)) if isinstance(text, str) else ("line", line_spans(text))
    kept, hashes = array("q"), array("q")
    for number, (start, end) in enumerate(spans, 1):
        row = text[start:end]
        try:
            row = row.decode("utf-8") if isinstance(row, bytes) else row
        except UnicodeDecodeError as e:
            raise unreadable(flag, path, e) from None
        if not row.strip():
            continue
        try:
            problem = parse_row(json.loads(row, object_pairs_hook=unique_keys))
        except (ValueError, RecursionError) as e:  # bad JSON, JSON nested past Python's stack, or a bad row
            reason = "nested too deeply" if isinstance(e, RecursionError) else e
            raise UserError(f"{path} {kind} {number}: {reason}; fix or delete that {kind}") from None
        kept.extend((start, end))
        hashes.append(hash(problem.question))
    rows = Rows(text, np.frombuffer(kept, dtype=np.int64).reshape(-1, 2), np.frombuffer(hashes, dtype=np.int64),
                parse_row)
    first = first_of_each_question(rows)
    repeats = len(rows) - len(first)
    rows = rows.pick(first) if repeats else rows
    if len(rows) < least:
        need = "one to test, one to train on" if least == 2 else "one to evaluate on"
        merged = f" ({repeats} more row(s) repeat a question: merged)" if repeats else ""
        raise UserError(f"{flag} {path}: {len(rows)} problem(s){merged}; need at least {least} ({need})")
    return rows, repeats


def unreadable(flag, path, error):
    reason = error.strerror if isinstance(error, OSError) else "not UTF-8 text"
    return UserError(f"{flag} {path}: cannot read it ({reason}); pass the path of a local JSON Lines file")


def line_spans(data):
    """(start, end) of each line of `data` (bytes), as bytes.splitlines() cuts them."""
    start = 0
    for brk in LINE_BREAK.finditer(data):
        yield start, brk.start()
        start = brk.end()
    if start < len(data):
        yield start, len(data)


def list_spans(text, path):
    """(start, end) of each item of the JSON list `text`, found by parsing one item at a time: json.loads
    would build every row at once (ten times the file's size in memory). Where the text is not a JSON list,
    the error gives json's own reason, as reading it whole would."""
    decoder, spans = json.JSONDecoder(object_pairs_hook=unique_keys), []
    try:
        pos = expect(text, JSON_SPACE.match(text).end(), "[")
        if not text.startswith("]", pos):
            while True:
                _, end = decoder.raw_decode(text, pos)
                spans.append((pos, end))
                pos = JSON_SPACE.match(text, end).end()
                if not text.startswith(",", pos):
                    break
                pos = JSON_SPACE.match(text, pos + 1).end()
        if expect(text, pos, "]") != len(text):
            raise ValueError("text after the list")
    except (ValueError, RecursionError) as e:
        raise UserError(f"{path}: not valid JSON ({json_fault(text) or e}); fix the file or write one JSON object "
                        "per line") from None
    return spans


def expect(text, pos, char):
    """Where the next value starts after `char`, which must be at `pos` of `text` (else ValueError)."""
    if not text.startswith(char, pos):
        raise ValueError(f"expected {char!r} at {pos}")
    return JSON_SPACE.match(text, pos + 1).end()


def json_fault(text):
    """json's own words for what is wrong with `text` (None where it reads it)."""
    try:
        json.loads(text, object_pairs_hook=unique_keys)
    except RecursionError:
        return "nested too deeply"
    except ValueError as e:
        return str(e)
    return None


def first_of_each_question(rows):
    """Positions of the rows whose question no earlier row has, in order. A row whose hash no other row has
    is kept as it is; the rest are parsed again and compared by question."""
    order = np.argsort(rows.hashes, kind="stable")
    same = np.diff(rows.hashes[order]) == 0  # order[k + 1] has the hash of order[k]
    shared = np.zeros(len(rows), dtype=bool)
    shared[order[1:][same]] = shared[order[:-1][same]] = True
    keep, seen = ~shared, set()
    for i in np.flatnonzero(shared):
        question = rows[i].question
        keep[i] = question not in seen
        seen.add(question)
    return np.flatnonzero(keep)


def unique_keys(pairs):
    """A JSON object as a dict, refusing a key written twice (json keeps the last one silently)."""
    keys = [key for key, _ in pairs]
    repeated = sorted({key for key in keys if keys.count(key) > 1})
    if repeated:
        raise ValueError(f"the key {repeated[0]!r} appears twice")
    return dict(pairs)
