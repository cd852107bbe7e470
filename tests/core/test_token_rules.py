"""The token-rules version: bumped whenever the golden token counts change
(``tests/support/token_rules_golden``), and its one-line mismatch messages."""

from __future__ import annotations

import json

import pytest

from energon_pack.core.token_rules import (
    TOKEN_RULES_VERSION,
    UNVERSIONED,
    TokenRulesError,
    check_token_rules,
    recorded_rules,
    stale_rules,
)
from energon_pack.qwen import fit
from energon_pack.qwen.audio import AudioSpec
from energon_pack.qwen.geometry import video_grid
from tests.support.token_rules_golden import GOLDEN, counts_digest, golden_counts, record

_RERECORD = "python -m tests.support.token_rules_golden > tests/support/token_rules_golden.json"


def test_the_golden_token_counts_were_recorded_under_this_version():
    recorded, current = json.loads(GOLDEN.read_text(encoding="utf-8")), record()
    if current["digest"] != recorded["digest"]:
        assert current["token_rules"] != recorded["token_rules"], (
            f"the golden token counts changed (digest {current['digest']}, recorded {recorded['digest']} under token "
            f"rules {recorded['token_rules']}) but TOKEN_RULES_VERSION is still {TOKEN_RULES_VERSION}: artefacts of the "
            "old rules would be reused with wrong counts; fix: bump TOKEN_RULES_VERSION in "
            f"energon_pack/core/token_rules.py (add a changelog line), then re-record with `{_RERECORD}`"
        )
    assert current == recorded, f"TOKEN_RULES_VERSION is {TOKEN_RULES_VERSION}, the golden counts are recorded " \
        f"under {recorded['token_rules']}; fix: re-record them with `{_RERECORD}`"


def test_the_golden_counts_see_each_change_of_the_changelog(monkeypatch):
    """The digest changes under the rules of the last unversioned release: an odd frame list
    without its last frame repeated, Qwen3-Omni clips each padded to 300 s."""
    today = golden_counts()
    with monkeypatch.context() as patch:
        patch.setattr(fit, "video_grid", lambda n, h, w, spec: video_grid(max(n - n % 2, 2), h, w, spec))
        assert counts_digest(golden_counts()) != counts_digest(today)
    with monkeypatch.context() as patch:
        patch.setattr(AudioSpec, "padded_length", lambda self, samples: max([self.max_samples, *samples]))
        padded = golden_counts()
    assert padded["qwen2.5-omni"] == today["qwen2.5-omni"] and padded["qwen3-omni"] != today["qwen3-omni"]
    assert counts_digest(padded) != counts_digest(today)
    assert golden_counts() == today


def test_a_mismatch_names_both_versions_and_the_fix():
    assert stale_rules(TOKEN_RULES_VERSION, "plan p") is None
    assert recorded_rules({}) == UNVERSIONED and recorded_rules({"token_rules": 7}) == 7
    with pytest.raises(TokenRulesError) as caught:
        check_token_rules(UNVERSIONED, "pack plan p.plan", "rebuild the plan")
    message = str(caught.value)
    assert "\n" not in message
    assert message == (f"pack plan p.plan counted tokens under token rules unversioned, this energon_pack counts with "
                       f"v{TOKEN_RULES_VERSION}; fix: rebuild the plan")
    with pytest.raises(TokenRulesError, match=f"under token rules v{TOKEN_RULES_VERSION + 1}, .* with v{TOKEN_RULES_VERSION};"):
        check_token_rules(TOKEN_RULES_VERSION + 1, "loader state", "start afresh")
