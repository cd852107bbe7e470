"""One preallocated pixel payload per row: slots, zero-copy joining, identical pixels."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from energon_pack.config import PackingConfig
from energon_pack.core.samples import QwenVLChatSample
from tests.support.golden_media import GoldenSample, chat_sample
from energon_pack.data.synthetic import encode_image, encode_video
from energon_pack.runtime.task_encoder import QwenVLPackingTaskEncoder
from energon_pack.qwen.pixels import PixelSlots, allocate_row_pixels, patch_rows
from energon_pack.core.visual import VisualInputs, _joined


def test_patch_rows_sums_t_h_w() -> None:
    assert patch_rows(np.array([[1, 4, 6], [2, 2, 2]])) == 32
    assert patch_rows(None) == 0 and patch_rows(np.zeros((0, 3), np.int64)) == 0


@pytest.mark.parametrize("shared", [False, True])
def test_row_payload_is_cut_into_consecutive_slots(shared: bool) -> None:
    grids = [torch.tensor([[1, 2, 2]]), None, torch.tensor([[1, 2, 4], [1, 2, 2]])]
    slots = allocate_row_pixels(grids, [None, torch.tensor([[2, 2, 2]]), None], patch_dim=6, dtype=torch.uint8, shared=shared)
    assert [None if s.images is None else s.images.shape[0] for s in slots] == [4, None, 12]
    assert [None if s.videos is None else s.videos.shape[0] for s in slots] == [None, 8, None]
    payload = slots[0].images._base
    assert payload.shape == (16, 6) and payload.dtype == torch.uint8 and slots[2].images._base is payload
    assert payload.is_shared() == shared
    assert slots[2].images.data_ptr() == payload.data_ptr() + 4 * 6
    # A text-only row has no payload at all.
    assert allocate_row_pixels([None], [None], patch_dim=6, dtype=torch.uint8, shared=False) == [PixelSlots()]


def test_filled_slots_join_into_the_payload_without_a_copy() -> None:
    payload = torch.empty(6, 4)
    payload.copy_(torch.arange(24.0).reshape(6, 4))
    parts = [payload[:2], payload[2:5], payload[5:]]
    assert _joined(parts) is payload
    # A hole (a sample that failed to decode), a reordering or a foreign tensor: a real concatenation.
    for other in ([payload[:2], payload[5:]], [payload[2:5], payload[:2], payload[5:]], [payload[:2], payload[2:].clone()]):
        joined = _joined(other)
        assert joined is not payload and torch.equal(joined, torch.cat(other))


def _chat(images: list[bytes], videos: list[bytes]) -> QwenVLChatSample:
    content = [{"type": "image"} for _ in images] + [{"type": "video"} for _ in videos]
    content.append({"type": "text", "text": "Describe."})
    messages = [{"role": "user", "content": content}, {"role": "assistant", "content": [{"type": "text", "text": "A scene."}]}]
    return chat_sample(GoldenSample(messages, images, videos), "k")


@pytest.mark.parametrize("pixel_dtype", ["uint8", "float32"])
def test_pixels_written_into_the_row_payload_equal_per_sample_pixels(processor, pixel_dtype: str) -> None:
    rng = np.random.default_rng(0)

    def image(height: int, width: int) -> bytes:
        return encode_image(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), "JPEG", "RGB")

    frames = rng.integers(0, 256, (12, 64, 96, 3), dtype=np.uint8)
    chats = [
        _chat([image(300, 200), image(90, 500)], []),
        _chat([], []),
        _chat([image(120, 120)], [encode_video(frames, fps=6)]),
    ]
    encoder = QwenVLPackingTaskEncoder(PackingConfig(seq_length=16384, pixel_dtype=pixel_dtype), processor)
    prepared = [encoder.preencode_sample(chat) for chat in chats]
    assert [sample.skip_reason for sample in prepared] == [None] * 3
    alone = [encoder.postencode_sample(sample).segment.visual for sample in prepared]
    slots = encoder.allocate_row_pixels(prepared)
    in_row = [encoder.postencode_sample(sample, slot).segment.visual for sample, slot in zip(prepared, slots)]
    row = VisualInputs.concat(in_row)
    expected = VisualInputs.concat(alone)
    for name in ("pixel_values", "pixel_values_videos"):
        assert getattr(row, name).dtype == getattr(torch, pixel_dtype)
        assert torch.equal(getattr(row, name), getattr(expected, name)), name
    # The row's payload is the preallocated tensor itself.
    assert row.pixel_values is slots[0].images._base and row.pixel_values_videos is slots[2].videos._base


def test_fast_jpeg_decode_keeps_the_grid_and_stays_close_to_the_exact_path(processor) -> None:
    from energon_pack.qwen.geometry import VisionSpec, image_grid
    from energon_pack.qwen.pixels import decode_image, image_pixels
    from energon_pack.data.synthetic import _smooth_pixels
    from energon_pack.tools.bench_jpeg import psnr

    spec = VisionSpec.from_processor(processor)
    big = encode_image(_smooth_pixels(np.random.default_rng(1), 1800, 2400), "JPEG", "RGB")
    grid = np.array([image_grid(1800, 2400, spec)])
    exact = image_pixels(processor, [big], grid, uint8=True)
    fast = image_pixels(processor, [big], grid, uint8=True, fast_jpeg=True)
    assert fast.shape == exact.shape and not torch.equal(fast, exact)
    difference = fast.double() - exact.double()
    assert psnr(float((difference**2).sum()), difference.numel()) > 35
    # Decoded at reduced scale straight to the target size; a small JPEG or a PNG decodes exactly.
    target = (int(grid[0, 2]) * spec.patch_size, int(grid[0, 1]) * spec.patch_size)
    assert decode_image(big, draft_size=target).size == target
    small = encode_image(_smooth_pixels(np.random.default_rng(2), 200, 300), "JPEG", "RGB")
    assert decode_image(small, draft_size=(280, 196)).size == (300, 200)
    png = encode_image(_smooth_pixels(np.random.default_rng(3), 1800, 2400), "PNG", "RGB")
    assert decode_image(png, draft_size=target).size == (2400, 1800)


def test_psnr_of_equal_and_of_shifted_values() -> None:
    from energon_pack.tools.bench_jpeg import psnr

    assert psnr(0.0, 10) == float("inf") and round(psnr(4.0 * 100, 100), 2) == 42.11
