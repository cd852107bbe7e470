"""Oracle: a packed THD row through a real Hugging Face Qwen2.5-VL equals each sample run alone.

Rows are built exactly as the plugin builds them (``preencode_sample`` -> ``postencode_sample``
-> ``pack_selected_samples`` -> ``batch``). The packed run calls a tiny random-weight
``Qwen2_5_VLForConditionalGeneration`` once on the whole row with the row's pixels and grids,
``mrope_position_ids`` as explicit 3-D positions (transformers 5.24 then skips ``get_rope_index``)
and an attention mask built from ``cu_seqlens_q`` / ``cu_seqlens_q_padded``. The unpacked run
gives each sample, alone, to the HF processor (images as opened PIL images, video frames decoded
here with PyAV at hand-computed indices, ``do_sample_frames=False``) and to the same model with
its default positions (the model computes M-RoPE itself from ``mm_token_type_ids``). The logits
of every segment's real tokens must agree within 1e-4.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any

import av
import numpy as np
import pytest
import torch
from PIL import Image
from transformers.video_utils import VideoMetadata

from energon_pack.config import PackingConfig
from energon_pack.rows.encoded import PreparedSample
from energon_pack.qwen.processor import load_processor
from energon_pack.core.samples import QwenVLChatSample
from energon_pack.data.synthetic import encode_image, encode_video
from energon_pack.runtime.task_encoder import QwenVLPackingTaskEncoder
from tests.tiny_qwen import real_token_positions, thd_attention_bias, tiny_qwen25_vl

# Slow: the model oracle: a tiny random-weight Qwen2.5-VL forward per case.
pytestmark = pytest.mark.slow

ATOL = 1e-4
# Small pixel limits keep the video tokens few (the default video minimum is 100352 pixels/frame).
MIN_PIXELS, MAX_PIXELS = 56 * 56, 224 * 224
#: Row width of the multimodal case: its 5 samples take 257 real tokens, 232 aligned slots.
MULTIMODAL_WIDTH = 320


@dataclass(frozen=True)
class Video:
    """A synthetic MP4 of ``frames`` random frames at ``fps``; ``indices``: hand-computed sampled frames."""

    frames: int
    height: int
    width: int
    fps: int
    indices: tuple[int, ...]


@dataclass(frozen=True)
class Case:
    """One chat sample: typed messages, images as (height, width, format, PIL mode), videos."""

    key: str
    conversation: list[dict[str, Any]]
    images: list[tuple[int, int, str, str]] = field(default_factory=list)
    videos: list[Video] = field(default_factory=list)


def _text(text: str) -> dict[str, str]:
    return {"type": "text", "text": text}


def _message(role: str, *parts: Any) -> dict[str, Any]:
    return {"role": role, "content": [_text(p) if isinstance(p, str) else p for p in parts]}


IMAGE, VIDEO = {"type": "image"}, {"type": "video"}

# Frame indices (docs/batch_contract.md): n = T / fps * 2 clamped to [4, T], floored to even,
# indices round(linspace(0, T - 1, n)).
#  10 frames at 4 fps: n = 5 -> 4 frames, linspace(0, 9, 4) = 0, 3, 6, 9; second_per_grid_ts =
#  2 / (4 / 10 * 4) = 1.25, so the two temporal grid steps sit at long(i * 2 * 1.25) = 0, 2.
#  8 frames at 3 fps: n = 5.33 -> 4 frames, linspace(0, 7, 4) = 0, 2.33, 4.67, 7 -> 0, 2, 5, 7;
#  second_per_grid_ts = 2 / (4 / 8 * 3) = 1.33 -> temporal steps 0, 2.
MULTIMODAL_CASES = [
    Case("one_image", [_message("user", IMAGE, "What is this?"), _message("assistant", "A picture.")],
         images=[(56, 84, "PNG", "RGB")]),
    Case("text_only", [_message("system", "Be brief."), _message("user", "Hello there, how are you?"),
                       _message("assistant", "Fine."), _message("user", "Sure?"), _message("assistant", "Yes.")]),
    Case("video", [_message("user", VIDEO, "Describe the clip."), _message("assistant", "Noise.")],
         videos=[Video(frames=10, height=64, width=96, fps=4, indices=(0, 3, 6, 9))]),
    Case("multi_image", [_message("user", IMAGE, "and", IMAGE, "differ?"), _message("assistant", "Yes, two.")],
         images=[(224, 168, "JPEG", "RGB"), (84, 112, "PNG", "RGBA")]),
    Case("image_and_video", [_message("user", IMAGE, VIDEO, "Same scene?"), _message("assistant", "No.")],
         images=[(70, 100, "JPEG", "L")],
         videos=[Video(frames=8, height=56, width=56, fps=3, indices=(0, 2, 5, 7))]),
]

TEXT_CASES = [
    Case("t0", [_message("user", "Count to three."), _message("assistant", "One, two, three.")]),
    Case("t1", [_message("system", "You answer in French."), _message("user", "Good morning!"),
                _message("assistant", "Bonjour !")]),
    Case("t2", [_message("user", "2+2?"), _message("assistant", "4"), _message("user", "And 3+3?"),
                _message("assistant", "6, of course.")]),
]


@dataclass(frozen=True)
class Media:
    """Compressed media bytes of a case (what the dataset stores)."""

    images: list[bytes]
    videos: list[bytes]


def _make_media(case: Case, rng: np.random.Generator) -> Media:
    images = [
        encode_image(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), fmt, mode) for h, w, fmt, mode in case.images
    ]
    videos = [
        encode_video(rng.integers(0, 256, (v.frames, v.height, v.width, 3), dtype=np.uint8), v.fps)
        for v in case.videos
    ]
    return Media(images=images, videos=videos)


@dataclass(frozen=True)
class PackedCase:
    """A packed row and, per segment, the prepared sample and the unpacked HF inputs (row order)."""

    row: dict[str, Any]
    prepared: list[PreparedSample]
    references: list[Any]


def _encoder(
    processor: Any, seq_length: int, pad_to_multiple_of: int, pixel_dtype: str = "float32"
) -> QwenVLPackingTaskEncoder:
    """The plugin's task encoder for rows of width ``seq_length``, segments aligned to ``pad_to_multiple_of``."""
    config = PackingConfig(seq_length=seq_length, pad_to_multiple_of=pad_to_multiple_of, pixel_dtype=pixel_dtype)
    return QwenVLPackingTaskEncoder(config, processor)


