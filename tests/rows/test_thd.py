"""THD row assembly (docs/batch_contract.md): golden rows, invariants, errors, visual concat."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from energon_pack.rows.encoded import PackedSegment
from energon_pack.core.alignment import aligned_length
from energon_pack.qwen.template import IGNORE_INDEX
from energon_pack.config import RowLayout
from energon_pack.rows.thd import build_layout_row, build_thd_row, collate_rows, row_width
from energon_pack.core.visual import VisualInputs

PAD = 151643


def make_segment(key: str, length: int, *, first_id: int = 1000, visual: VisualInputs | None = None) -> PackedSegment:
    """Segment with distinct ids first_id.., loss on every target, text-like mrope 0..L-1 on all axes."""
    ids = torch.arange(first_id, first_id + length, dtype=torch.int64)
    labels = torch.cat([ids[1:], torch.tensor([IGNORE_INDEX])])
    return PackedSegment(
        key=key,
        input_ids=ids,
        labels=labels,
        loss_mask=torch.ones(length, dtype=torch.float32),
        mrope_position_ids=torch.arange(length).expand(3, length).clone(),
        visual=visual if visual is not None else VisualInputs(),
    )


def image_visual(patches: int, value: float) -> VisualInputs:
    return VisualInputs(
        pixel_values=torch.full((patches, 6), value),
        image_grid_thw=torch.tensor([[1, 1, patches]]),
    )


# --------------------------------------------------------------------------- golden rows


def test_two_segments_golden_row():
    a = make_segment("a", 5, first_id=10)
    b = make_segment("b", 4, first_id=20)
    row = build_thd_row([a, b], seq_length=12, pad_multiple=4, pad_token_id=PAD)

    assert row["input_ids"].tolist() == [[10, 11, 12, 13, 14, PAD, PAD, PAD, 20, 21, 22, 23]]
    n = IGNORE_INDEX
    assert row["labels"].tolist() == [[11, 12, 13, 14, n, n, n, n, 21, 22, 23, n]]
    assert row["loss_mask"].tolist() == [[1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0]]
    assert row["position_ids"].tolist() == [[0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3]]
    assert row["padding_mask"].tolist() == [[False] * 5 + [True] * 3 + [False] * 4]
    assert row["cu_seqlens_q"].tolist() == [0, 5, 9]
    assert row["cu_seqlens_kv"].tolist() == [0, 5, 9]
    assert row["cu_seqlens_q_padded"].tolist() == [0, 8, 12]
    assert row["cu_seqlens_kv_padded"].tolist() == [0, 8, 12]
    assert row["max_seqlen_q"].item() == 8 and row["max_seqlen_kv"].item() == 8
    assert row["total_tokens"] == 12
    assert row["attention_mask"] is None
    assert row["__keys__"] == ["a", "b"]


def test_single_segment_absorbs_tail():
    row = build_thd_row([make_segment("a", 4)], seq_length=12, pad_multiple=4, pad_token_id=PAD)
    assert row["cu_seqlens_q"].tolist() == [0, 4]
    assert row["cu_seqlens_q_padded"].tolist() == [0, 12]
    assert row["max_seqlen_q"].item() == 12
    assert row["padding_mask"].tolist() == [[False] * 4 + [True] * 8]
    assert row["position_ids"].tolist() == [list(range(12))]


def test_dtypes_and_shapes():
    row = build_thd_row([make_segment("a", 3), make_segment("b", 2)], seq_length=8, pad_multiple=2, pad_token_id=0)
    expected = {
        "input_ids": (torch.int64, (1, 8)),
        "labels": (torch.int64, (1, 8)),
        "loss_mask": (torch.float32, (1, 8)),
        "position_ids": (torch.int64, (1, 8)),
        "mrope_position_ids": (torch.int64, (3, 1, 8)),
        "padding_mask": (torch.bool, (1, 8)),
        "cu_seqlens_q": (torch.int32, (3,)),
        "cu_seqlens_kv": (torch.int32, (3,)),
        "cu_seqlens_q_padded": (torch.int32, (3,)),
        "cu_seqlens_kv_padded": (torch.int32, (3,)),
        "max_seqlen_q": (torch.int32, ()),
        "max_seqlen_kv": (torch.int32, ()),
        "loss_tokens": (torch.int32, (2,)),
        "segment_source": (torch.int32, (2,)),
    }
    for key, (dtype, shape) in expected.items():
        assert row[key].dtype == dtype, key
        assert tuple(row[key].shape) == shape, key
    assert set(row) == {*expected, "attention_mask", "total_tokens", "visual_inputs", "__keys__", "__subflavors__"}
    assert isinstance(row["total_tokens"], int)
    assert isinstance(row["visual_inputs"], VisualInputs)
    assert row["loss_tokens"].tolist() == [2, 1]  # the last token of each segment has no target
    assert row["segment_source"].tolist() == [0, 0]  # a segment's source defaults to 0 (a plain dataset)


def test_segment_source_holds_each_segments_source_in_row_order():
    segments = [dataclasses.replace(make_segment(key, 3), source=source) for key, source in (("a", 2), ("b", 0), ("c", 2))]
    row = build_thd_row(segments, seq_length=12, pad_multiple=4, pad_token_id=0)
    assert row["segment_source"].tolist() == [2, 0, 2]


def test_segment_end_label_and_loss_forced_off():
    seg = make_segment("a", 4)
    seg = PackedSegment(
        key="a",
        input_ids=seg.input_ids,
        labels=torch.tensor([5, 6, 7, 8]),  # last label wrongly set by the caller
        loss_mask=torch.ones(4),
        mrope_position_ids=seg.mrope_position_ids,
        visual=VisualInputs(),
    )
    row = build_thd_row([seg], seq_length=4, pad_multiple=1, pad_token_id=PAD)
    assert row["labels"].tolist() == [[5, 6, 7, IGNORE_INDEX]]
    assert row["loss_mask"].tolist() == [[1, 1, 1, 0]]


def test_mrope_copied_and_gaps_continue_from_segment_max():
    # Qwen-VL style: an image block makes positions jump; the max is not the last position.
    mrope = torch.tensor([[0, 1, 2, 2, 4, 5], [0, 1, 2, 3, 4, 5], [0, 1, 3, 2, 4, 5]])
    seg = make_segment("a", 6)
    seg = PackedSegment(
        key="a",
        input_ids=seg.input_ids,
        labels=seg.labels,
        loss_mask=seg.loss_mask,
        mrope_position_ids=mrope,
        visual=VisualInputs(),
    )
    row = build_thd_row([seg, make_segment("b", 2)], seq_length=12, pad_multiple=4, pad_token_id=PAD)
    got = row["mrope_position_ids"][:, 0]
    assert torch.equal(got[:, :6], mrope)
    assert got[:, 6:8].tolist() == [[6, 7]] * 3
    assert got[:, 8:10].tolist() == [[0, 1]] * 3
    assert got[:, 10:].tolist() == [[2, 3]] * 3


def test_pad_cu_seqlens_fixed_length():
    row = build_thd_row(
        [make_segment("a", 5), make_segment("b", 4)],
        seq_length=12,
        pad_multiple=4,
        pad_token_id=PAD,
        pad_cu_seqlens=True,
        max_segments=4,
    )
    assert row["cu_seqlens_q"].tolist() == [0, 5, 9, 9, 9]
    assert row["cu_seqlens_kv"].tolist() == [0, 5, 9, 9, 9]
    assert row["cu_seqlens_q_padded"].tolist() == [0, 8, 12, 12, 12]
    assert row["cu_seqlens_kv_padded"].tolist() == [0, 8, 12, 12, 12]
    assert row["max_seqlen_q"].item() == 12 and row["max_seqlen_kv"].item() == 12


def test_visual_inputs_concatenated_in_row_order():
    a = make_segment("a", 3, visual=image_visual(2, 1.0))
    b = make_segment("b", 3)
    c = make_segment("c", 3, visual=image_visual(3, 2.0))
    row = build_thd_row([a, b, c], seq_length=9, pad_multiple=1, pad_token_id=PAD)
    vis = row["visual_inputs"]
    assert vis.pixel_values[:, 0].tolist() == [1.0, 1.0, 2.0, 2.0, 2.0]
    assert vis.image_grid_thw.tolist() == [[1, 1, 2], [1, 1, 3]]
    assert vis.pixel_values_videos is None and vis.video_grid_thw is None and vis.second_per_grid_ts is None
    assert set(vis.normalized_for_model()) == {"pixel_values", "image_grid_thw"}


# --------------------------------------------------------------------------- properties


@st.composite
def row_specs(draw):
    multiple = draw(st.sampled_from([1, 2, 4, 8, 16]))
    width = multiple * draw(st.integers(min_value=1, max_value=24))
    lengths = []
    used = 0
    for _ in range(draw(st.integers(min_value=1, max_value=8))):
        room = width - used
        if room < 1:
            break
        n = draw(st.integers(min_value=1, max_value=room))
        lengths.append(n)
        used += aligned_length(n, multiple)
    return lengths, multiple, width


def assert_row_contract(row, segments, lengths, multiple, width):
    """The batch contract of one THD row (docs/batch_contract.md): cu_seqlens, gaps, padding mask,
    labels / loss at segment ends, positions and mrope inside the row."""
    cu = row["cu_seqlens_q"].tolist()
    cu_pad = row["cu_seqlens_q_padded"].tolist()
    physical = [b - a for a, b in zip(cu_pad, cu_pad[1:])]
    assert row["input_ids"].shape == (1, width) and row["total_tokens"] == width
    assert [b - a for a, b in zip(cu, cu[1:])] == lengths
    assert cu_pad[0] == 0 and cu_pad[-1] == width
    assert all(p % multiple == 0 for p in physical)
    assert physical[:-1] == [aligned_length(n, multiple) for n in lengths[:-1]]
    assert row["max_seqlen_q"].item() == max(physical)

    real = torch.zeros(width, dtype=torch.bool)
    for seg, start, n in zip(segments, cu_pad, lengths):
        real[start : start + n] = True
        assert torch.equal(row["input_ids"][0, start : start + n], seg.input_ids)
        assert row["position_ids"][0, start : start + n].tolist() == list(range(n))
        assert torch.equal(row["mrope_position_ids"][:, 0, start : start + n], seg.mrope_position_ids)
        assert row["labels"][0, start + n - 1] == IGNORE_INDEX
        assert row["loss_mask"][0, start + n - 1] == 0
    assert torch.equal(row["padding_mask"][0], ~real)
    gaps = ~real
    assert bool((row["input_ids"][0, gaps] == PAD).all())
    assert bool((row["labels"][0, gaps] == IGNORE_INDEX).all())
    assert bool((row["loss_mask"][0, gaps] == 0).all())
    assert int(row["loss_mask"].sum()) == sum(lengths) - len(lengths)
    assert row["loss_tokens"].tolist() == [n - 1 for n in lengths]
    assert int(row["position_ids"].max()) < width and int(row["mrope_position_ids"].max()) < width
    assert torch.equal(row["position_ids"][0, torch.tensor(cu_pad[:-1])], torch.zeros(len(lengths), dtype=torch.int64))


@settings(max_examples=150, deadline=None)
@given(row_specs())
def test_row_invariants(spec):
    lengths, multiple, width = spec
    segments = [make_segment(f"s{i}", n, first_id=1000 * (i + 1)) for i, n in enumerate(lengths)]
    row = build_thd_row(segments, seq_length=width, pad_multiple=multiple, pad_token_id=PAD)
    assert_row_contract(row, segments, lengths, multiple, width)


@settings(max_examples=150, deadline=None)
@given(row_specs(), st.sampled_from([None, 1, 8, 24, 64]))
def test_variable_width_rows_keep_the_contract_and_have_no_tail(spec, width_multiple):
    """``fixed_width=False``: the row is the sum of aligned lengths rounded up to
    lcm(width_multiple, multiple), and meets the same contract as a fixed-width row."""
    lengths, multiple, seq_length = spec
    both = math.lcm(multiple, width_multiple or 1)
    seq_length = aligned_length(seq_length, both)  # the config requires seq_length % width_multiple == 0
    layout = RowLayout(seq_length=seq_length, pad_to_multiple_of=multiple, width_multiple=width_multiple, fixed_width=False)
    segments = [make_segment(f"s{i}", n, first_id=1000 * (i + 1)) for i, n in enumerate(lengths)]
    row = build_layout_row(segments, layout, pad_token_id=PAD)
    used = sum(aligned_length(n, multiple) for n in lengths)
    width = aligned_length(used, both)
    assert row_width(lengths, layout) == width and width - used < both
    assert_row_contract(row, segments, lengths, multiple, width)
    fixed = build_layout_row(segments, dataclasses.replace(layout, fixed_width=True), pad_token_id=PAD)
    assert fixed["total_tokens"] == seq_length
    for key in ("input_ids", "labels", "loss_mask", "position_ids", "padding_mask"):
        assert torch.equal(fixed[key][..., :width], row[key]), key


def test_row_width_golden():
    layout = RowLayout(seq_length=32, pad_to_multiple_of=4, width_multiple=8, fixed_width=False)
    assert row_width([5, 4], layout) == 16
    assert row_width([5, 4], dataclasses.replace(layout, fixed_width=True)) == 32
    assert row_width([8, 8], layout) == 16


@settings(max_examples=50, deadline=None)
@given(row_specs(), st.integers(min_value=0, max_value=4))
def test_pad_cu_seqlens_shapes(spec, extra):
    lengths, multiple, width = spec
    max_segments = len(lengths) + extra
    segments = [make_segment(f"s{i}", n) for i, n in enumerate(lengths)]
    plain = build_thd_row(segments, seq_length=width, pad_multiple=multiple, pad_token_id=PAD)
    fixed = build_thd_row(
        segments,
        seq_length=width,
        pad_multiple=multiple,
        pad_token_id=PAD,
        pad_cu_seqlens=True,
        max_segments=max_segments,
    )
    for key in ("cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded"):
        assert fixed[key].shape == (max_segments + 1,)
        n = len(lengths) + 1
        assert torch.equal(fixed[key][:n], plain[key])
        assert bool((fixed[key][n:] == plain[key][-1]).all())
    assert fixed["max_seqlen_q"].item() == width and fixed["max_seqlen_kv"].item() == width
    for key in ("input_ids", "labels", "loss_mask", "position_ids", "mrope_position_ids", "padding_mask"):
        assert torch.equal(fixed[key], plain[key])


# --------------------------------------------------------------------------- errors


def test_overfull_row_rejected():
    with pytest.raises(ValueError, match="seq_length=12"):
        build_thd_row([make_segment("a", 5), make_segment("b", 5)], seq_length=12, pad_multiple=4, pad_token_id=PAD)


def test_too_many_segments_rejected():
    segs = [make_segment(str(i), 2) for i in range(3)]
    with pytest.raises(ValueError, match="max_segments=2"):
        build_thd_row(segs, seq_length=8, pad_multiple=2, pad_token_id=PAD, max_segments=2)


def test_empty_row_rejected():
    with pytest.raises(ValueError, match="at least one sample"):
        build_thd_row([], seq_length=8, pad_multiple=2, pad_token_id=PAD)


def test_pad_cu_seqlens_needs_max_segments():
    with pytest.raises(ValueError, match="max_segments"):
        build_thd_row([make_segment("a", 2)], seq_length=8, pad_multiple=2, pad_token_id=PAD, pad_cu_seqlens=True)


def test_width_not_multiple_rejected():
    with pytest.raises(ValueError, match="divisible by pad_multiple"):
        build_thd_row([make_segment("a", 2)], seq_length=10, pad_multiple=4, pad_token_id=PAD)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("labels", torch.zeros(3, dtype=torch.int64)),
        ("loss_mask", torch.zeros(5)),
        ("mrope_position_ids", torch.zeros(3, 3, dtype=torch.int64)),
        ("mrope_position_ids", torch.zeros(4, dtype=torch.int64)),
    ],
)
def test_mismatched_segment_lengths_rejected(field, value):
    good = make_segment("bad", 4)
    kwargs = {
        "key": "bad",
        "input_ids": good.input_ids,
        "labels": good.labels,
        "loss_mask": good.loss_mask,
        "mrope_position_ids": good.mrope_position_ids,
        "visual": VisualInputs(),
    }
    kwargs[field] = value
    with pytest.raises(ValueError, match=f"segment 'bad': {field}"):
        PackedSegment(**kwargs)


def test_empty_segment_rejected():
    with pytest.raises(ValueError, match="at least one token"):
        make_segment("empty", 0)


def test_collate_rows_enforces_micro_batch_one():
    row = build_thd_row([make_segment("a", 2)], seq_length=4, pad_multiple=2, pad_token_id=PAD)
    assert collate_rows([row]) == row
    with pytest.raises(ValueError, match="micro-batch size 1"):
        collate_rows([row, row])
    with pytest.raises(ValueError, match="micro-batch size 1"):
        collate_rows([])


# --------------------------------------------------------------------------- VisualInputs


def test_visual_concat_videos_and_constants():
    const = {"image_mean": (0.5, 0.5, 0.5), "image_std": [0.5, 0.5, 0.5], "rescale_factor": 1 / 255}
    video = VisualInputs(
        pixel_values_videos=torch.zeros(4, 6, dtype=torch.uint8),
        video_grid_thw=torch.tensor([[1, 2, 2]]),
        second_per_grid_ts=torch.tensor([1.0]),
        **const,
    )
    image = VisualInputs(
        pixel_values=torch.ones(2, 6, dtype=torch.uint8), image_grid_thw=torch.tensor([[1, 1, 2]]), **const
    )
    merged = VisualInputs.concat([video, VisualInputs(), image, video])
    assert merged.pixel_values_videos.shape == (8, 6)
    assert merged.video_grid_thw.tolist() == [[1, 2, 2], [1, 2, 2]]
    assert merged.second_per_grid_ts.tolist() == [1.0, 1.0]
    assert merged.pixel_values.shape == (2, 6)
    assert merged.image_std.tolist() == [0.5, 0.5, 0.5] and merged.image_std.dtype == torch.float32
    assert VisualInputs.concat([VisualInputs(), VisualInputs()]) == VisualInputs()


def test_visual_concat_rejects_mixed_payloads():
    const = {"image_mean": (0.5,) * 3, "image_std": (0.5,) * 3, "rescale_factor": 1 / 255}
    u8 = VisualInputs(
        pixel_values=torch.zeros(1, 6, dtype=torch.uint8), image_grid_thw=torch.tensor([[1, 1, 1]]), **const
    )
    f32 = VisualInputs(pixel_values=torch.zeros(1, 6), image_grid_thw=torch.tensor([[1, 1, 1]]))
    with pytest.raises(ValueError, match="mixes dtypes"):
        VisualInputs.concat([u8, f32])
    other = VisualInputs(
        pixel_values=torch.zeros(1, 6, dtype=torch.uint8),
        image_grid_thw=torch.tensor([[1, 1, 1]]),
        image_mean=(0.4,) * 3,
        image_std=(0.5,) * 3,
        rescale_factor=1 / 255,
    )
    with pytest.raises(ValueError, match="different normalisation constants"):
        VisualInputs.concat([u8, other])


def test_visual_inputs_validation():
    with pytest.raises(ValueError, match="uint8 pixel payload without normalisation constants"):
        VisualInputs(pixel_values=torch.zeros(1, 6, dtype=torch.uint8), image_grid_thw=torch.tensor([[1, 1, 1]]))
    with pytest.raises(ValueError, match="given together"):
        VisualInputs(pixel_values=torch.zeros(1, 6))
    with pytest.raises(ValueError, match="go together"):
        VisualInputs(image_mean=(0.5,) * 3)
    with pytest.raises(ValueError, match="second_per_grid_ts"):
        VisualInputs(second_per_grid_ts=torch.tensor([1.0]))
    with pytest.raises(ValueError, match="one value per channel"):
        VisualInputs(image_mean=(0.5,) * 3, image_std=(0.5,) * 2, rescale_factor=1 / 255)


def test_visual_inputs_hold_only_tensors_or_none():
    """Megatron-Bridge moves every ``__dict__`` value with ``.cuda()``: nothing else may live there."""
    payload = VisualInputs(
        pixel_values=torch.zeros(1, 6, dtype=torch.uint8),
        image_grid_thw=torch.tensor([[1, 1, 1]]),
        image_mean=[0.5] * 3,
        image_std=(0.25,) * 3,
        rescale_factor=1 / 255,
    )
    assert all(value is None or isinstance(value, torch.Tensor) for value in payload.__dict__.values())
    assert payload.image_mean.dtype == payload.image_std.dtype == torch.float32
    assert payload.rescale_factor.dtype == torch.float64
    assert payload.image_mean.shape == (3,) and payload.rescale_factor.shape == ()
    assert all(value is None for value in VisualInputs().__dict__.values())
