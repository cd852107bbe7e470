"""RowMetrics on hand-built rows: every figure against a per-segment reference, CP shards summing to
the whole row, the same keys everywhere, no host-device synchronisation, and bad input."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from energon_pack.core.visual import VisualInputs
from energon_pack.metrics import RowMetrics, SourceInfo, SourceNameError, source_infos, source_name
from energon_pack.qwen.template import IGNORE_INDEX
from energon_pack.rows.encoded import PackedSegment
from energon_pack.rows.thd import build_thd_row

NAMES = ("ocr", "chat", "video")
SOURCES = [SourceInfo(index=i, name=name, path=f"/d/{name}") for i, name in enumerate(NAMES)]


def segment(key: str, length: int, source: int, supervised: list[bool], patches: int = 0) -> PackedSegment:
    ids = torch.arange(length) + 7
    mask = torch.tensor(supervised, dtype=torch.float32)
    visual = VisualInputs(pixel_values=torch.zeros(patches, 6), image_grid_thw=torch.tensor([[1, 1, patches]])) if patches else VisualInputs()
    return PackedSegment(
        key=key, input_ids=ids, labels=torch.where(mask > 0, ids + 1, IGNORE_INDEX), loss_mask=mask,
        mrope_position_ids=torch.arange(length).expand(3, length).clone(), visual=visual, source=source,
    )


def row_of(specs: list[tuple[int, int, int]], width: int, multiple: int, *, reduction: str = "token") -> dict:
    """specs: (length, source, seed) per segment; supervision drawn from the seed."""
    segments = []
    for index, (length, source, seed) in enumerate(specs):
        gen = torch.Generator().manual_seed(seed)
        supervised = (torch.rand(length, generator=gen) < 0.6).tolist()
        segments.append(segment(f"s{index}", length, source, supervised, patches=index % 2 * 4))
    return build_thd_row(segments, seq_length=width, pad_multiple=multiple, pad_token_id=0, loss_reduction=reduction)


def reference(row: dict, loss: torch.Tensor) -> dict[str, tuple[float, float]]:
    """Per-segment loop over the row's real tokens (cu_seqlens), in float64."""
    cu, starts = row["cu_seqlens_q"].tolist(), row["cu_seqlens_q_padded"].tolist()
    mask, sources = row["loss_mask"][0], row["segment_source"].tolist()
    sums = {name: [0.0, 0.0, 0.0] for name in NAMES}  # real, supervised, loss
    for index, source in enumerate(sources):
        start, length = starts[index], cu[index + 1] - cu[index]
        for t in range(start, start + length):
            counts = sums[NAMES[source]]
            counts[0] += 1
            if mask[t] != 0:
                counts[1] += 1
                counts[2] += float(loss[t])
    real = sum(c[0] for c in sums.values())
    supervised = sum(c[1] for c in sums.values())
    out = {}
    for name, (n_real, n_sup, total) in sums.items():
        out[f"lm loss/{name}"] = (total, n_sup)
        out[f"data/tokens/{name}"] = (n_real, real)
        out[f"data/supervised/{name}"] = (n_sup, supervised)
    out["data/fill"] = (real, row["total_tokens"])
    out["data/segments per row"] = (len(sources), 1)
    out["data/vision patches per row"] = (row["visual_inputs"].pixel_values.shape[0] if row["visual_inputs"].pixel_values is not None else 0, 1)
    return out


row_specs = st.lists(
    st.tuples(st.integers(1, 13), st.integers(0, 2), st.integers(0, 10_000)), min_size=1, max_size=5
)


