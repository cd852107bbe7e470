"""Plain-text tables for CLI reports."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def format_cell(value: Any) -> str:
    """Floats with 4 significant digits, everything else via ``str``. Example: 0.98765 -> "0.9877"."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Right-aligned text table of ``rows`` (dicts) over ``columns`` (default: first row's keys).

    Example: ``format_table([{"a": 1, "b": 2.5}])`` ->
    ``"a    b\\n-  ---\\n1  2.5"``.
    """
    if not rows:
        return "(no rows)"
    names = list(columns if columns is not None else rows[0].keys())
    cells = [[format_cell(row.get(name, "")) for name in names] for row in rows]
    widths = [max(len(name), *(len(line[i]) for line in cells)) for i, name in enumerate(names)]
    header = "  ".join(name.rjust(width) for name, width in zip(names, widths))
    rule = "  ".join("-" * width for width in widths)
    body = ["  ".join(cell.rjust(width) for cell, width in zip(line, widths)) for line in cells]
    return "\n".join([header, rule, *body])
