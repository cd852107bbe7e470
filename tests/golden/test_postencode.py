"""Pixel path (postencode): equal to the Hugging Face processor, uint8 payload, bad media skipped.

* For a 500-sample mix per family (``tests.support.golden_media``; 24 for Qwen3.5, whose image and
  video processors are Qwen3-VL's), preencode + postencode give the
  same ``pixel_values`` / ``pixel_values_videos`` / grids as the HF processor called as
  docs/batch_contract.md says (max abs difference <= 1e-6; measured: exactly 0).
* The uint8 payload, normalised by each device-side route, equals the float32 payload and its
  pixel tensors are exactly 4x smaller.
* Truncated images and cut videos are counted skips (the loader carries on); a header that
  lies about the media size is a ``media_mismatch`` skip, never a row whose token and pixel
  counts disagree.
* Skips after a worker's last row are still reported; an MP4 edit list does not make a valid
  video a ``media_mismatch``.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Sequence
from dataclasses import replace
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
import torch

from energon_pack.config import PackingConfig
from energon_pack.rows.encoded import PreparedSample
from energon_pack.errors import BadSampleError
from energon_pack.loader import get_packing_loader
from energon_pack.data.prepare import prepare_dataset
from energon_pack.qwen import media
from energon_pack.qwen.pixels import decode_video_frames
from energon_pack.rows.step import to_device_batch
from energon_pack.data.synthetic import encode_image, encode_video
from energon_pack.runtime.task_encoder import QwenVLPackingTaskEncoder
from energon_pack.rows.thd import build_thd_row
from energon_pack.core.visual import VisualInputs, normalize_patches
from tests.support.golden_media import (
    GoldenSample,
    GOLDEN_MIX_SEED,
    chat_sample,
    golden_count,
    make_video,
)
from tests.support.hf_reference import PROCESSOR_FIXTURES, hf_reference
from tests.support.real_corpus import trimmed_mp4
from tests.support.tensor_checks import max_abs_difference

#: Samples per family's mix; only full-size mixes are checked for coverage (big images, videos).
MIX_SIZES = {"qwen2.5-vl": 500, "qwen3-vl": 500, "qwen3.5": 24}
FULL_MIX = 500
UINT8_SAMPLES = 40  # samples with media whose uint8 payload is checked (per family)
SEGMENTS_PER_ROW = 4  # uint8 segments packed into one row for the to_device_batch route
TOLERANCE = 1e-6
BIG_IMAGE_PIXELS = 1600 * 1000  # "photo-sized" images of the mix: at least this many pixels
PIXEL_FIELDS = ("pixel_values", "pixel_values_videos")
GRID_FIELDS = ("image_grid_thw", "video_grid_thw")
ROW_WIDTH = 1 << 20  # big enough for any sample of the mix: nothing is overlong


def _max_abs_diff(ours: torch.Tensor | None, reference: torch.Tensor | None) -> float:
    """Max |ours - reference| (0.0 when both are absent); shapes must agree."""
    assert (ours is None) == (reference is None), f"one side lacks the tensor: {ours is None=} {reference is None=}"
    if ours is None:
        return 0.0
    return max_abs_difference(ours, reference)


@pytest.fixture(scope="module", params=sorted(MIX_SIZES))
def golden_mix(request: pytest.FixtureRequest, golden_references) -> tuple[str, Any, list[Any], list[PreparedSample]]:
    """(processor fixture, processor, golden samples, preencoded samples) of one family's mix."""
    family = request.param
    fixture = PROCESSOR_FIXTURES[family]
    processor = request.getfixturevalue(fixture)
    samples = golden_references.samples(golden_count(MIX_SIZES[family]), GOLDEN_MIX_SEED, family)
    encoder = QwenVLPackingTaskEncoder(PackingConfig(seq_length=ROW_WIDTH), processor)
    prepared = [encoder.preencode_sample(chat_sample(golden, f"g{index:04d}")) for index, golden in enumerate(samples)]
    return fixture, processor, samples, prepared


