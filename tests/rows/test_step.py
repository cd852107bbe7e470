"""vlm_step adapter, CP split and uint8 patch normalisation."""

from __future__ import annotations

import dataclasses
import sys
import types

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from energon_pack.rows.step import PACKED_SEQ_FIELDS, thd_partition_indices, to_device_batch
from energon_pack.core.visual import VisualInputs, normalize_patches
from tests.support.thd_rows import CLIP_MEAN, CLIP_STD, make_row

TOKEN_KEYS = ("input_ids", "labels", "loss_mask", "position_ids", "padding_mask", "mrope_position_ids")
CU_KEYS = ("cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded")


def reference_partition(cu: list[int], cp: int, rank: int) -> list[int]:
    """Plain-loop statement of the TE load-balanced split."""
    out: list[int] = []
    for start, end in zip(cu, cu[1:]):
        chunk = (end - start) // (2 * cp)
        for c in (rank, 2 * cp - 1 - rank):
            out.extend(range(start + c * chunk, start + (c + 1) * chunk))
    return out


# --------------------------------------------------------------------------- CP split


def test_partition_golden():
    cu = torch.tensor([0, 8, 12], dtype=torch.int32)
    assert thd_partition_indices(cu, 12, 2, 0).tolist() == [0, 1, 6, 7, 8, 11]
    assert thd_partition_indices(cu, 12, 2, 1).tolist() == [2, 3, 4, 5, 9, 10]
    assert thd_partition_indices(cu, 12, 1, 0).tolist() == list(range(12))


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from([1, 2, 4]),
    st.lists(st.integers(min_value=0, max_value=6), min_size=1, max_size=8),
)
def test_partition_matches_reference_and_covers_row(cp, units):
    lengths = [u * 2 * cp for u in units]
    cu = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    total = cu[-1]
    parts = []
    for rank in range(cp):
        got = thd_partition_indices(torch.tensor(cu, dtype=torch.int32), total, cp, rank)
        assert got.dtype == torch.int64
        assert got.tolist() == reference_partition(cu, cp, rank)
        parts.append(got)
    assert sorted(torch.cat(parts).tolist()) == list(range(total))


def test_partition_rejects_unaligned_segments():
    with pytest.raises(ValueError, match="pad_to_multiple_of"):
        thd_partition_indices(torch.tensor([0, 6, 12]), 12, 2, 0)
    with pytest.raises(ValueError, match="cp_rank=2"):
        thd_partition_indices(torch.tensor([0, 8]), 8, 2, 2)
    with pytest.raises(ValueError, match="total_tokens=10"):
        thd_partition_indices(torch.tensor([0, 8]), 10, 2, 0)


# --------------------------------------------------------------------------- to_device_batch


def test_device_batch_keys_and_dtypes(monkeypatch):
    monkeypatch.setitem(sys.modules, "megatron.core.packed_seq_params", None)  # as without Megatron-Core
    row = make_row([5, 3], width=16, multiple=4, uint8=False)
    out = to_device_batch(row, "cpu")
    assert set(out) == {
        "tokens",
        *TOKEN_KEYS,
        "attention_mask",
        *CU_KEYS,
        "max_seqlen_q",
        "max_seqlen_kv",
        "total_tokens",
        "loss_tokens",
        "visual_inputs",
        "packed_seq_params",
        "__keys__",
        "segment_source",
    }
    assert out["tokens"] is out["input_ids"]
    assert out["attention_mask"] is None
    for key in TOKEN_KEYS + CU_KEYS + ("loss_tokens", "segment_source"):
        assert out[key].dtype == row[key].dtype and torch.equal(out[key], row[key]), key
    assert out["loss_tokens"].tolist() == [4, 2]
    for key in ("max_seqlen_q", "max_seqlen_kv"):
        assert out[key].device.type == "cpu" and out[key].dtype == torch.int32 and out[key].dim() == 0
    assert out["total_tokens"] == 16
    assert out["__keys__"] == ["s0", "s1"]
    params = out["packed_seq_params"]
    assert set(params) == set(PACKED_SEQ_FIELDS)
    assert params["qkv_format"] == "thd"
    assert params["max_seqlen_q"] == 8 and isinstance(params["max_seqlen_q"], int)
    assert params["cu_seqlens_q_padded"].tolist() == [0, 8, 16]
    vis = out["visual_inputs"]
    assert isinstance(vis, VisualInputs) and vis.pixel_values.dtype == torch.float32
    assert set(vis.normalized_for_model()) == {"pixel_values", "image_grid_thw"}


