"""Exception types: bad input data (``BadSampleError``, ``TooManyBadSamplesError``) and unusable
user input (``UsageError``)."""

from __future__ import annotations


class BadSampleError(ValueError):
    """A sample that must be skipped: a short snake_case ``reason`` (the skip-count key) and a
    ``detail`` naming the offending value. Both travel as fields (samples carry them as
    ``skip_reason`` / ``skip_detail``); the message joins them for people only.

    Example: ``BadSampleError("placeholder_mismatch", "2 <image> placeholders but 1 image")``
    -> ``err.reason == "placeholder_mismatch"``,
    ``str(err) == "placeholder_mismatch: 2 <image> placeholders but 1 image"``.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        """Pickle as ``(reason, detail)`` (worker processes send it back to their parent)."""
        return type(self), (self.reason, self.detail)


class UsageError(ValueError):
    """A user input that cannot work (a path, a split, an option value), caught before any work starts.

    The message names the value, the rule and the fix on one line; the CLI prints it and exits
    with code 2. Example: ``UsageError("input file 'nope.jsonl' not found; fix: ...")``.
    """


class TooManyBadSamplesError(RuntimeError):
    """More bad samples in a row in one worker than ``PackingPolicy.max_consecutive_skips`` allows.

    Only raised when the user sets that limit; by default bad samples are skipped and counted
    without limit. The message names the worker, the run length, the last reason and the fix.
    """
