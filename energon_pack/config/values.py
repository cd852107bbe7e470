"""Value rules shared by every config part: each returns one error line (``name=value: rule; fix: ...``)
or None; ``ConfigError`` collects them; unknown keys are named with their closest valid ones.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable
from typing import Any

from energon_pack.core.alignment import aligned_length

#: Field metadata of a part's field whose value does not change the rows a loader yields; every
#: other field of the row layout, packing policy and loader options enters the resume fingerprint.

def int_problem(name: str, value: Any, *, minimum: int, optional: bool = False) -> str | None:
    """Check that ``value`` is an int (not a bool) >= ``minimum``; None passes when ``optional``.

    Example: ``int_problem("buffer_size", 0, minimum=1)`` ->
    ``"buffer_size=0: must be an integer >= 1; fix: set buffer_size to an integer >= 1"``.
    """
    if optional and value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= minimum:
        return None
    rule = f"an integer >= {minimum}" + (" or null" if optional else "")
    return f"{name}={value!r}: must be {rule}; fix: set {name} to {rule}"


def bool_problem(name: str, value: Any) -> str | None:
    """Check that ``value`` is a bool. Example: ``bool_problem("repeat", "yes")`` -> an error line."""
    if isinstance(value, bool):
        return None
    return f"{name}={value!r}: must be a boolean; fix: set {name} to true or false"


def choice_problem(name: str, value: Any, choices: tuple[str, ...]) -> str | None:
    """Check that ``value`` is one of ``choices``.

    Example: ``choice_problem("on_overlong", "cut", ("skip", "error"))`` -> an error line.
    """
    if isinstance(value, str) and value in choices:
        return None
    options = " or ".join(repr(c) for c in choices)
    return f"{name}={value!r}: must be one of {options}; fix: set {name} to {options}"


def unsupported_problem(name: str, value: Any, *, supported: int, rule: str, fix: str) -> str | None:
    """``value`` must be an int >= ``supported``; any other value than ``supported`` breaks ``rule``.

    Example: ``unsupported_problem("pp", 2, supported=1, rule="pipeline parallel is not supported",
    fix="set pp=1")`` -> ``"pp=2: pipeline parallel is not supported; fix: set pp=1"``.
    """
    problem = int_problem(name, value, minimum=supported)
    if problem or value == supported:
        return problem
    return f"{name}={value}: {rule}; fix: {fix}"


def next_multiple(value: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is >= ``value`` (and >= ``multiple``).

    Example: ``next_multiple(8190, 4)`` -> ``8192``; ``next_multiple(0, 4)`` -> ``4``.
    """
    return max(multiple, aligned_length(value, multiple))


class ConfigError(ValueError):
    """An invalid configuration; ``problems`` holds one line per violated rule (value, rule, fix)."""

    def __init__(self, what: str, problems: list[str]) -> None:
        super().__init__(f"invalid {what}:\n  - " + "\n  - ".join(problems))
        self.problems = problems


def raise_if_problems(what: str, problems: Iterable[str | None]) -> None:
    """Raise one ConfigError listing every non-None problem line, if any."""
    lines = [p for p in problems if p is not None]
    if lines:
        raise ConfigError(what, lines)


def closest_keys(key: str, valid: Iterable[str], *, cutoff: float = 0.6) -> list[str]:
    """Every valid key that is as close to ``key`` as the closest one (difflib ratio >= ``cutoff``).

    Example: ``closest_keys("cpp", ["tp", "cp", "pp"])`` -> ``["cp", "pp"]`` (both ratio 0.8);
    ``closest_keys("zzz", ["tp"])`` -> ``[]``.
    """
    ratios = {name: difflib.SequenceMatcher(None, key, name).ratio() for name in valid}
    best = max(ratios.values(), default=0.0)
    return [name for name, ratio in ratios.items() if ratio == best] if best >= cutoff else []


def unknown_key_problem(what: str, keys: Iterable[Any], valid: Iterable[str]) -> str | None:
    """Name every key not in ``valid`` (with every equally close match) and list the valid ones.

    Example: ``unknown_key_problem("PackingConfig", ["bufer_size"], ["buffer_size"])`` ->
    ``"unknown PackingConfig key(s): 'bufer_size' (did you mean 'buffer_size'?); valid keys: buffer_size"``.
    """
    valid = list(valid)
    unknown = sorted((k for k in keys if k not in valid), key=str)
    if not unknown:
        return None
    described = []
    for key in unknown:
        close = " or ".join(repr(name) for name in closest_keys(str(key), valid))
        described.append(f"{key!r}" + (f" (did you mean {close}?)" if close else ""))
    return f"unknown {what} key(s): {', '.join(described)}; valid keys: {', '.join(valid)}"


def raise_if_unknown_keys(problems: Iterable[str | None]) -> None:
    """Raise one ValueError for all unknown-key lines, with the fix."""
    lines = [p for p in problems if p is not None]
    if lines:
        raise ValueError("\n".join(lines) + "\nfix: remove or rename the unknown key(s)")


def field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


NOT_FINGERPRINTED = {"fingerprint": False}


def fingerprint_fields(part: Any) -> dict[str, Any]:
    """The part's fields that exact resume depends on (those not marked ``NOT_FINGERPRINTED``)."""
    return {f.name: getattr(part, f.name) for f in dataclasses.fields(part) if f.metadata.get("fingerprint", True)}
