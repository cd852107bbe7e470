"""The checks every loader's restore_state_rank starts with (``runtime.state_check.check_restored_type``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from energon_pack.core.token_rules import TOKEN_RULES_VERSION, TokenRulesError
from energon_pack.identity import ResumeMismatchError
from energon_pack.runtime.state_check import check_restored_type


@dataclass
class _State:
    fingerprint: Any


def _fingerprint(seq_length: int, **fields: Any) -> dict[str, Any]:
    return {"seq_length": seq_length, "token_rules": TOKEN_RULES_VERSION, **fields}


def _check(state: object, *, allow_inexact: bool = False) -> None:
    check_restored_type(state, _State, loader_name="SomeLoader", current_fingerprint=_fingerprint(8192),
                        allow_inexact=allow_inexact, note=" (a note)")


def test_a_state_of_another_type_is_named_with_the_loader_that_makes_the_right_one() -> None:
    with pytest.raises(TypeError, match=r"^restore_state_rank got dict; pass the object returned by "
                                        r"SomeLoader\.save_state_rank\(\) \(a note\)$"):
        _check({"fingerprint": {}})


def test_the_saved_fingerprint_is_compared_unless_it_is_no_mapping() -> None:
    _check(_State(_fingerprint(8192)))
    _check(_State("damaged"))  # left to the loader's own state checks, which name it
    with pytest.raises(ResumeMismatchError, match="seq_length"):
        _check(_State(_fingerprint(4096)))
    _check(_State(_fingerprint(4096)), allow_inexact=True)


@pytest.mark.parametrize("allow_inexact", [False, True])
def test_a_state_of_other_token_rules_is_refused_in_one_line_naming_both_versions(allow_inexact: bool) -> None:
    previous_release = {"seq_length": 8192}  # states saved before the version was recorded
    with pytest.raises(TokenRulesError) as caught:
        _check(_State(previous_release), allow_inexact=allow_inexact)
    assert str(caught.value).startswith(
        f"the SomeLoader state counted tokens under token rules unversioned, this energon_pack counts with "
        f"v{TOKEN_RULES_VERSION}; fix: "
    )
    assert "\n" not in str(caught.value) and "start this loader afresh" in str(caught.value)
    with pytest.raises(TokenRulesError, match=f"under token rules v{TOKEN_RULES_VERSION + 1},"):
        _check(_State(_fingerprint(4096, token_rules=TOKEN_RULES_VERSION + 1)), allow_inexact=allow_inexact)
