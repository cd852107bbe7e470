"""Token alignment: how many physical slots a segment occupies in a packed row.

The lowest layer of the package (no imports): the config rules, the bin selection and the row
assembly all count slots with :func:`aligned_length`.
"""

from __future__ import annotations

__all__ = ["aligned_length"]


def aligned_length(length: int, multiple: int) -> int:
    """Physical slots a sample of ``length`` tokens occupies: ceil(length / multiple) * multiple.

    Example: aligned_length(5, 4) -> 8; aligned_length(8, 4) -> 8.
    """
    return -(-length // multiple) * multiple
