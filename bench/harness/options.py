"""options.py: the typed option values of the scenarios' command lines.

Each function here is an argparse `type`: it parses one string and raises
argparse.ArgumentTypeError with a message naming the accepted values, so a
bad option fails before anything is set up. Pure: no I/O.
"""

import argparse


def uint_range(lo, hi):
    """An integer in lo..hi (decimal digits only, as the shell scripts took)."""

    def parse(text):
        if not text.isdigit() or len(text) > 9 or not lo <= int(text) <= hi:
            raise argparse.ArgumentTypeError(f"must be {lo}..{hi}, got '{text}'")
        return int(text)

    parse.__name__ = f"integer {lo}..{hi}"
    return parse


def positive_seconds(text):
    """A positive number of seconds (e.g. 3, 0.5)."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got '{text}'")
    return value


def uint_list(lo, hi):
    """A comma-separated list of integers in lo..hi (e.g. 1,2,4)."""
    one = uint_range(lo, hi)

    def parse(text):
        parts = text.split(",")
        try:
            return [one(p) for p in parts]
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(
                f"must be a comma-separated list of integers {lo}..{hi}, got '{text}'") from None

    parse.__name__ = f"list of integers {lo}..{hi}"
    return parse


def word_list(allowed=None, sep=None):
    """A list of words separated by spaces or commas (sep None: either), each
    one of `allowed` when given; duplicates keep their first place."""

    def parse(text):
        words = text.replace(",", " ").split() if sep is None else [w for w in text.split(sep) if w]
        if not words:
            raise argparse.ArgumentTypeError("must name at least one")
        if allowed is not None:
            bad = [w for w in words if w not in allowed]
            if bad:
                raise argparse.ArgumentTypeError(
                    f"unknown {', '.join(bad)} (known: {', '.join(allowed)})")
        return list(dict.fromkeys(words))

    parse.__name__ = "list"
    return parse


def choice(*allowed):
    """One word of `allowed`."""

    def parse(text):
        if text not in allowed:
            raise argparse.ArgumentTypeError(f"must be {', '.join(allowed)}, got '{text}'")
        return text

    parse.__name__ = "choice"
    return parse


def on_off(text):
    """"on" or "off"."""
    if text not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"must be on or off, got '{text}'")
    return text


def thread_counts(text):
    """Worker thread counts: a comma-separated list of 1..64 (e.g. 1,2,4),
    sorted, duplicates once."""
    parts = text.split(",")
    if not all(p.isdigit() and len(p) <= 2 and 1 <= int(p) <= 64 for p in parts):
        raise argparse.ArgumentTypeError(
            f"must be worker thread counts, each 1..64, separated by commas (e.g. 1,2,4), got '{text}'")
    return sorted({int(p) for p in parts})