def test_device_batch_keeps_what_row_metrics_reads():
    row = make_row([5, 3], width=16, multiple=4, uint8=False)
    row["__stats__"], row["__loader_wait_s__"] = {"samples_in": 3, "skipped": {"overlong": 1}}, 0.25
    out = to_device_batch(row, "cpu", cp_size=2, cp_rank=1, split_for_cp=True)
    assert out["segment_source"].tolist() == [0, 0]  # whole under CP, like loss_tokens
    assert out["__stats__"] is row["__stats__"] and out["__loader_wait_s__"] == 0.25


def test_uint8_payload_equals_float_payload():
    float_out = to_device_batch(make_row([7, 6], width=16, multiple=2, uint8=False), "cpu")
    uint8_row = make_row([7, 6], width=16, multiple=2, uint8=True)
    assert uint8_row["visual_inputs"].pixel_values.dtype == torch.uint8
    uint8_out = to_device_batch(uint8_row, "cpu")
    a = float_out["visual_inputs"].normalized_for_model()
    b = uint8_out["visual_inputs"].normalized_for_model()
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key
    assert uint8_out["visual_inputs"].rescale_factor is None
    # normalized_for_model on the raw uint8 payload gives the same float pixels.
    assert torch.equal(uint8_row["visual_inputs"].normalized_for_model()["pixel_values"], a["pixel_values"])


def test_uint8_payload_moved_field_by_field_normalises_like_float():
    """The way Megatron-Bridge's get_batch_from_iterator moves a payload: each ``__dict__`` value on its own."""
    float_row = make_row([7, 6], width=16, multiple=2, uint8=False)
    uint8_row = make_row([7, 6], width=16, multiple=2, uint8=True)
    moved = uint8_row["visual_inputs"]
    for name, value in list(moved.__dict__.items()):
        moved.__dict__[name] = value.clone() if value is not None else None
    got = moved.normalized_for_model()
    want = float_row["visual_inputs"].normalized_for_model()
    assert got.keys() == want.keys() == {"pixel_values", "image_grid_thw"}
    for key in want:
        assert got[key].dtype == want[key].dtype and torch.equal(got[key], want[key]), key


@pytest.mark.parametrize("cp", [2, 4])
def test_cp_split_consistency(cp):
    row = make_row([5, 11, 3], width=48, multiple=2 * cp, uint8=False)
    full = to_device_batch(row, "cpu")
    shards = [to_device_batch(row, "cpu", cp_size=cp, cp_rank=r, split_for_cp=True) for r in range(cp)]
    for rank, shard in enumerate(shards):
        keep = thd_partition_indices(row["cu_seqlens_q_padded"], 48, cp, rank)
        for key in TOKEN_KEYS:
            assert shard[key].shape[-1] == 48 // cp, key
            assert torch.equal(shard[key], full[key][..., keep]), key
        for key in CU_KEYS + ("max_seqlen_q", "max_seqlen_kv", "loss_tokens"):
            assert torch.equal(shard[key], full[key]), key
        assert shard["total_tokens"] == 48
        assert torch.equal(shard["visual_inputs"].pixel_values, full["visual_inputs"].pixel_values)
    order = torch.cat([thd_partition_indices(row["cu_seqlens_q_padded"], 48, cp, r) for r in range(cp)])
    for key in TOKEN_KEYS:
        merged = torch.empty_like(full[key])
        merged[..., order] = torch.cat([s[key] for s in shards], dim=-1)
        assert torch.equal(merged, full[key]), key


def test_cp_split_rejects_row_not_aligned_for_cp():
    row = make_row([5, 3], width=16, multiple=2, uint8=False)
    with pytest.raises(ValueError, match="divisible by 2\\*cp=4"):
        to_device_batch(row, "cpu", cp_size=2, cp_rank=0, split_for_cp=True)


def test_rejects_batched_rows():
    row = make_row([3], width=4, multiple=1, uint8=False)
    row = dict(row, input_ids=row["input_ids"].expand(2, 4))
    with pytest.raises(ValueError, match="micro-batch size 1"):
        to_device_batch(row, "cpu")