@settings(max_examples=40, deadline=None)
@given(specs=row_specs, tail=st.integers(0, 8), reduction=st.sampled_from(["token", "sample", "square"]))
def test_every_figure_equals_the_per_segment_reference(specs, tail, reduction):
    multiple = 4  # 2 * cp for cp 2
    width = sum(-(-length // multiple) * multiple for length, _, _ in specs) + tail * multiple
    row = row_of(specs, width, multiple, reduction=reduction)
    loss = torch.rand(width, generator=torch.Generator().manual_seed(len(specs))) * 5
    loss[row["loss_mask"][0] == 0] = float("nan")  # unsupervised positions never leak in
    got = RowMetrics(SOURCES).metrics(row, loss)
    for key, (num, den) in reference(row, torch.nan_to_num(loss)).items():
        assert got[key].tolist() == pytest.approx([num, den], rel=1e-5, abs=1e-5), key
    # CP 2: each rank's shard of the row with its shard of the loss; the two sum to the whole.
    from energon_pack.rows.step import thd_partition_indices

    shards = []
    for rank in (0, 1):
        keep = thd_partition_indices(row["cu_seqlens_q_padded"], width, 2, rank)
        shards.append(RowMetrics(SOURCES).metrics(row, loss[keep], cp_size=2, cp_rank=rank))
    for key, value in got.items():
        combined = torch.nan_to_num(shards[0][key]) + torch.nan_to_num(shards[1][key])
        assert combined.tolist() == pytest.approx(torch.nan_to_num(value).tolist(), rel=1e-5, abs=1e-5), key


def test_a_row_already_split_for_cp_gives_the_shard_figures_of_the_whole_row():
    from energon_pack.rows.step import thd_partition_indices, to_device_batch

    row = row_of([(5, 0, 1), (7, 2, 2), (3, 1, 3)], 24, 4)
    loss = torch.rand(24)
    for rank in (0, 1):
        shard_loss = loss[thd_partition_indices(row["cu_seqlens_q_padded"], 24, 2, rank)]
        split = to_device_batch(row, "cpu", cp_size=2, cp_rank=rank, split_for_cp=True)
        whole = RowMetrics(SOURCES).metrics(row, shard_loss, cp_size=2, cp_rank=rank)
        assert all(torch.equal(value, whole[key]) for key, value in RowMetrics(SOURCES).metrics(split, shard_loss, cp_size=2, cp_rank=rank).items())
    with pytest.raises(ValueError, match="padding_mask has 7 slots"):
        RowMetrics(SOURCES).metrics({**row, "padding_mask": row["padding_mask"][:, :7]})


def test_lm_loss_is_the_plain_token_mean_under_every_loss_reduction():
    specs = [(9, 0, 1), (3, 0, 2), (6, 1, 3)]
    loss = torch.linspace(0.5, 3.0, 24)
    figures = [RowMetrics(SOURCES).metrics(row_of(specs, 24, 4, reduction=r), loss) for r in ("token", "sample", "square")]
    assert figures[1]["lm loss/ocr"][1] > 0
    for other in figures[1:]:  # loss_mask weights (W / n_i) do not leak into the figure
        for key in figures[0]:
            assert torch.equal(other[key], figures[0][key]), key


def test_the_same_keys_for_rows_missing_sources_one_source_and_cp_ranks():
    metrics = RowMetrics(SOURCES)
    full = metrics.metrics(row_of([(5, 0, 1), (5, 1, 2), (5, 2, 3)], 24, 4), torch.zeros(24))
    one = metrics.metrics(row_of([(5, 2, 1)], 8, 4), torch.zeros(8))
    shard = metrics.metrics(row_of([(5, 1, 1)], 8, 4), torch.zeros(4), cp_size=2, cp_rank=1)
    assert list(full) == list(one) == list(shard) == metrics.keys()
    assert one["lm loss/ocr"].tolist() == [0.0, 0.0] and one["data/tokens/video"].tolist() == [5.0, 5.0]
    assert shard["data/segments per row"].tolist() == [0.0, 0.0]  # per-row figures: CP rank 0 only
    assert list(metrics.metrics(row_of([(5, 0, 1)], 8, 4))) == metrics.keys(with_loss=False)
    single = RowMetrics(source_infos([], "/data/captions"))
    assert [k for k in single.keys() if "/captions" in k] == ["lm loss/captions", "data/tokens/captions", "data/supervised/captions"]
    assert "data/audio frames per row" in RowMetrics(SOURCES, audio=True).keys()


def test_skip_rates_are_per_row_deltas_of_each_worker_and_per_row_counts_as_they_are():
    metrics = RowMetrics(SOURCES)
    row = row_of([(5, 0, 1)], 8, 4)

    def skipped(stats):
        out = metrics.metrics({**row, "__stats__": stats})
        return out["data/skipped/all"].tolist(), out["data/skipped/overlong"].tolist()

    first = {"worker_id": 0, "rows": 1, "samples_in": 10, "skipped": {"overlong": 1, "corrupt_image": 1}}
    assert skipped(first) == ([2, 10], [1, 10])  # a worker's first row: everything it read so far
    assert skipped({"worker_id": 1, "rows": 1, "samples_in": 4, "skipped": {}}) == ([0, 4], [0, 4])
    assert skipped({"worker_id": 0, "rows": 2, "samples_in": 16, "skipped": {"overlong": 3, "corrupt_image": 1}}) == ([2, 6], [2, 6])
    resumed = {"worker_id": 2, "rows": 40, "samples_in": 300, "skipped": {"overlong": 9}}
    assert skipped(resumed) == ([0, 0], [0, 0])  # first seen after a resume: only the baseline
    assert skipped({**resumed, "rows": 41, "samples_in": 304, "skipped": {"overlong": 10}}) == ([1, 4], [1, 4])
    plan_row = {"kind": "row_counts", "samples_in": 3, "skipped": {"overlong": 1}}
    assert skipped(plan_row) == skipped(plan_row) == ([1, 3], [1, 3])
    waited = metrics.metrics({**row, "__loader_wait_s__": 0.125})["data/loader wait s"]
    assert waited.tolist() == [0.125, 1.0]


def test_reduce_sums_micro_batches_then_divides_and_gives_nan_for_nothing():
    a = {"lm loss/ocr": torch.tensor([6.0, 3.0]), "lm loss/chat": torch.tensor([0.0, 0.0])}
    b = {"lm loss/ocr": torch.tensor([2.0, 1.0]), "lm loss/chat": torch.tensor([0.0, 0.0])}
    reduced = RowMetrics.reduce([a, b])
    assert reduced["lm loss/ocr"] == 2.0 and math.isnan(reduced["lm loss/chat"])
    with pytest.raises(ValueError, match="same keys"):
        RowMetrics.reduce([a, {"lm loss/ocr": torch.tensor([1.0, 1.0])}])


class NoSync(TorchDispatchMode):
    """Records every aten op; the ones that copy a device value to the host (or whose output shape
    depends on data) are what a step must not wait on."""

    SYNCING = ("_local_scalar_dense", "item", "nonzero", "masked_select", "is_nonzero", "equal", "unique")

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        self.ops.append(name)
        if name.strip("_") in {s.strip("_") for s in self.SYNCING}:
            raise AssertionError(f"RowMetrics ran aten::{name}, which synchronises host and device")
        if name == "index" and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1]):
            raise AssertionError("boolean-mask indexing synchronises to find its output size")
        if name == "repeat_interleave" and kwargs.get("output_size") is None:
            raise AssertionError("repeat_interleave without output_size synchronises to find its size")
        return func(*args, **kwargs)