def _row(encoder: QwenVLPackingTaskEncoder, prepared: list[PreparedSample]) -> dict[str, Any]:
    """The THD row of ``prepared`` samples, built as the plugin's packing stage does."""
    return encoder.batch([encoder.pack_selected_samples([encoder.postencode_sample(p) for p in prepared])])


def _pack(processor: Any, cases: list[Case], *, seq_length: int, pad_to_multiple_of: int) -> PackedCase:
    """Encode ``cases`` with the plugin's task encoder into one row; build each unpacked reference."""
    encoder = _encoder(processor, seq_length, pad_to_multiple_of)
    rng = np.random.default_rng(0)
    prepared, references = [], []
    for case in cases:
        media = _make_media(case, rng)
        sample = QwenVLChatSample(
            __key__=case.key,
            __restore_key__=(),
            __subflavors__=None,
            __sources__=None,
            conversation=case.conversation,
            images=media.images,
            videos=media.videos,
        )
        ready = encoder.preencode_sample(sample)
        assert ready.skip_reason is None, f"{case.key}: {ready.skip_reason}"
        timings = [(t.total_frames, t.fps, t.frame_indices) for t in ready.video_timings or []]
        assert timings == [(v.frames, v.fps, v.indices) for v in case.videos], case.key
        prepared.append(ready)
        references.append(_reference_inputs(processor, case, media))
    return PackedCase(row=_row(encoder, prepared), prepared=prepared, references=references)


def _decode_frames(data: bytes, indices: tuple[int, ...]) -> np.ndarray:
    """All frames of the first video stream decoded with PyAV as rgb24, then the chosen ones [n, H, W, 3]."""
    with av.open(io.BytesIO(data)) as container:
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    return np.stack([frames[i] for i in indices])


def _reference_inputs(processor: Any, case: Case, media: Media) -> Any:
    """The HF processor's inputs for ``case`` alone (docs/batch_contract.md reference call)."""
    kwargs: dict[str, Any] = {}
    if media.images:
        kwargs["images"] = [Image.open(io.BytesIO(data)) for data in media.images]
    if media.videos:
        kwargs["videos"] = [_decode_frames(data, v.indices) for data, v in zip(media.videos, case.videos)]
        kwargs["video_metadata"] = [
            VideoMetadata(total_num_frames=v.frames, fps=v.fps, frames_indices=list(v.indices)) for v in case.videos
        ]
        kwargs["do_sample_frames"] = False
    text = processor.apply_chat_template(case.conversation)
    return processor(text=[text], return_tensors="pt", **kwargs)


