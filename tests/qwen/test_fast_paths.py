"""The issue-24 fast paths give the same bytes as the paths they replace: patches written straight
into the payload (``qwen.pixels.ImagePatcher``, ``VideoPatcher``, ``patchify_into``) and tokenisation between
placeholders (``qwen.template.SplitTokenizer``)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from energon_pack.qwen.family import vision_rules
from energon_pack.qwen.fit import media_geometry
from energon_pack.qwen.geometry import VisionSpec
from energon_pack.qwen.media import ImageInfo
from energon_pack.qwen.pixels import ImagePatcher, VideoPatcher, image_pixels, patchify_into, video_pixels
from energon_pack.qwen.processor import load_processor
from energon_pack.qwen.template import ChatMarkers, SplitTokenizer, VideoTiming, tokenize_conversation


@pytest.fixture(scope="module")
def processor():
    return load_processor()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(gh=st.integers(1, 6), gw=st.integers(1, 6), patch=st.sampled_from([14, 16]), t=st.sampled_from([1, 2]),
       seed=st.integers(0, 2**16))
def test_patchify_into_equals_hf_patchify(processor, gh, gw, patch, t, seed):
    shape = (3, 2 * gh * patch, 2 * gw * patch)
    image = torch.from_numpy(np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8))
    expected, _, _ = processor.image_processor.patchify(image[None], patch_size=patch, merge_size=2, temporal_patch_size=t)
    for source in (image, image.permute(1, 2, 0).contiguous().permute(2, 0, 1)):  # contiguous and channels-last
        out = torch.empty_like(expected[0])
        patchify_into(source, out, patch_size=patch, merge_size=2, temporal_patch_size=t)
        assert torch.equal(out, expected[0])


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(groups=st.integers(1, 3), gh=st.integers(1, 4), gw=st.integers(1, 4), patch=st.sampled_from([14, 16]),
       t=st.sampled_from([1, 2]), seed=st.integers(0, 2**16))
def test_patchify_into_equals_hf_patchify_of_a_clip(processor, groups, gh, gw, patch, t, seed):
    shape = (groups * t, 3, 2 * gh * patch, 2 * gw * patch)
    clip = torch.from_numpy(np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8))
    expected, *_ = processor.video_processor.patchify(clip[None], patch_size=patch, merge_size=2, temporal_patch_size=t)
    for source in (clip, clip.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)):  # contiguous and channels-last
        out = torch.empty_like(expected[0])
        patchify_into(source, out, patch_size=patch, merge_size=2, temporal_patch_size=t)
        assert torch.equal(out, expected[0])


def test_patchify_into_refuses_a_wrong_slot():
    with pytest.raises(ValueError, match="expected contiguous"):
        patchify_into(torch.zeros(3, 28, 28, dtype=torch.uint8), torch.empty(5, 1176, dtype=torch.uint8),
                      patch_size=14, merge_size=2, temporal_patch_size=2)
    with pytest.raises(ValueError, match="3 frames cannot be patchified 2 frames at a time"):
        patchify_into(torch.zeros(3, 3, 28, 28, dtype=torch.uint8), torch.empty(4, 1176, dtype=torch.uint8),
                      patch_size=14, merge_size=2, temporal_patch_size=2)


def _image(height, width, mode, seed):
    from PIL import Image

    image = Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 4), dtype=np.uint8), "RGBA")
    return image.convert("RGB").quantize(32) if mode == "P" else image.convert(mode)


FAMILIES = ("qwen2.5-vl", "qwen3-vl", "qwen3.5")


@pytest.fixture(scope="module", params=FAMILIES)
def family_processor(request):
    """Each family's offline processor (Qwen3-VL and Qwen3.5/3.6: patch 16, their own video processor)."""
    from tests.support.hf_reference import PROCESSOR_FIXTURES

    return request.getfixturevalue(PROCESSOR_FIXTURES[request.param])


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(height=st.integers(20, 1500), width=st.integers(20, 1500), mode=st.sampled_from(["RGB", "RGBA", "L", "P", "LA"]),
       seed=st.integers(0, 2**16))
def test_image_patcher_equals_the_processor(family_processor, height, width, mode, seed):
    if max(height, width) / min(height, width) > 200:
        return
    patcher = ImagePatcher.for_processor(family_processor)
    assert patcher is not None
    image = _image(height, width, mode, seed)
    expected = family_processor.image_processor(images=[image], return_tensors="pt", do_rescale=False, do_normalize=False)
    out = torch.empty_like(expected["pixel_values"])
    assert list(patcher(image, out)) == expected["image_grid_thw"][0].tolist()
    assert torch.equal(out, expected["pixel_values"])