def test_the_sync_check_catches_what_it_looks_for():
    values = torch.tensor([1.0, 2.0])
    for syncing in (lambda: values.sum().item(), lambda: values[values > 1], lambda: values.repeat_interleave(torch.tensor([1, 2]))):
        with pytest.raises(AssertionError, match="synchronis"), NoSync():
            syncing()


def test_no_host_device_synchronisation_in_the_code_path():
    row = row_of([(5, 0, 1), (7, 2, 2), (3, 1, 3)], 24, 4)
    row["__stats__"] = {"worker_id": 0, "samples_in": 4, "skipped": {"overlong": 1}}
    metrics = RowMetrics(SOURCES, audio=True)
    for cp_rank in (0, 1):
        loss = torch.rand(12)
        with NoSync() as mode:
            metrics.metrics(row, loss, cp_size=2, cp_rank=cp_rank)
        assert "index_add_" in mode.ops and "searchsorted" in mode.ops
    # On the meta device (shapes only, no data at all), a data-dependent step cannot run either.
    meta = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in row.items()}
    meta["visual_inputs"] = row["visual_inputs"].to("meta")
    out = metrics.metrics(meta, torch.zeros(12, device="meta"), cp_size=2, cp_rank=0)
    assert list(out) == metrics.keys() and all(v.device.type == "meta" and v.shape == (2,) for v in out.values())


