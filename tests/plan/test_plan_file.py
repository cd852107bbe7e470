"""The pack plan file (energon_pack.plan.file) and planning from measured tokens (plan.build)."""

from __future__ import annotations

import dataclasses
import pickle
import time

import numpy as np
import pytest

from energon_pack.config import PackingConfig
from energon_pack.packing.budget import row_budget, sample_misfit
from energon_pack.plan.build import UNMEASURED, Measurement, plan_measurement, webdataset_index
from energon_pack.plan import columns
from energon_pack.plan.file import PLAN_FORMAT, PLAN_FORMAT_V1, MappedPlan, PackPlan, PlanFormatError, open_plan

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


def test_a_format_1_file_still_loads_with_its_own_digest(tmp_path):
    plan = dataclasses.replace(small_plan(), format=PLAN_FORMAT_V1)
    plan.save(tmp_path / "plan")
    for loaded in (PackPlan.load(tmp_path / "plan"), open_plan(tmp_path / "plan")):
        assert loaded.format == PLAN_FORMAT_V1 and loaded.digest == plan.digest
        assert [loaded.global_indices(r) for r in range(loaded.num_rows)] == [[3, 0], [1]]
    assert plan.digest != small_plan().digest, "the digest definition differs between the formats"


def test_an_edited_or_foreign_format_1_file_is_refused(tmp_path):
    plan = dataclasses.replace(small_plan(), format=PLAN_FORMAT_V1)
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


def test_a_format_1_file_with_row_flops_loads_with_them_in_its_digest(tmp_path):
    """A balanced ``.npz`` plan of the earlier release: ``row_flops`` next to the member arrays,
    hashed after them (name, dtype, shape, bytes) into the stored digest."""
    import hashlib
    import json

    plain = dataclasses.replace(small_plan(), format=PLAN_FORMAT_V1)
    flops = np.array([9_000, 8_000], dtype=np.int64)
    arrays = {**plain.arrays(), "row_flops": flops}
    hasher = hashlib.sha256(json.dumps(plain.meta(), sort_keys=True).encode("utf-8"))
    for name, array in arrays.items():
        hasher.update(f"{name}:{array.dtype.str}:{array.shape}".encode())
        hasher.update(array.tobytes())
    meta = json.dumps({**plain.meta(), "digest": hasher.hexdigest()}, sort_keys=True).encode("utf-8")
    with open(tmp_path / "plan", "wb") as out:
        np.savez(out, meta=np.frombuffer(meta, dtype=np.uint8), **arrays)
    loaded = open_plan(tmp_path / "plan")
    assert loaded.format == PLAN_FORMAT_V1 and loaded.digest == hasher.hexdigest() != plain.digest
    assert loaded.row_flops.tolist() == [9_000, 8_000] and plain.row_flops is None
    loaded.save(tmp_path / "again")
    assert PackPlan.load(tmp_path / "again").digest == loaded.digest
    with pytest.raises(PlanFormatError, match="format 1 only"):
        dataclasses.replace(plain, row_arrays={"row_cost": np.zeros(2)})


def test_row_flops_are_the_format_2_row_array_of_that_name(tmp_path):
    plan = dataclasses.replace(small_plan(), row_arrays={"row_flops": np.array([5, 6], dtype=np.int64)})
    plan.save(tmp_path / "plan")
    mapped = open_plan(tmp_path / "plan")
    assert mapped.row_flops.tolist() == [5, 6] and mapped.digest == plan.digest != small_plan().digest


def big_plan(rows: int = 600_000, row_arrays=None) -> PackPlan:
    """A plan whose member arrays span several 4 MiB chunks (3 members per row)."""
    members = np.arange(3 * rows, dtype=np.int64)
    return PackPlan.from_csr(
        np.arange(0, 3 * rows + 1, 3, dtype=np.int64), members, members % 1000 + 1,
        fingerprint=fingerprint([["a.tar", 3 * rows, 1]]), samples_in=3 * rows, skipped={},
    ) if row_arrays is None else dataclasses.replace(big_plan(rows), row_arrays=row_arrays)


