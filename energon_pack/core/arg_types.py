"""Value types of command-line options (``argparse`` ``type=``), shared by ``energon-pack`` and the
tools' own entry points (``python -m energon_pack.tools.bench_video``): each turns the text of one
option into its value or raises ``argparse.ArgumentTypeError`` naming the text and the fix."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def _ints_at_least(text: str, minimum: int, what: str, example: str) -> list[int]:
    """``text`` as comma-separated integers, each >= ``minimum``; else ``argparse.ArgumentTypeError``
    naming ``what`` the list holds and an ``example``."""
    try:
        values = [int(value) for value in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < minimum:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of {what}; fix: write e.g. {example} (no spaces)"
        )
    return values


def comma_separated_ints(text: str) -> list[int]:
    """``"4096,8192"`` -> ``[4096, 8192]``; anything else raises ``argparse.ArgumentTypeError``."""
    return _ints_at_least(text, 1, "positive integers", "4096,8192")


def worker_counts(text: str) -> list[int]:
    """``"0,2"`` -> ``[0, 2]`` (0: in the main process); anything else raises ``argparse.ArgumentTypeError``."""
    return _ints_at_least(text, 0, "worker counts >= 0", "0,2")


def decode_thread_counts(text: str) -> list[int | None]:
    """``"auto,1,2"`` -> ``[None, 1, 2]`` (``auto``: ``decode_threads: null``, the loader's default);
    anything else raises ``argparse.ArgumentTypeError``."""
    try:
        return [None if value == "auto" else comma_separated_ints(value)[0] for value in text.split(",")]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of decoder thread counts; fix: write e.g. auto,1,2 (no spaces)"
        ) from None


def positive_float(text: str) -> float:
    """``"0.25"`` -> ``0.25``; zero, a negative, inf, nan or a non-number raises ``argparse.ArgumentTypeError``."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number; fix: write e.g. 0.1 or 8000")
    return value


def int_at_least(minimum: int) -> Callable[[str], int]:
    """A parser of integers >= ``minimum``. Example: ``int_at_least(2)("64")`` -> 64; ``("1")`` raises
    ``argparse.ArgumentTypeError``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= {minimum}; fix: write e.g. {max(minimum, 1) * 8}")
        return value

    return parse


def comma_separated_ints_or_none(text: str) -> list[int]:
    """:func:`comma_separated_ints`, or ``[]`` for an empty string. Example: ``""`` -> ``[]``."""
    return comma_separated_ints(text) if text else []