def test_image_pixels_with_the_patcher_equals_the_processor_path(processor):
    import io

    datas = []
    for height, width in ((300, 200), (64, 900)):
        buffer = io.BytesIO()
        _image(height, width, "RGB", height).save(buffer, format="PNG")
        datas.append(buffer.getvalue())
    grids = np.array([
        processor.image_processor(images=[_image(h, w, "RGB", h)], return_tensors="pt")["image_grid_thw"][0].numpy()
        for h, w in ((300, 200), (64, 900))
    ])
    rows = int(grids.prod(axis=1).sum())
    outs = [torch.empty((rows, 1176), dtype=torch.uint8) for _ in range(2)]
    image_pixels(processor, datas, grids, uint8=True, out=outs[0])
    image_pixels(processor, datas, grids, uint8=True, out=outs[1], patcher=ImagePatcher.for_processor(processor))
    assert torch.equal(outs[0], outs[1])


def test_image_patcher_probes_once_and_leaves_the_processor_serialisable(processor, monkeypatch):
    assert ImagePatcher.for_processor(processor) is not None
    monkeypatch.setattr(ImagePatcher, "_probe", classmethod(lambda cls, image_processor: pytest.fail("probed again")))
    assert ImagePatcher.for_processor(processor) is not None
    assert "ImagePatcher" not in processor.image_processor.to_json_string()


def test_image_patcher_refuses_other_processors(processor):
    class OtherImageProcessor:
        size = {"shortest_edge": 1, "longest_edge": 2}
        resample = patch_size = merge_size = temporal_patch_size = 2

    class Other:
        image_processor = OtherImageProcessor()

    assert ImagePatcher.for_processor(Other()) is None


def _clip_timing(frames):
    return VideoTiming(total_frames=frames, fps=10.0, frame_indices=tuple(range(frames)))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frames=st.integers(1, 9), height=st.integers(16, 700), width=st.integers(16, 700), seed=st.integers(0, 2**16),
       uint8=st.booleans())
def test_video_patcher_resizing_frame_by_frame_equals_the_processor(family_processor, frames, height, width, seed, uint8):
    """The processor resizes a clip as one batch; resizing each frame on its own (as the frames are
    decoded) gives the same bytes, uint8 and float32 (rescaled and normalised) alike, every family."""
    spec = VisionSpec.from_processor(family_processor)
    if vision_rules(spec.family) == "qwen3-vl":
        frames = max(frames, spec.temporal_patch_size)  # Qwen3-VL refuses clips shorter than T
    patcher = VideoPatcher.for_processor(family_processor)
    assert patcher is not None
    clip = np.random.default_rng(seed).integers(0, 256, (frames, height, width, 3), dtype=np.uint8)
    expected = family_processor.video_processor(
        videos=[clip], video_metadata=[_clip_timing(frames).metadata()], do_sample_frames=False,
        return_tensors="pt", **({"do_rescale": False, "do_normalize": False} if uint8 else {}),
    )
    out = torch.empty_like(expected["pixel_values_videos"])
    assert out.dtype == (torch.uint8 if uint8 else torch.float32)
    assert list(patcher(clip, out)) == expected["video_grid_thw"][0].tolist()
    assert torch.equal(out, expected["pixel_values_videos"])


@pytest.mark.parametrize("uint8", [True, False])
def test_video_pixels_with_the_patcher_equals_the_processor_path(family_processor, uint8):
    from energon_pack.data.synthetic import encode_video
    from energon_pack.qwen.media import probe_video

    datas = [encode_video(np.random.default_rng(seed).integers(0, 256, (frames, 64, 96, 3), dtype=np.uint8), fps=10)
             for seed, frames in ((0, 12), (1, 20))]
    spec = VisionSpec.from_processor(family_processor)
    geometry = media_geometry([], [probe_video(data) for data in datas], spec)
    rows = int(geometry.video_grid_thw.prod(axis=1).sum())
    width = 3 * spec.temporal_patch_size * spec.patch_size**2
    outs = [torch.empty((rows, width), dtype=torch.uint8 if uint8 else torch.float32) for _ in range(2)]
    video_pixels(family_processor, datas, geometry.timings, geometry.video_grid_thw, uint8=uint8, out=outs[0])
    video_pixels(family_processor, datas, geometry.timings, geometry.video_grid_thw, uint8=uint8, out=outs[1],
                 patcher=VideoPatcher.for_processor(family_processor))
    assert torch.equal(outs[0], outs[1])
    unslotted = video_pixels(family_processor, datas, geometry.timings, geometry.video_grid_thw, uint8=uint8,
                             patcher=VideoPatcher.for_processor(family_processor))
    assert torch.equal(unslotted, outs[0])