def test_format_2_is_mapped_with_the_same_rows_digest_and_row_arrays(tmp_path):
    plan = big_plan(row_arrays={"row_cost": np.linspace(0.0, 1.0, 600_000)})
    assert plan.format == PLAN_FORMAT
    plan.save(tmp_path / "plan")
    start = time.perf_counter()
    mapped = open_plan(tmp_path / "plan")
    assert time.perf_counter() - start < 0.5, "opening reads the header only"
    assert isinstance(mapped, MappedPlan) and mapped.digest == plan.digest
    assert mapped.num_rows == plan.num_rows and mapped.num_samples == plan.num_samples
    for row in (0, 1234, plan.num_rows - 1):
        assert mapped.global_indices(row) == plan.global_indices(row)
        assert mapped.row_tokens(row) == plan.row_tokens(row)
    assert np.array_equal(mapped.row_arrays["row_cost"], plan.row_arrays["row_cost"])
    assert pickle.loads(pickle.dumps(mapped)).global_indices(7) == plan.global_indices(7)
    whole = PackPlan.load(tmp_path / "plan")
    assert whole.digest == plan.digest and set(whole.row_arrays) == {"row_cost"}
    assert [p.name for p in tmp_path.iterdir()] == ["plan"], "written atomically, nothing left over"


def test_format_2_row_arrays_change_the_digest_and_need_one_value_per_row():
    plan = big_plan(10)
    assert dataclasses.replace(plan, row_arrays={"row_cost": np.zeros(10)}).digest != plan.digest
    with pytest.raises(PlanFormatError, match="one value per row"):
        dataclasses.replace(plan, row_arrays={"row_cost": np.zeros(9)})


def test_a_truncated_or_edited_format_2_file_is_refused(tmp_path):
    big_plan().save(tmp_path / "plan")
    data = (tmp_path / "plan").read_bytes()
    (tmp_path / "cut").write_bytes(data[:-1])
    with pytest.raises(PlanFormatError, match="truncated"):
        open_plan(tmp_path / "cut")
    header = data.replace(b'"samples_in": 1800000', b'"samples_in": 1800001')
    assert header != data
    (tmp_path / "header").write_bytes(header)
    with pytest.raises(PlanFormatError, match="does not match its digest"):
        open_plan(tmp_path / "header")


def test_an_edited_array_byte_fails_when_its_chunk_is_read(tmp_path):
    plan = big_plan()
    plan.save(tmp_path / "plan")
    mapped = open_plan(tmp_path / "plan", verify="none")
    entry = mapped._columns.header["arrays"]["member_index"]
    data = bytearray((tmp_path / "plan").read_bytes())
    data[entry["offset"] + columns.CHUNK_BYTES + 5] ^= 1  # second chunk of member_index
    (tmp_path / "edited").write_bytes(bytes(data))
    lazy = open_plan(tmp_path / "edited")  # the header is intact: opens
    assert lazy.global_indices(0) == plan.global_indices(0), "rows in the first chunk read fine"
    chunk_rows = columns.CHUNK_BYTES // 4 // 3
    with pytest.raises(PlanFormatError, match="member_index bytes"):
        lazy.global_indices(chunk_rows + 10)
    assert lazy._columns._verified["member_index"] == {0}, "only the chunks read were hashed"
    with pytest.raises(PlanFormatError, match="member_index bytes"):
        open_plan(tmp_path / "edited", verify="full")
    with pytest.raises(PlanFormatError, match="member_index bytes"):
        PackPlan.load(tmp_path / "edited")


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


def test_a_plan_without_rows_round_trips_in_format_2(tmp_path):
    plan = plan_measurement(measured([UNMEASURED] * 3, skipped={"overlong": 3}), PackingConfig(seq_length=10), fingerprint([["a.tar", 3, 1]]))
    assert plan.num_rows == 0
    plan.save(tmp_path / "plan")
    opened = open_plan(tmp_path / "plan", verify="full")
    assert opened.num_rows == 0 and opened.skipped == {"overlong": 3} and opened.digest == plan.digest