def test_uses_megatron_packed_seq_params_when_importable(monkeypatch):
    @dataclasses.dataclass
    class PackedSeqParams:  # same keyword names as megatron.core.packed_seq_params.PackedSeqParams
        qkv_format: str | None = None
        cu_seqlens_q: torch.Tensor | None = None
        cu_seqlens_kv: torch.Tensor | None = None
        cu_seqlens_q_padded: torch.Tensor | None = None
        cu_seqlens_kv_padded: torch.Tensor | None = None
        max_seqlen_q: int | None = None
        max_seqlen_kv: int | None = None

    module = types.ModuleType("megatron.core.packed_seq_params")
    module.PackedSeqParams = PackedSeqParams
    monkeypatch.setitem(sys.modules, "megatron.core.packed_seq_params", module)
    out = to_device_batch(make_row([5, 3], width=16, multiple=4, uint8=False), "cpu")
    params = out["packed_seq_params"]
    assert isinstance(params, PackedSeqParams)
    assert params.qkv_format == "thd" and params.max_seqlen_kv == 8
    assert params.cu_seqlens_kv is out["cu_seqlens_kv"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_transfer_matches_cpu():
    row = make_row([7, 6], width=16, multiple=2, uint8=True)
    cpu = to_device_batch(row, "cpu")
    gpu = to_device_batch(row, "cuda")
    torch.cuda.synchronize()
    for key in TOKEN_KEYS + CU_KEYS:
        assert gpu[key].is_cuda and torch.equal(gpu[key].cpu(), cpu[key]), key
    assert gpu["max_seqlen_q"].device.type == "cpu"
    for key, value in gpu["visual_inputs"].normalized_for_model().items():
        assert value.is_cuda and torch.equal(value.cpu(), cpu["visual_inputs"].normalized_for_model()[key]), key


# --------------------------------------------------------------------------- normalize_patches


def test_normalize_patches_golden():
    x = torch.tensor([[0, 255, 0, 255, 0, 255]], dtype=torch.uint8)
    assert normalize_patches(x, (0.5,) * 3, (0.5,) * 3, 1 / 255).tolist() == [[-1.0, 1.0, -1.0, 1.0, -1.0, 1.0]]


@settings(max_examples=30, deadline=None)
@given(st.integers(min_value=1, max_value=5), st.sampled_from([3 * 2 * 2 * 2, 3 * 2 * 14 * 14]), st.integers(0, 2**31))
def test_normalize_patches_matches_rescale_then_normalize(rows, width, seed):
    x = torch.randint(0, 256, (rows, width), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))
    channel = torch.arange(width) // (width // 3)
    mean = torch.tensor(CLIP_MEAN, dtype=torch.float64)[channel]
    std = torch.tensor(CLIP_STD, dtype=torch.float64)[channel]
    expected = (x.double() / 255 - mean) / std
    got = normalize_patches(x, CLIP_MEAN, CLIP_STD, 1 / 255)
    assert got.dtype == torch.float32
    assert torch.allclose(got.double(), expected, rtol=0, atol=1e-6)


def test_normalize_patches_matches_hf_qwen2_vl_processors():
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import (
        Qwen2VLImageProcessor,
    )
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import (
        Qwen2VLVideoProcessor,
    )

    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (60, 90, 3), dtype=np.uint8))
    proc = Qwen2VLImageProcessor()
    ref = proc(images=[image], return_tensors="pt")["pixel_values"]
    raw = proc(images=[image], return_tensors="pt", do_rescale=False, do_normalize=False)["pixel_values"]
    assert raw.dtype == torch.uint8
    assert torch.equal(normalize_patches(raw, proc.image_mean, proc.image_std, proc.rescale_factor), ref)

    video = rng.integers(0, 256, (4, 56, 84, 3), dtype=np.uint8)
    vproc = Qwen2VLVideoProcessor()
    kwargs = {"return_tensors": "pt", "do_sample_frames": False}
    if hasattr(Qwen2VLVideoProcessor, "cap_pixels_per_frame"):  # the option exists from transformers 5.16 on
        kwargs["cap_pixels_per_frame"] = False
    vref = vproc(videos=[video], **kwargs)["pixel_values_videos"]
    vraw = vproc(videos=[video], do_rescale=False, do_normalize=False, **kwargs)["pixel_values_videos"]
    assert vraw.dtype == torch.uint8
    assert torch.equal(normalize_patches(vraw, vproc.image_mean, vproc.image_std, vproc.rescale_factor), vref)


def test_normalize_patches_rejects_bad_layout():
    with pytest.raises(ValueError, match="not divisible by channels=3"):
        normalize_patches(torch.zeros(2, 7, dtype=torch.uint8), CLIP_MEAN, CLIP_STD, 1 / 255)
