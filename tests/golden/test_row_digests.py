"""Rows, a mid-epoch loader state and a pack plan are byte-identical to the recorded golden digests
(``tests/support/golden_row_digests.json``, recorded before the package was regrouped into layers).

The media knobs (``apply_exif_orientation``, ``max_image_pixels``) left the rows unchanged (the
synthetic mix has no EXIF orientation and no image above 89.5 MP) but enter states and plans at
their new defaults; measured at their old behaviour (``LEGACY_MEDIA``), the state and the plan
equal the digests recorded before the knobs (``legacy_media_*``): older states and plans resume there.
The token-rules version (``core.token_rules``) then joined every state and plan fingerprint, rows
unchanged: ``state``, ``plan`` and ``legacy_media_*`` were recorded again (states and plans saved
before it are refused, naming the versions).

A change that is meant to alter rows, states or plans records new digests with
``python tests/support/row_digests.py > tests/support/golden_row_digests.json`` and says why in its commit.
"""

from __future__ import annotations

import json

import pytest

from tests.support.row_digests import LEGACY_MEDIA, measure
from tests.support.paths import SUPPORT

GOLDEN = SUPPORT / "golden_row_digests.json"


@pytest.mark.slow
def test_rows_states_and_plans_equal_the_golden_digests(tmp_path):
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    measured = measure(tmp_path)
    assert measured["online_rows"] == golden["online_rows"]
    assert measured["state"] == golden["state"]
    assert measured["plan"] == golden["plan"]
    assert measured["plan_rows"] == golden["plan_rows"]
    assert measured["segment_sources"] == [0]  # the one field the digests leave out: source 0 throughout


@pytest.mark.slow
def test_states_and_plans_before_the_media_knobs_resume_at_their_old_behaviour(tmp_path):
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    measured = measure(tmp_path, LEGACY_MEDIA)
    assert measured["online_rows"] == golden["online_rows"]
    assert measured["state"] == golden["legacy_media_state"]
    assert measured["plan"] == golden["legacy_media_plan"]