def test_bad_input_is_named_with_its_fix():
    row = row_of([(5, 0, 1)], 8, 4)
    old = {k: v for k, v in row.items() if k != "segment_source"}
    with pytest.raises(ValueError, match="no 'segment_source'.*fix: build rows with this energon_pack"):
        RowMetrics(SOURCES).metrics(old)
    with pytest.raises(ValueError, match=r"token_loss has shape \(7,\).*width is 8"):
        RowMetrics(SOURCES).metrics(row, torch.zeros(7))
    entries = [
        {"index": 0, "path": "/a/train", "subflavors": {}, "weight": 1.0},
        {"index": 1, "path": "/b/other", "subflavors": {"source": "train"}, "weight": 1.0},
    ]
    with pytest.raises(SourceNameError, match=r"entries 0 \(/a/train\) and 1 \(/b/other\).*'train'.*fix:.*source: NAME"):
        source_infos(entries, "blend.yaml")
    with pytest.raises(SourceNameError):
        RowMetrics([dataclasses.replace(SOURCES[0]), dataclasses.replace(SOURCES[1], name="ocr")])
    with pytest.raises(ValueError, match=r"index \[2\] are not at that position.*fix: pass every source"):
        RowMetrics([SOURCES[0], SOURCES[2]])


def test_source_names_are_safe_for_metric_keys():
    assert source_name("/d/ocr_v2/") == "ocr_v2"
    assert source_name("/d/x", {"source": "chat en/zh"}) == "chat_en_zh"
    assert source_name("msc://bucket/sets/vqa") == "vqa"
    assert source_name("/d/Blend.YAML") == "Blend"


def test_energon_metadatasets_have_no_name_field_so_the_source_subflavor_names_an_entry(tmp_path):
    """Energon 7.4's MetadatasetV2 refuses ``name:`` on a blend entry: names come from the subflavor
    ``source`` (docs/metrics.md), else the dataset folder."""
    from megatron.energon.metadataset import load_dataset

    entry = "      - weight: 1\n        path: ./a\n"
    head = "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
    (tmp_path / "named.yaml").write_text(head + entry + "        name: ocr\n", encoding="utf-8")
    (tmp_path / "flavored.yaml").write_text(head + entry + "        subflavors: {source: ocr}\n", encoding="utf-8")
    with pytest.raises(Exception, match="BlendJoinDatasetReference"):  # no entry type takes a name
        load_dataset(tmp_path / "named.yaml")
    with pytest.raises(FileNotFoundError):  # the same entry with the subflavor is valid: only ./a is missing
        load_dataset(tmp_path / "flavored.yaml")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_no_synchronisation_on_a_cuda_device():
    from energon_pack.rows.step import to_device_batch

    row = row_of([(5, 0, 1), (7, 2, 2), (3, 1, 3)], 24, 4)
    row["__stats__"], row["__loader_wait_s__"] = {"worker_id": 0, "samples_in": 4, "skipped": {"overlong": 1}}, 0.5
    batch = to_device_batch(row, "cuda")
    loss = torch.rand(24, device="cuda")
    metrics = RowMetrics(SOURCES)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        on_device = metrics.metrics(batch, loss)
        shard = metrics.metrics(batch, loss[:12], cp_size=2, cp_rank=1)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(v.device.type == "cuda" for v in (*on_device.values(), *shard.values()))
    on_host = RowMetrics(SOURCES).metrics(row, loss.cpu())
    assert all(torch.allclose(on_device[k].cpu(), on_host[k]) for k in on_host)
