"""Value types of command-line options shared by the CLI and the tools' entry points."""

from __future__ import annotations

import argparse
import re

import pytest

from energon_pack.core.arg_types import (
    comma_separated_ints, comma_separated_ints_or_none, decode_thread_counts, int_at_least, positive_float, worker_counts,
)


def test_good_values_parse() -> None:
    assert comma_separated_ints("4096,8192") == [4096, 8192] and comma_separated_ints_or_none("") == []
    assert positive_float("0.25") == 0.25 and int_at_least(2)("64") == 64
    assert decode_thread_counts("auto,1,4") == [None, 1, 4] and worker_counts("0,2") == [0, 2]


@pytest.mark.parametrize(
    ("parse", "text"),
    [(comma_separated_ints, "1,,2"), (comma_separated_ints, "0,4"), (comma_separated_ints, ""),
     (positive_float, "0"), (positive_float, "nan"), (positive_float, "inf"), (int_at_least(2), "1"), (int_at_least(2), "x"),
     (decode_thread_counts, "auto,0"), (decode_thread_counts, "Auto"), (decode_thread_counts, ""),
     (worker_counts, "-1"), (worker_counts, "0,,2")],
)
def test_bad_values_name_the_text_and_the_fix(parse, text) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=rf"^{re.escape(repr(text))}.*fix: write e\.g\."):
        parse(text)