@torch.no_grad()
def _packed_logits(model: torch.nn.Module, row: dict[str, Any], **overrides: Any) -> torch.Tensor:
    """Logits [n_real, V] of the row's real tokens, from one forward over the whole row [1, W].

    Default: ``mrope_position_ids`` [3, 1, W] and the THD block-diagonal causal mask;
    ``overrides`` replace ``position_ids`` / ``attention_mask``.
    """
    width = row["input_ids"].shape[1]
    cu_real, cu_padded = row["cu_seqlens_q"], row["cu_seqlens_q_padded"]
    inputs = dict(
        input_ids=row["input_ids"],
        position_ids=row["mrope_position_ids"],
        attention_mask=thd_attention_bias(cu_real, cu_padded, width),
    )
    inputs.update(overrides)
    out = model(
        **inputs,
        **row["visual_inputs"].normalized_for_model(),
        logits_to_keep=real_token_positions(cu_real, cu_padded),
        use_cache=False,
    )
    return out.logits[0]


@torch.no_grad()
def _unpacked_logits(model: torch.nn.Module, inputs: Any) -> torch.Tensor:
    """Logits [L, V] of one sample run alone with the model's own positions."""
    return model(**inputs, use_cache=False).logits[0]


def _split(logits: torch.Tensor, row: dict[str, Any]) -> list[torch.Tensor]:
    """Real-token logits [n_real, V] -> one [L_i, V] block per segment."""
    cu_real = row["cu_seqlens_q"]
    return list(torch.split(logits, (cu_real[1:] - cu_real[:-1]).tolist()))


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return tiny_qwen25_vl(seed=0)


@pytest.fixture(scope="module")
def small_processor() -> Any:
    return load_processor(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)


@pytest.fixture(scope="module")
def multimodal(small_processor, model) -> tuple[PackedCase, list[torch.Tensor]]:
    """The multimodal row (W=320, segments aligned to 8) and each sample's unpacked logits."""
    packed = _pack(small_processor, MULTIMODAL_CASES, seq_length=MULTIMODAL_WIDTH, pad_to_multiple_of=8)
    return packed, [_unpacked_logits(model, ref) for ref in packed.references]


def test_attention_bias_golden():
    """The oracle's mask: causal inside each segment's real tokens, gap tokens see only themselves."""
    cu_real, cu_padded = torch.tensor([0, 2, 3]), torch.tensor([0, 2, 4])
    allowed = thd_attention_bias(cu_real, cu_padded, 4)[0, 0] == 0
    expected = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]], dtype=torch.bool)
    assert torch.equal(allowed, expected)
    assert real_token_positions(torch.tensor([0, 2, 3]), torch.tensor([0, 4, 8])).tolist() == [0, 1, 4]


def test_row_matches_the_unpacked_processor_outputs(multimodal):
    """Tokens, gaps and the vision tower's inputs of the packed row are the per-sample HF ones, concatenated."""
    packed, _ = multimodal
    row, refs = packed.row, packed.references
    assert row["__keys__"] == [case.key for case in MULTIMODAL_CASES]
    keep = real_token_positions(row["cu_seqlens_q"], row["cu_seqlens_q_padded"])
    assert torch.equal(row["input_ids"][0, keep], torch.cat([ref["input_ids"][0] for ref in refs]))
    gaps = torch.ones(row["input_ids"].shape[1], dtype=torch.bool)
    gaps[keep] = False
    assert torch.equal(row["padding_mask"][0], gaps)
    assert gaps[: row["cu_seqlens_q_padded"][-2]].any() and gaps[-1]  # alignment gaps and the tail

    visual = row["visual_inputs"].normalized_for_model()
    for name in ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts"):
        expected = torch.cat([ref[name] for ref in refs if name in ref])
        assert visual[name].dtype == expected.dtype, name
        assert torch.equal(visual[name], expected), name


@pytest.mark.parametrize("pixel_dtype", ["float32", "uint8"])
def test_packed_row_logits_equal_unpacked_logits(multimodal, model, small_processor, pixel_dtype):
    """One forward over the THD row (explicit M-RoPE + cu_seqlens mask) = each sample alone.

    With ``pixel_dtype="uint8"`` the row carries resized uint8 patches that
    ``normalized_for_model`` rescales and normalises: the logits must not change.
    """
    packed, unpacked = multimodal
    row = packed.row
    if pixel_dtype == "uint8":
        row = _row(_encoder(small_processor, MULTIMODAL_WIDTH, 8, pixel_dtype), packed.prepared)
        assert row["visual_inputs"].pixel_values.dtype == torch.uint8
    segments = _split(_packed_logits(model, row), row)
    for case, got, expected in zip(MULTIMODAL_CASES, segments, unpacked):
        torch.testing.assert_close(got, expected, atol=ATOL, rtol=0, msg=lambda m, k=case.key: f"{k}: {m}")


