"""The one exception type for bad input data (as opposed to configuration errors)."""

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