def test_video_patcher_probes_once_and_refuses_other_processors(processor, processor_qwen3, monkeypatch):
    assert VideoPatcher.for_processor(processor) is not None
    assert VideoPatcher.for_processor(processor_qwen3) is not None
    monkeypatch.setattr(VideoPatcher, "_probe", classmethod(lambda cls, processor: pytest.fail("probed again")))
    assert VideoPatcher.for_processor(processor) is not None
    assert "VideoPatcher" not in processor.video_processor.to_json_string()


def test_video_patcher_probe_catches_a_float32_difference(processor_qwen3):
    """A video processor of a known class whose normalisation differs (here: by one step) is refused:
    the probe compares the float32 payload too."""
    import copy

    part = processor_qwen3.video_processor
    shifted = type(part.__class__.__name__, (type(part),), {
        "rescale_and_normalize": lambda self, *args, **kwargs: type(part).rescale_and_normalize(self, *args, **kwargs) + 1e-3,
    })
    other = copy.copy(processor_qwen3)
    other.video_processor = copy.copy(part)
    other.video_processor.__class__ = shifted
    assert VideoPatcher.for_processor(other) is None


_TEXT = st.lists(st.sampled_from(list("ab \n\t.,!é中") + ["<|im_end|>", "<|vision_start|>", "  ", "\n\n", "hello"]),
                 max_size=20).map("".join)


@st.composite
def chats(draw):
    images = draw(st.integers(0, 3))
    sizes = [(draw(st.integers(28, 900)), draw(st.integers(28, 900))) for _ in range(images)]
    messages = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": [{"type": "text", "text": draw(_TEXT)}]})
    placed = 0
    for turn in range(draw(st.integers(1, 3))):
        here = images - placed if turn == 0 else 0
        placed += here
        messages.append({"role": "user", "content": [{"type": "image"}] * here + [{"type": "text", "text": draw(_TEXT)}]})
        messages.append({"role": "assistant", "content": [{"type": "text", "text": draw(_TEXT)}]})
    return messages, sizes


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chat=chats())
def test_split_tokenizer_equals_tokenize_conversation(processor, chat):
    messages, sizes = chat
    assert SplitTokenizer.applies(processor)
    markers = ChatMarkers.from_tokenizer(processor.tokenizer)
    infos = [ImageInfo(width=w, height=h, format="PNG", mode="RGB") for h, w in sizes]
    geometry = media_geometry(infos, [], VisionSpec.from_processor(processor))
    kwargs = dict(image_grid_thw=geometry.image_grid_thw, video_grid_thw=None, videos=())
    expected = tokenize_conversation(processor, messages, markers=markers, **kwargs)
    got = SplitTokenizer(processor, markers)(messages, **kwargs)
    assert np.array_equal(got.input_ids, expected.input_ids)
    assert np.array_equal(got.labels, expected.labels)
    assert np.array_equal(got.loss_mask, expected.loss_mask)


def test_split_tokenizer_checks_placeholders_and_pickles(processor):
    from energon_pack.errors import BadSampleError

    split = SplitTokenizer(processor)
    with pytest.raises(BadSampleError, match="1 image placeholder"):
        split([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}])
    assert pickle.loads(pickle.dumps(split)).pad_ids == split.pad_ids


def test_split_tokenizer_goes_through_the_wrapper_when_the_backend_truncates(processor):
    """The Rust backend is called directly only in the state the wrapper's call would leave it in."""
    messages = [{"role": "user", "content": [{"type": "text", "text": "a longer question than five tokens"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "and an answer"}]}]
    expected = tokenize_conversation(processor, messages)
    backend = processor.tokenizer.backend_tokenizer
    backend.enable_truncation(max_length=5)
    try:
        got = SplitTokenizer(processor)(messages)
    finally:
        backend.no_truncation()
    assert len(expected.input_ids) > 5
    assert np.array_equal(got.input_ids, expected.input_ids)
    assert np.array_equal(got.labels, expected.labels)