def test_hf_native_packing_path_agrees(multimodal, model):
    """The row also drops into HF's own packed path: [4, 1, W] positions (text row first), no mask.

    transformers builds the block-diagonal mask from restarts of the text row (``position_ids``);
    gap tokens continue their segment's count, so they only follow that segment's real tokens.
    """
    packed, unpacked = multimodal
    row = packed.row
    positions = torch.cat([row["position_ids"][None], row["mrope_position_ids"]])
    segments = _split(_packed_logits(model, row, position_ids=positions, attention_mask=None), row)
    for case, got, expected in zip(MULTIMODAL_CASES, segments, unpacked):
        torch.testing.assert_close(got, expected, atol=ATOL, rtol=0, msg=lambda m, k=case.key: f"{k}: {m}")


def test_oracle_sees_wrong_vision_positions(multimodal, model):
    """Control: 1-D text positions instead of M-RoPE leave text-only segments equal but break vision ones."""
    packed, unpacked = multimodal
    row = packed.row
    segments = _split(_packed_logits(model, row, position_ids=row["position_ids"]), row)
    for case, got, expected in zip(MULTIMODAL_CASES, segments, unpacked):
        error = (got - expected).abs().max().item()
        if case.images or case.videos:
            assert error > 100 * ATOL, case.key
        else:
            assert error <= ATOL, case.key


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["online", "in_batch"])
def test_variable_width_rows_equal_unpacked_logits(multimodal, model, small_processor, mode):
    """``fixed_width=False`` rows (online / planned) and in-batch rows: as wide as their aligned
    samples rounded up to ``width_multiple``, same tokens, labels, loss and logits as the
    fixed-width row, which in turn equal each sample run alone."""
    packed, unpacked = multimodal
    k = len(packed.prepared)
    config = PackingConfig(
        seq_length=MULTIMODAL_WIDTH, pad_to_multiple_of=8, fixed_width=False, width_multiple=16, mode=mode,
        micro_batch_size=k if mode == "in_batch" else 1,
    )
    encoder = QwenVLPackingTaskEncoder(config, small_processor)
    row = encoder.encode_row(packed.prepared) if mode == "in_batch" else _row(encoder, packed.prepared)
    width = row["input_ids"].shape[1]
    cu_real, cu_padded = packed.row["cu_seqlens_q"].tolist(), packed.row["cu_seqlens_q_padded"].tolist()
    used = cu_padded[-2] + -(-(cu_real[-1] - cu_real[-2]) // 8) * 8  # aligned slots of all segments
    assert width == -(-used // 16) * 16 < MULTIMODAL_WIDTH and row["total_tokens"] == width
    for key in ("input_ids", "labels", "loss_mask", "position_ids", "padding_mask"):
        assert torch.equal(row[key], packed.row[key][..., :width]), key
    assert torch.equal(row["cu_seqlens_q"], packed.row["cu_seqlens_q"])
    segments = _split(_packed_logits(model, row), row)
    for case, got, expected in zip(MULTIMODAL_CASES, segments, unpacked):
        torch.testing.assert_close(got, expected, atol=ATOL, rtol=0, msg=lambda m, k=case.key: f"{k}: {m}")


@pytest.mark.parametrize(("seq_length", "pad_to_multiple_of"), [(160, 16), (112, 4)])
def test_text_rows_with_gaps_equal_unpacked_logits(small_processor, model, seq_length, pad_to_multiple_of):
    """Text-only rows of three segments with alignment gaps and a tail; a plain causal mask must fail."""
    packed = _pack(small_processor, TEXT_CASES, seq_length=seq_length, pad_to_multiple_of=pad_to_multiple_of)
    row = packed.row
    lengths = (row["cu_seqlens_q"][1:] - row["cu_seqlens_q"][:-1]).tolist()
    physical = (row["cu_seqlens_q_padded"][1:] - row["cu_seqlens_q_padded"][:-1]).tolist()
    assert sum(p > n for n, p in zip(lengths, physical)) >= 2, (lengths, physical)  # gaps and the tail

    unpacked = [_unpacked_logits(model, ref) for ref in packed.references]
    for case, got, expected in zip(TEXT_CASES, _split(_packed_logits(model, row), row), unpacked):
        torch.testing.assert_close(got, expected, atol=ATOL, rtol=0, msg=lambda m, k=case.key: f"{k}: {m}")

    causal = torch.full((seq_length, seq_length), torch.finfo(torch.float32).min).triu(1)[None, None]
    leaky = _split(_packed_logits(model, row, attention_mask=causal), row)
    for got, expected in zip(leaky[1:], unpacked[1:]):
        assert (got - expected).abs().max().item() > 100 * ATOL