@pytest.mark.slow
def test_postencode_pixels_equal_hf_processor(golden_mix, golden_references):
    fixture, processor, samples, prepared = golden_mix
    encoder = QwenVLPackingTaskEncoder(PackingConfig(seq_length=ROW_WIDTH, pixel_dtype="float32"), processor)
    skipped = {p.__key__: p.skip_reason for p in prepared if p.skip_reason is not None}
    assert not skipped, f"the golden mix holds only good samples, but preencode skipped {skipped}"
    worst = dict.fromkeys(PIXEL_FIELDS, 0.0)
    seen = {"images": 0, "big_images": 0, "videos": 0}
    for index, (golden, sample) in enumerate(zip(samples, prepared)):
        visual = encoder.postencode_sample(sample).segment.visual
        reference = golden_references.full(fixture, GOLDEN_MIX_SEED, index, processor, golden)
        for name in GRID_FIELDS:
            ours, theirs = getattr(visual, name), reference.get(name)
            assert (ours is None) == (theirs is None) and (ours is None or torch.equal(ours, theirs)), (
                f"{sample.__key__}: {name} {None if ours is None else ours.tolist()} != HF "
                f"{None if theirs is None else theirs.tolist()}"
            )
        for name in PIXEL_FIELDS:
            ours = getattr(visual, name)
            assert ours is None or ours.dtype == torch.float32, f"{sample.__key__}: {name} is {ours.dtype}"
            worst[name] = max(worst[name], _max_abs_diff(ours, reference.get(name)))
        if "second_per_grid_ts" in reference:  # Qwen2.5-VL only
            assert torch.allclose(visual.second_per_grid_ts, reference["second_per_grid_ts"].float()), sample.__key__
        sizes = [media.probe_image(data) for data in golden.images]
        seen["images"] += len(sizes)
        seen["big_images"] += sum(info.width * info.height >= BIG_IMAGE_PIXELS for info in sizes)
        seen["videos"] += len(golden.videos)
    print(f"max |ours - HF| over {len(samples)} samples: {worst}; media seen: {seen}")
    assert all(value <= TOLERANCE for value in worst.values()), f"max abs differences {worst} exceed {TOLERANCE}"
    if len(samples) >= FULL_MIX:
        assert seen["big_images"] >= 3 and seen["videos"] >= 50, f"the mix lacks coverage: {seen}"


@pytest.mark.slow
def test_uint8_payload_normalises_to_the_float32_payload(golden_mix):
    _, processor, _, prepared = golden_mix
    float_encoder = QwenVLPackingTaskEncoder(PackingConfig(seq_length=ROW_WIDTH, pixel_dtype="float32"), processor)
    uint8_encoder = QwenVLPackingTaskEncoder(PackingConfig(seq_length=ROW_WIDTH, pixel_dtype="uint8"), processor)
    with_media = [p for p in prepared if p.images or p.videos][:UINT8_SAMPLES]
    image_processor = processor.image_processor
    constants = (tuple(image_processor.image_mean), tuple(image_processor.image_std), image_processor.rescale_factor)
    worst = {"normalize_patches": 0.0, "normalized_for_model": 0.0, "to_device_batch": 0.0}
    float_bytes = uint8_bytes = 0
    for start in range(0, len(with_media), SEGMENTS_PER_ROW):
        group = with_media[start : start + SEGMENTS_PER_ROW]
        full_segments = [float_encoder.postencode_sample(p).segment for p in group]
        small_segments = [uint8_encoder.postencode_sample(p).segment for p in group]
        for full, small in zip(full_segments, small_segments):
            model_inputs = small.visual.normalized_for_model()
            for name in PIXEL_FIELDS:
                pixels, reference = getattr(small.visual, name), getattr(full.visual, name)
                assert (pixels is None) == (reference is None), f"{small.key}: {name} present on one side only"
                if pixels is None:
                    continue
                assert pixels.dtype == torch.uint8 and pixels.shape == reference.shape, (small.key, pixels.dtype)
                float_bytes += reference.nbytes
                uint8_bytes += pixels.nbytes
                normalised = normalize_patches(pixels, *constants)
                worst["normalize_patches"] = max(worst["normalize_patches"], _max_abs_diff(normalised, reference))
                worst["normalized_for_model"] = max(
                    worst["normalized_for_model"], _max_abs_diff(model_inputs[name], reference)
                )
        on_device = to_device_batch(_thd_row(float_encoder, small_segments), "cpu")["visual_inputs"]
        assert on_device.rescale_factor is None, "to_device_batch must hand the model a float32 payload"
        expected = VisualInputs.concat([s.visual for s in full_segments])
        for name in PIXEL_FIELDS:
            difference = _max_abs_diff(getattr(on_device, name), getattr(expected, name))
            worst["to_device_batch"] = max(worst["to_device_batch"], difference)
    print(f"max |normalised uint8 - float32| over {len(with_media)} samples: {worst}")
    print(f"pixel bytes: float32 {float_bytes}, uint8 {uint8_bytes}")
    assert all(value <= TOLERANCE for value in worst.values()), f"max abs differences {worst} exceed {TOLERANCE}"
    assert uint8_bytes > 0 and float_bytes == 4 * uint8_bytes, (float_bytes, uint8_bytes)


