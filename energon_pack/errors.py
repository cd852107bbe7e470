"""Exception types: bad input data (``BadSampleError``) and unusable user input (``UsageError``)."""

from __future__ import annotations


class BadSampleError(ValueError):
    """A sample that must be skipped, with a short snake_case ``reason`` used as a skip-count key.

    Example: ``BadSampleError("placeholder_mismatch", "2 <image> placeholders but 1 image")``
    -> ``str(err) == "placeholder_mismatch: 2 <image> placeholders but 1 image"``.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class UsageError(ValueError):
    """A user input that cannot work (a path, a split, an option value), caught before any work starts.

    The message names the value, the rule and the fix on one line; the CLI prints it and exits
    with code 2. Example: ``UsageError("input file 'nope.jsonl' not found; fix: ...")``.
    """
