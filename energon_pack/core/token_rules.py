"""The version of the token-counting rules, recorded by every artefact that stores counted tokens.

Prepare's facts and text tokens, kept facts, pack plans, part manifests and loader states hold
counts (tokens, grids, sound tokens, audio frames) made by the rules of the ``energon_pack`` that
wrote them. An artefact records ``TOKEN_RULES_VERSION`` as ``token_rules``; one of another
version (or of a release before versions, :data:`UNVERSIONED`) is never reused silently: facts
are measured again, plans, parts and states are refused, each with one line naming both versions
and the fix (:func:`stale_rules`, :func:`check_token_rules`). Rules are what
``qwen.geometry`` (grids, frame sampling), ``qwen.fit`` (a sample's media geometry),
``qwen.audio`` / ``qwen.sound_count`` (feature frames, padding, sound tokens) and
``qwen.template`` (placeholder expansion) count.

Bump ``TOKEN_RULES_VERSION`` whenever a rule changes a count, and add a line below;
``tests/core/test_token_rules.py`` fails when the golden counts change while the version stays.
A processor's own data (its chat template, tokenizer, pixel limits, feature extractor) is not a
rule: the processor and encoder fingerprints (``identity``) already tell those apart.

Changelog:

* ``unversioned``: releases before the version was recorded.
* ``1``: the first recorded version. Against the last unversioned release: an odd frame list
  repeats its last frame (grid t = ceil(n / temporal patch)); Qwen3-Omni pads a sample's clips to
  its longest clip (not to 300 s), so a clip's feature frames (and tokens) depend on the
  sample's other clips.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["TOKEN_RULES_VERSION", "UNVERSIONED", "TokenRulesError", "check_token_rules", "recorded_rules", "stale_rules"]

#: The version of the token-counting rules of this ``energon_pack`` (see the changelog above).
TOKEN_RULES_VERSION = 1
#: What an artefact written before versions were recorded counts as.
UNVERSIONED = "unversioned"


class TokenRulesError(ValueError):
    """An artefact's token counts were made under other token rules than this ``energon_pack``'s."""


def recorded_rules(record: Mapping[str, Any]) -> int | str:
    """The ``token_rules`` an artefact's JSON ``record`` holds, :data:`UNVERSIONED` when absent.

    Example: ``recorded_rules({"token_rules": 1})`` -> 1; ``recorded_rules({})`` -> ``"unversioned"``.
    """
    return record.get("token_rules", UNVERSIONED)


def _label(version: Any) -> str:
    return f"v{version}" if isinstance(version, int) else str(version)


def stale_rules(found: Any, what: str) -> str | None:
    """None when ``found`` is this ``TOKEN_RULES_VERSION``, else a phrase naming both versions.

    Example (version 1): ``stale_rules("unversioned", "plan x.plan")`` -> ``"plan x.plan counted
    tokens under token rules unversioned, this energon_pack counts with v1"``.
    """
    if found == TOKEN_RULES_VERSION:
        return None
    return f"{what} counted tokens under token rules {_label(found)}, this energon_pack counts with {_label(TOKEN_RULES_VERSION)}"


def check_token_rules(found: Any, what: str, fix: str) -> None:
    """Raise ``TokenRulesError`` (one line: both versions and ``fix``) unless ``found`` is this version.

    Example: ``check_token_rules(0, "loader state", "start afresh")`` -> TokenRulesError "loader
    state counted tokens under token rules v0, this energon_pack counts with v1; fix: start afresh".
    """
    problem = stale_rules(found, what)
    if problem is not None:
        raise TokenRulesError(f"{problem}; fix: {fix}")