def _thd_row(encoder: QwenVLPackingTaskEncoder, segments: Sequence[Any]) -> dict[str, Any]:
    return build_thd_row(
        segments, seq_length=ROW_WIDTH, pad_multiple=encoder.config.pad_multiple, pad_token_id=encoder.pad_token_id
    )


def test_video_frames_equal_an_independent_pyav_decode():
    """``decode_video_frames`` (shared by postencode and the reference helper) picks the right frames."""
    rng = np.random.default_rng(3)
    for data in (make_video(rng, num_frames=int(rng.integers(8, 90))) for _ in range(5)):
        with av.open(io.BytesIO(data)) as container:
            every = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
        indices = [0, len(every) // 3, len(every) - 1]
        np.testing.assert_array_equal(decode_video_frames(data, indices, len(every)), every[indices])
        with pytest.raises(BadSampleError, match="media_mismatch"):
            decode_video_frames(data, indices, len(every) + 1)


# --- bad media through the loader -----------------------------------------------------------


def _pixels(seed: int, height: int, width: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ramp = np.add.outer(np.arange(height), np.arange(width))[..., None] * rng.integers(1, 4, size=3)
    return ((ramp + rng.integers(0, 256, size=3)) % 256).astype(np.uint8)


def _faststart_mp4(path: Path, frames: np.ndarray, fps: int) -> bytes:
    """H.264 MP4 with the ``moov`` header before the frame data, so a cut body keeps a readable header."""
    with av.open(str(path), mode="w", format="mp4", options={"movflags": "faststart"}) as container:
        stream = container.add_stream("libx264", rate=Fraction(fps))
        stream.height, stream.width = frames.shape[1], frames.shape[2]
        stream.pix_fmt = "yuv420p"
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())
    return path.read_bytes()


def _packet_end(data: bytes, index: int) -> int:
    """Byte offset just past the ``index``-th video packet (in file order) of an MP4."""
    with av.open(io.BytesIO(data)) as container:
        packets = sorted((p.pos, p.size) for p in container.demux(video=0) if p.size > 0)
    position, size = packets[index]
    return position + size


def _write_record(
    records: list[dict[str, Any]], key: str, *, images: Sequence[str] = (), videos: Sequence[str] = ()
) -> None:
    media_tags = "".join("<image>" for _ in images) + "".join("<video>" for _ in videos)
    records.append(
        {
            "id": key,
            "messages": [
                {"role": "user", "content": f"{media_tags}\nDescribe {key}."},
                {"role": "assistant", "content": f"This is {key}, a small test sample."},
            ],
            "images": list(images),
            "videos": list(videos),
        }
    )


@pytest.fixture(scope="module")
def bad_media_dataset(tmp_path_factory) -> tuple[Path, set[str], dict[str, str]]:
    """A prepared dataset of good samples mixed with media whose header reads but whose body is cut.

    Returns (dataset dir, good keys, bad key -> expected skip reason).
    """
    root = tmp_path_factory.mktemp("bad_media")
    raw = root / "raw"
    raw.mkdir()
    records: list[dict[str, Any]] = []
    good: set[str] = set()
    for index in range(14):
        key = f"good{index:02d}"
        if index % 3 == 2:
            frames = np.stack([_pixels(index, 48, 64)] * 12)
            (raw / f"{key}.mp4").write_bytes(encode_video(frames, fps=6))
            _write_record(records, key, videos=[f"{key}.mp4"])
        else:
            image_format, extension = ("PNG", "png") if index % 2 else ("JPEG", "jpg")
            image = encode_image(_pixels(index, 60 + 7 * index, 90), image_format, "RGB")
            (raw / f"{key}.{extension}").write_bytes(image)
            _write_record(records, key, images=[f"{key}.{extension}"])
        good.add(key)
    bad: dict[str, str] = {}
    png = encode_image(_pixels(100, 120, 160), "PNG", "RGB")
    (raw / "bad_png.png").write_bytes(png[: len(png) // 2])
    jpeg = encode_image(_pixels(101, 120, 160), "JPEG", "RGB")
    (raw / "bad_jpeg.jpg").write_bytes(jpeg[: int(len(jpeg) * 0.6)])
    # The bad image comes second: the good first image must not rescue the sample.
    (raw / "bad_second_image_ok.png").write_bytes(encode_image(_pixels(102, 40, 40), "PNG", "RGB"))
    for key, images in (
        ("bad_png", ["bad_png.png"]),
        ("bad_jpeg", ["bad_jpeg.jpg"]),
        ("bad_second_image", ["bad_second_image_ok.png", "bad_png.png"]),
    ):
        _write_record(records, key, images=images)
        bad[key] = "corrupt_image"
    video = _faststart_mp4(raw / "whole.mp4", _pixels(103, 48, 64)[None].repeat(24, axis=0), fps=8)
    header_end = video.find(b"mdat") + 4
    # Videos cut inside or right after a frame packet: the demuxed packets fall short of the
    # frame count the header lists, so already the header check (prepare, preencode) rejects them.
    cut_videos = {
        "cut_video_mid_packet": video[: (header_end + _packet_end(video, 3)) // 2],
        "cut_video_at_packet": video[: _packet_end(video, 5)],
    }
    for key, data in cut_videos.items():
        (raw / f"{key}.mp4").write_bytes(data)
        _write_record(records, key, videos=[f"{key}.mp4"])
    order = np.random.default_rng(7).permutation(len(records))
    (raw / "records.jsonl").write_text("".join(json.dumps(records[i]) + "\n" for i in order), encoding="utf-8")
    report = prepare_dataset(raw / "records.jsonl", raw, root / "dataset", samples_per_shard=6, progress=False)
    rejected = {p.record_id: str(p) for p in report.problems}
    assert set(rejected) == set(cut_videos) and all("corrupt_video: cut short" in r for r in rejected.values())
    assert report.written == len(records) - len(cut_videos), f"cut images must pass the header check: {report.problems}"
    return root / "dataset", good, bad


def _run_loader(path: Path, processor: Any, *, num_workers: int, **config: Any) -> tuple[list[dict[str, Any]], dict]:
    loader = get_packing_loader(
        path,
        PackingConfig(seq_length=4096, buffer_size=4, num_workers=num_workers, repeat=False, **config),
        processor,
    )
    rows = list(loader)
    return rows, loader.stats()


def _row_keys(rows: Iterable[dict[str, Any]]) -> list[str]:
    return [key for row in rows for key in row["__keys__"]]


def _assert_rows_consistent(rows: Iterable[dict[str, Any]], processor: Any) -> None:
    """Media tokens of every row = patches / merge**2, and pixel rows = patches, per media kind."""
    merge = int(processor.image_processor.merge_size)
    for row in rows:
        visual = row["visual_inputs"]
        for token_id, pixels, grid in (
            (processor.image_token_id, visual.pixel_values, visual.image_grid_thw),
            (processor.video_token_id, visual.pixel_values_videos, visual.video_grid_thw),
        ):
            tokens = int((row["input_ids"] == token_id).sum())
            patches = 0 if grid is None else int(grid.prod(dim=-1).sum())
            assert tokens * merge**2 == patches, (row["__keys__"], tokens, patches)
            assert (0 if pixels is None else pixels.shape[0]) == patches, (row["__keys__"], patches)


@pytest.mark.parametrize("num_workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_cut_media_are_counted_skips_and_the_loader_continues(bad_media_dataset, processor, num_workers):
    path, good, bad = bad_media_dataset
    rows, stats = _run_loader(path, processor, num_workers=num_workers)
    keys = _row_keys(rows)
    assert sorted(keys) == sorted(good), f"rows hold {sorted(keys)}; expected every good key once"
    expected: dict[str, int] = {}
    for reason in bad.values():
        expected[reason] = expected.get(reason, 0) + 1
    assert stats["skipped"] == expected
    assert stats["samples_in"] == len(good) + len(bad)
    _assert_rows_consistent(rows, processor)


# --- headers that lie about the media size ------------------------------------------------------


def _lying_image_probe(liar: bytes):
    """``probe_image`` that reports twice the true size for the image ``liar``."""
    real = media.probe_image

    def probe(data: bytes, **kwargs: Any) -> media.ImageInfo:
        info = real(data, **kwargs)
        return replace(info, width=2 * info.width, height=2 * info.height) if data == liar else info

    return probe


def _one_sample(images: Sequence[bytes] = (), videos: Sequence[bytes] = ()) -> Any:
    content = [{"type": "image"} for _ in images] + [{"type": "video"} for _ in videos]
    content.append({"type": "text", "text": "What?"})
    answer = [{"type": "text", "text": "That."}]
    messages = [{"role": "user", "content": content}, {"role": "assistant", "content": answer}]
    return chat_sample(GoldenSample(messages, list(images), list(videos)), "liar")


@pytest.mark.parametrize("lie", ["image_size", "video_size", "video_frames"])
def test_header_that_lies_is_a_media_mismatch(processor, monkeypatch, lie):
    image = encode_image(_pixels(5, 100, 140), "PNG", "RGB")
    video = encode_video(np.stack([_pixels(6, 64, 96)] * 20), fps=10)
    if lie == "image_size":
        monkeypatch.setattr("energon_pack.qwen.encode.probe_image", _lying_image_probe(image))
        sample = _one_sample(images=[image])
    else:
        real = media.probe_video
        changes = (
            {"width": 4 * real(video).width}  # another aspect ratio: another grid
            if lie == "video_size"
            else {"num_frames": real(video).num_frames + 10}
        )
        monkeypatch.setattr("energon_pack.qwen.encode.probe_video", lambda data: replace(real(data), **changes))
        sample = _one_sample(videos=[video])
    encoder = QwenVLPackingTaskEncoder(PackingConfig(seq_length=ROW_WIDTH), processor)
    prepared = encoder.preencode_sample(sample)
    assert prepared.skip_reason is None and prepared.num_tokens > 0
    with pytest.raises(BadSampleError) as caught:
        encoder.postencode_sample(prepared)
    assert caught.value.reason == "media_mismatch"


def test_lying_header_never_reaches_a_row(bad_media_dataset, processor, monkeypatch):
    """In the loader the liar is skipped as media_mismatch; every row keeps tokens and pixels consistent."""
    path, good, bad = bad_media_dataset
    liar = next(f for f in sorted((path.parent / "raw").glob("good*")) if f.suffix in (".png", ".jpg"))
    liar_key, liar_bytes = liar.stem, liar.read_bytes()
    monkeypatch.setattr("energon_pack.qwen.encode.probe_image", _lying_image_probe(liar_bytes))
    rows, stats = _run_loader(path, processor, num_workers=0)
    assert sorted(_row_keys(rows)) == sorted(good - {liar_key})
    assert stats["skipped"].get("media_mismatch", 0) == list(bad.values()).count("media_mismatch") + 1
    _assert_rows_consistent(rows, processor)


# --- skips without a following row; MP4 edit lists --------------------------------------------------


def test_skips_without_a_following_row_are_counted(tmp_path, processor):
    raw = tmp_path / "raw"
    raw.mkdir()
    png = encode_image(_pixels(9, 120, 160), "PNG", "RGB")
    (raw / "cut.png").write_bytes(png[: len(png) // 2])
    records: list[dict[str, Any]] = []
    for key in ("cut_a", "cut_b"):
        _write_record(records, key, images=["cut.png"])
    (raw / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    prepare_dataset(raw / "records.jsonl", raw, tmp_path / "dataset", progress=False)
    rows, stats = _run_loader(tmp_path / "dataset", processor, num_workers=0)
    assert rows == []
    assert stats["skipped"] == {"corrupt_image": 2}


def _trimmed_mp4(frames: np.ndarray, fps: int, trimmed: int) -> bytes:
    """MP4 whose edit list hides the first ``trimmed`` frames (as a stream copy cut with ``ffmpeg -ss`` has).

    The header still counts every frame; decoders drop the hidden ones.
    """
    return trimmed_mp4(encode_video(frames, fps), trimmed)


def test_video_with_an_edit_list_is_not_skipped(tmp_path, processor):
    frames = np.stack([_pixels(11, 48, 64)] * 40)
    video = _trimmed_mp4(frames, fps=10, trimmed=3)
    encoder = QwenVLPackingTaskEncoder(PackingConfig(seq_length=ROW_WIDTH), processor)
    prepared = encoder.preencode_sample(_one_sample(videos=[video]))
    assert prepared.skip_reason is None
    visual = encoder.postencode_sample(prepared).segment.visual
    reference = hf_reference(processor, _one_sample(videos=[video]).conversation, [], [video])
    assert torch.equal(visual.video_grid_thw, reference["video_grid_thw"])
