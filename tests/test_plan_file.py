"""The pack plan file (energon_pack.plan.file) and planning from measured tokens (plan.build)."""

from __future__ import annotations

import numpy as np
import pytest

from energon_pack.config import PackingConfig
from energon_pack.packing.budget import row_budget, sample_misfit
from energon_pack.plan.build import UNMEASURED, Measurement, plan_measurement, webdataset_index
from energon_pack.plan.file import PackPlan, PlanFormatError

SHARDS = [["a.tar", 2, 10], ["b.tar", 2, 10]]


def fingerprint(shards=SHARDS) -> dict:
    return {"dataset": {"split": "train", "shards": shards}, "encoder": {"vocab_size": 7}, "packing": {"seq_length": 10}}


def small_plan() -> PackPlan:
    return PackPlan.from_rows(
        [[3, 0], [1]], np.array([4, 5, 6, 7]), fingerprint=fingerprint(), samples_in=5, skipped={"corrupt_image": 1}
    )


def test_from_rows_golden():
    plan = small_plan()
    assert plan.member_shard.tolist() == [1, 0, 0]
    assert plan.member_index.tolist() == [1, 0, 1]
    assert plan.row_offsets.tolist() == [0, 2, 3]
    assert plan.member_tokens.tolist() == [7, 4, 5]
    assert plan.num_rows == 2 and plan.num_samples == 3
    assert plan.global_indices(0) == [3, 0] and plan.global_indices(1) == [1]
    assert plan.row_tokens(0) == [7, 4]


def test_save_load_round_trip_keeps_the_digest(tmp_path):
    plan = small_plan()
    plan.save(tmp_path / "plan")
    loaded = PackPlan.load(tmp_path / "plan")
    assert loaded.digest == plan.digest
    assert loaded.fingerprint == plan.fingerprint and loaded.skipped == {"corrupt_image": 1}
    assert [loaded.global_indices(r) for r in range(loaded.num_rows)] == [[3, 0], [1]]
    assert list(tmp_path.iterdir()) == [tmp_path / "plan"], "written atomically, nothing left over"


def test_digest_depends_on_rows_and_fingerprint():
    plan = small_plan()
    other_rows = PackPlan.from_rows([[3], [0, 1]], np.array([4, 5, 6, 7]), fingerprint=fingerprint(), samples_in=5, skipped={})
    other_data = PackPlan.from_rows(
        [[3, 0], [1]], np.array([4, 5, 6, 7]), fingerprint=fingerprint([["a.tar", 2, 11], ["b.tar", 2, 10]]),
        samples_in=5, skipped={"corrupt_image": 1},
    )
    assert len({plan.digest, other_rows.digest, other_data.digest}) == 3


def test_an_edited_or_foreign_file_is_refused(tmp_path):
    plan = small_plan()
    plan.save(tmp_path / "plan")
    with np.load(tmp_path / "plan") as archive:
        arrays = dict(archive)
    arrays["member_tokens"] = arrays["member_tokens"] + 1
    with open(tmp_path / "edited", "wb") as out:
        np.savez(out, **arrays)
    with pytest.raises(PlanFormatError, match="does not match the stored"):
        PackPlan.load(tmp_path / "edited")
    (tmp_path / "text").write_text("rows", encoding="utf-8")
    with pytest.raises(PlanFormatError, match="not a pack plan"):
        PackPlan.load(tmp_path / "text")


def test_webdataset_index_reads_the_energon_sample_index():
    key = ("SimpleSavableDatasetWrapper", 0, 7, "MapDataset", 7, "MapDataset", 7, "Webdataset", 42)
    assert webdataset_index(key) == 42
    with pytest.raises(ValueError, match="metadataset"):
        webdataset_index(("BlendDataset", 1, "Other", 3))


def measured(tokens, vision=None, skipped=None) -> Measurement:
    measurement = Measurement.empty(len(tokens))
    measurement.tokens[:] = tokens
    if vision is not None:
        measurement.vision[:] = vision
    measurement.skipped.update(skipped or {})
    return measurement


def test_plan_measurement_packs_the_measured_samples_and_keeps_the_skips():
    tokens = [6, UNMEASURED, 4, UNMEASURED, 3, 7]
    measurement = measured(tokens, skipped={"corrupt_image": 1, "overlong": 1})
    plan = plan_measurement(measurement, PackingConfig(seq_length=10, min_fill=0.9), fingerprint([["a.tar", 6, 100]]))
    assert plan.skipped == {"corrupt_image": 1, "overlong": 1}
    assert plan.samples_in == 6
    assert [plan.global_indices(r) for r in range(plan.num_rows)] == [[0, 2], [4, 5]]


def test_plan_rows_respect_the_alignment_multiple_and_the_vision_budget():
    shards = fingerprint([["a.tar", 3, 1]])
    config = PackingConfig(seq_length=16, pad_to_multiple_of=4)  # aligned to 4: 8, 8, 4
    plan = plan_measurement(measured([5, 5, 3]), config, shards)
    assert [plan.global_indices(r) for r in range(plan.num_rows)] == [[0, 1], [2]]
    budgeted = PackingConfig(seq_length=16, pad_to_multiple_of=4, max_row_vision_patches=8)
    plan = plan_measurement(measured([5, 5, 3], vision=[6, 6, 0]), budgeted, shards)
    assert [plan.global_indices(r) for r in range(plan.num_rows)] == [[0, 2], [1]]


class Prepared:
    """The fields ``sample_misfit`` reads from a prepared sample."""

    def __init__(self, tokens: int, vision: int = 0, media: int = 0) -> None:
        self.__key__, self.num_tokens, self.vision_patches, self.num_media = "a", tokens, vision, media


def test_sample_misfit_names_the_limit_or_raises():
    config = PackingConfig(seq_length=8192, max_row_vision_patches=100)
    budget = row_budget(config.row, config.policy)
    assert sample_misfit(Prepared(8192), budget, config.row, config.policy) is None
    overlong = sample_misfit(Prepared(9000), budget, config.row, config.policy)
    assert overlong.reason == "overlong" and "9000 tokens" in overlong.detail
    assert sample_misfit(Prepared(10, vision=101), budget, config.row, config.policy).reason == "over_vision_budget"
    strict = PackingConfig(seq_length=8192, on_overlong="error")
    with pytest.raises(ValueError, match="every sample must fit one row"):
        sample_misfit(Prepared(9000), row_budget(strict.row, strict.policy), strict.row, strict.policy)
