"""The checks every loader's restore_state_rank starts with (``runtime.state_check.check_restored_type``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from energon_pack.identity import ResumeMismatchError
from energon_pack.runtime.state_check import check_restored_type


@dataclass
class _State:
    fingerprint: Any


def _check(state: object, *, allow_inexact: bool = False) -> None:
    check_restored_type(state, _State, loader_name="SomeLoader", current_fingerprint={"seq_length": 8192},
                        allow_inexact=allow_inexact, note=" (a note)")


def test_a_state_of_another_type_is_named_with_the_loader_that_makes_the_right_one() -> None:
    with pytest.raises(TypeError, match=r"^restore_state_rank got dict; pass the object returned by "
                                        r"SomeLoader\.save_state_rank\(\) \(a note\)$"):
        _check({"fingerprint": {}})


def test_the_saved_fingerprint_is_compared_unless_it_is_no_mapping() -> None:
    _check(_State({"seq_length": 8192}))
    _check(_State("damaged"))  # left to the loader's own state checks, which name it
    with pytest.raises(ResumeMismatchError, match="seq_length"):
        _check(_State({"seq_length": 4096}))
    _check(_State({"seq_length": 4096}), allow_inexact=True)
