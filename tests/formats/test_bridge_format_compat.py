"""Compatibility run: our rows of a Bridge-format dataset equal what Megatron-Bridge 0.6.2 makes of it.

The same shards are read twice: by Bridge's own ``ChatMLWebdataset`` (Energon imports it) and its
``QwenVLTaskEncoder.encode_sample`` + collate (``qwen2_5_collate_fn``, which needs qwen-vl-utils),
and by our reader (``formats.dispatch``) and task encoder. Per sample: input ids, image grids,
pixel values and trained tokens are equal, except the differences docs/foreign_datasets.md lists:

- Bridge trains the newline after each assistant ``<|im_end|>``; we do not (docs/batch_contract.md);
- Bridge strips the spaces around a placeholder and glues the words (``"Compare <image> and <image>."``
  renders ``"Compareand."``); we keep one space (``"Compare and."``);
- a frame-list video reaches Bridge's processor call without its rate (24 fps assumed: Qwen2.5-VL
  ``second_per_grid_ts`` 2/24 s); we take the processor's sampling rate (2 fps: 1 s).

Images and video frames have sides that are multiples of 28 inside qwen-vl-utils' limits, where its
own pre-resize (a Bridge-only step before the processor's) leaves the pixels as they are.

Besides the image samples: frame lists of 3, 4, 5, 7 and 9 frames (Qwen2.5-VL: equal but for the
rate; Qwen3-VL: Bridge's processor call samples 4 of the frames at an assumed 24 fps and its frames
are resized twice, so only the text around the video and the trained tokens are compared), a
tool-use sample (a ``tools`` member, ``tool_calls`` and a tool turn; Qwen3-VL, whose template renders
tools) and a single-file video member (``mp4``), which Bridge 0.6.2 cannot train on at all (its
collate hands the file's bytes to qwen-vl-utils, which refuses them): ours is compared with the
Hugging Face processor there. docs/foreign_datasets.md lists every difference.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests.support.bridge_datasets import (
    BRIDGE_MODULE,
    PICKLED_YAML,
    TUTORIAL_YAML,
    encoded_image,
    frame_list,
    write_bridge_dataset,
)

#: Frame-list lengths compared with Bridge (odd counts: the processor repeats the last frame).
FRAME_COUNTS = (3, 5, 7, 9)
VIDEO_QUESTION = [{"from": "human", "value": "<video>\nWhat happens?"}, {"from": "gpt", "value": "Flicker."}]
TOOLS_YAML = PICKLED_YAML.replace("  videos: videos\n", "  tools: tools.json\n")
VIDEO_FILE_YAML = f"""\
__module__: {BRIDGE_MODULE}
__class__: ChatMLWebdataset
field_map:
  videos: mp4
  conversation: json
subflavors: {{}}
"""
TOOLS = [{"type": "function", "function": {
    "name": "zoom", "description": "Crop a region of the picture.",
    "parameters": {"type": "object", "properties": {"box": {"type": "array", "items": {"type": "integer"}}}}}}]

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("megatron.bridge") is None or importlib.util.find_spec("qwen_vl_utils") is None,
    reason="needs Megatron-Bridge 0.6.2 and qwen-vl-utils (the compatibility venv)",
)


def _samples() -> tuple[list[dict[str, bytes]], list[dict[str, bytes]]]:
    import json
    import pickle

    pickled_records = [
        ([{"from": "human", "value": "Say hello."}, {"from": "gpt", "value": "Hello!"}], []),
        ([{"from": "human", "value": "<image>\nWhat colour dominates?"}, {"from": "gpt", "value": "Grey noise."}],
         [encoded_image(21, 56, 84)]),
        ([{"role": "user", "content": "Compare <image> and <image>."}, {"role": "assistant", "content": "Both noisy."}],
         [encoded_image(22, 84, 56), encoded_image(23, 112, 56)]),
        ([{"from": "human", "value": "<image><image>\nWhich is wider?"}, {"from": "gpt", "value": "The second."}],
         [encoded_image(25, 56, 112), encoded_image(26, 140, 56)]),
        ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Describe.<image>"},
          {"role": "assistant", "content": "Noise."}, {"role": "user", "content": "And now?"},
          {"role": "assistant", "content": "Still noise."}], [encoded_image(24, 56, 56)]),
    ]
    pickled = [
        {"__key__": f"bridge-{i:06d}", "jpgs": pickle.dumps(images), "videos": pickle.dumps([]),
         "json": json.dumps(conversation).encode()}
        for i, (conversation, images) in enumerate(pickled_records)
    ]
    pickled.append({
        "__key__": "bridge-video", "jpgs": pickle.dumps([]), "videos": pickle.dumps([frame_list(40, 4, 336, 336)]),
        "json": json.dumps(VIDEO_QUESTION).encode(),
    })
    pickled += _frame_list_samples()
    tutorial = [
        {"__key__": f"tutorial-{i:06d}", "image.png": encoded_image(30 + i, 28 * (2 + i), 56, "PNG"),
         "conversation.json": json.dumps([
             {"role": "user", "content": [{"type": "text", "text": f"Picture {i}?"}, {"type": "image"}]},
             {"role": "assistant", "content": [{"type": "text", "text": f"Noise {i}."}]},
         ]).encode()}
        for i in range(3)
    ]
    return pickled, tutorial


def _frame_list_samples() -> list[dict[str, bytes]]:
    """One pickled-layout sample per `FRAME_COUNTS` entry: a frame list of 336x336 JPEG frames."""
    import json
    import pickle

    return [
        {"__key__": f"bridge-frames-{count}", "jpgs": pickle.dumps([]),
         "videos": pickle.dumps([frame_list(50 + count, count, 336, 336)]), "json": json.dumps(VIDEO_QUESTION).encode()}
        for count in FRAME_COUNTS
    ]


def _read(path, *, ours: bool) -> dict[str, object]:
    from megatron.energon import WorkerConfig, get_loader, get_val_dataset

    from energon_pack.formats.dispatch import reading_formats

    worker_config = WorkerConfig(rank=0, world_size=1, num_workers=0)
    if ours:
        with reading_formats():
            dataset = get_val_dataset(path, split_part="train", worker_config=worker_config, batch_size=None)
    else:
        dataset = get_val_dataset(path, split_part="train", worker_config=worker_config, batch_size=None)
    return {sample.__key__: sample for sample in get_loader(dataset)}


def _bridge_task_encoder_class():
    """Bridge's ``QwenVLTaskEncoder`` (its package imports Transformer Engine once, served a stand-in
    by ``tests.support.bridge_imports``)."""
    import importlib

    from tests.support.bridge_imports import te_stand_in_for_lora_layers

    with te_stand_in_for_lora_layers():
        return importlib.import_module("megatron.bridge.models.qwen_vl.data.energon").QwenVLTaskEncoder


def _bridge_rows(path, processor) -> dict[str, dict]:
    QwenVLTaskEncoder = _bridge_task_encoder_class()
    from energon_pack.qwen.geometry import VisionSpec

    vision = VisionSpec.from_processor(processor)
    encoder = QwenVLTaskEncoder(
        processor.tokenizer, processor, min_pixels=vision.image_min_pixels, max_pixels=vision.image_max_pixels,
        max_visual_tokens=None, max_padding_length=4096,
    )
    rows: dict[str, dict] = {}
    for key, sample in _read(path, ours=False).items():
        try:
            collated = encoder.collate_fn([encoder.encode_sample(sample).example])
        except Exception as err:  # a sample Bridge cannot train on (documented per sample)
            rows[key] = {"error": err}
            continue
        length = int(collated["attention_mask"][0].sum()) if collated.get("attention_mask") is not None else None
        ids = collated["input_ids"][0][:length]
        labels = collated["labels"][0][:length]
        visual = collated.get("visual_inputs")
        rows[key] = {
            "input_ids": ids,
            "trained": sorted(int(i) for i in torch.nonzero(labels != -100).flatten()),
            "image_grid_thw": None if visual is None else getattr(visual, "image_grid_thw", None),
            "pixel_values": None if visual is None else getattr(visual, "pixel_values", None),
            "video_grid_thw": None if visual is None else getattr(visual, "video_grid_thw", None),
            "pixel_values_videos": None if visual is None else getattr(visual, "pixel_values_videos", None),
            "second_per_grid_ts": None if visual is None else getattr(visual, "second_per_grid_ts", None),
        }
    return rows


def _our_rows(path, processor) -> dict[str, dict]:
    from energon_pack import PackingConfig, QwenVLPackingTaskEncoder

    encoder = QwenVLPackingTaskEncoder(PackingConfig(seq_length=4096, num_workers=0, pixel_dtype="float32"), processor)
    rows = {}
    for key, sample in _read(path, ours=True).items():
        prepared = encoder.preencode_sample(sample)
        assert prepared.skip_reason is None, (key, prepared.skip_reason, prepared.skip_detail)
        encoded = encoder.postencode_sample(prepared)
        visual = encoded.segment.visual
        rows[key] = {
            "input_ids": prepared.input_ids,
            "trained": sorted(int(i) for i in torch.nonzero(prepared.labels != -100).flatten()),
            "image_grid_thw": visual.image_grid_thw,
            "pixel_values": visual.pixel_values,
            "video_grid_thw": visual.video_grid_thw,
            "pixel_values_videos": visual.pixel_values_videos,
            "second_per_grid_ts": None if prepared.second_per_grid_ts is None else torch.tensor(prepared.second_per_grid_ts),
        }
    return rows


def _newlines_after_assistant_end(ids: torch.Tensor, trained: list[int], tokenizer) -> set[int]:
    """Positions t whose target t+1 is the newline right after an assistant turn's trained <|im_end|>
    (the target of t-1)."""
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    newline = tokenizer.encode("\n", add_special_tokens=False)[0]
    return {t for t in range(1, len(ids) - 1) if t - 1 in trained and ids[t] == im_end and ids[t + 1] == newline}


def _assert_same_text_and_training(mine: dict, bridge: dict, tokenizer, key: str) -> None:
    """Equal ids; Bridge trains what we train plus the newline after each assistant ``<|im_end|>``
    (documented), and nothing else."""
    assert torch.equal(mine["input_ids"], bridge["input_ids"]), key
    extra = set(bridge["trained"]) - set(mine["trained"])
    assert set(mine["trained"]) <= set(bridge["trained"]), key
    assert extra == _newlines_after_assistant_end(mine["input_ids"], mine["trained"], tokenizer), (key, extra)
    assert extra, f"{key}: Bridge is expected to train the newline after <|im_end|>"


def _without_media(row: dict, tokenizer) -> dict:
    """``input_ids`` and ``trained`` of a row with every media span (vision start to its end, pads
    and Qwen3-VL timestamps inside) left out: the text a row's media are placed in."""
    from energon_pack.qwen.template import ChatMarkers, media_token_mask

    kept = ~torch.from_numpy(media_token_mask(row["input_ids"].numpy(), ChatMarkers.from_tokenizer(tokenizer)))
    position = torch.cumsum(kept.long(), 0) - 1
    return {"input_ids": row["input_ids"][kept], "trained": sorted(int(position[t]) for t in row["trained"] if kept[t])}


@pytest.mark.parametrize("layout", ["pickled", "tutorial"])
def test_rows_equal_bridge_encode_sample_and_collate(tmp_path, processor, layout):
    pickled, tutorial = _samples()
    samples, dataset_yaml = (pickled, PICKLED_YAML) if layout == "pickled" else (tutorial, TUTORIAL_YAML)
    path = write_bridge_dataset(tmp_path / layout, samples, dataset_yaml)
    theirs, ours = _bridge_rows(path, processor), _our_rows(path, processor)
    assert sorted(theirs) == sorted(ours) == sorted(sample["__key__"] for sample in samples)
    tokenizer = processor.tokenizer
    for key in sorted(ours):
        mine, bridge = ours[key], theirs[key]
        assert "error" not in bridge, (key, bridge.get("error"))
        if key == "bridge-000002":  # documented: Bridge glues the words around a placeholder
            assert "Compare and." in tokenizer.decode(mine["input_ids"])
            assert "Compareand." in tokenizer.decode(bridge["input_ids"])
        else:
            _assert_same_text_and_training(mine, bridge, tokenizer, key)
        if key == "bridge-video" or key.startswith("bridge-frames-"):
            frames = 4 if key == "bridge-video" else int(key.rpartition("-")[2])
            # every frame kept, an odd count padded with its last frame (as Bridge and the processor)
            assert int(mine["video_grid_thw"][0, 0]) == -(-frames // 2), key
            assert torch.equal(mine["video_grid_thw"], bridge["video_grid_thw"]), key
            torch.testing.assert_close(mine["pixel_values_videos"], bridge["pixel_values_videos"].float(), rtol=0, atol=1e-5)
            # documented: Bridge's processor call assumes 24 fps for a frame list; we take the processor's 2 fps
            assert mine["second_per_grid_ts"].tolist() == [2 / 2.0]
            assert bridge["second_per_grid_ts"].tolist() == pytest.approx([2 / 24])
            continue
        if bridge["image_grid_thw"] is None:
            assert mine["image_grid_thw"] is None, key
            continue
        assert torch.equal(mine["image_grid_thw"], bridge["image_grid_thw"]), key
        torch.testing.assert_close(mine["pixel_values"].float(), bridge["pixel_values"].float(), rtol=0, atol=1e-5)


def _timestamps(row: dict, tokenizer) -> list[str]:
    """The ``<t seconds>`` texts of a Qwen3-VL row, in order. Example: ``["0.2", "1.0"]``."""
    import re

    return re.findall(r"<(\d+\.\d) seconds>", tokenizer.decode(row["input_ids"]))


def test_frame_lists_with_qwen3_vl_differ_from_bridge_only_where_bridge_samples_them(tmp_path, processor_qwen3):
    """Bridge 0.6.2 calls the Qwen3-VL processor with a frame list and no metadata, so the processor
    samples it (its default) as a 24 fps clip: 4 frames (its minimum) of every list here, t = 2, with
    timestamps at 24 fps, after qwen-vl-utils resized each frame to multiples of 28 (documented Bridge
    bugs). We keep every frame (t = ceil(n / 2)). Everything outside the video span is the same."""
    samples = _frame_list_samples()
    path = write_bridge_dataset(tmp_path / "frames", samples, PICKLED_YAML)
    theirs, ours = _bridge_rows(path, processor_qwen3), _our_rows(path, processor_qwen3)
    assert sorted(theirs) == sorted(ours) == sorted(sample["__key__"] for sample in samples)
    tokenizer = processor_qwen3.tokenizer
    for count, key in zip(FRAME_COUNTS, sorted(ours, key=lambda name: int(name.rpartition("-")[2]))):
        mine, bridge = ours[key], theirs[key]
        assert "error" not in bridge, (key, bridge.get("error"))
        assert int(mine["video_grid_thw"][0, 0]) == -(-count // 2)
        assert int(bridge["video_grid_thw"][0, 0]) == 2, key  # documented: Bridge samples 4 frames
        # Qwen3-VL timestamps: ours the middle of each step's first and last frame at 2 fps (the last
        # frame repeated); Bridge's at 24 fps (documented), all of them within the first half second.
        steps = range(-(-count // 2))
        assert _timestamps(mine, tokenizer) == [f"{(2 * i + min(2 * i + 1, count - 1)) / 4:.1f}" for i in steps], key
        assert len(_timestamps(bridge, tokenizer)) == 2 and max(map(float, _timestamps(bridge, tokenizer))) < 0.5, key
        _assert_same_text_and_training(_without_media(mine, tokenizer), _without_media(bridge, tokenizer), tokenizer, key)


def test_a_tool_use_sample_equals_bridge(tmp_path, processor_qwen3):
    """A ``tools`` member and a conversation with ``tool_calls`` and a tool turn (Qwen3-VL: its template
    renders tools); a second sample, in a dataset whose field_map has no ``tools`` (Bridge reads the
    conversation JSON's tools only then: a ``tools`` member must be in every sample of its dataset),
    takes them from the conversation JSON beside an image whose sides are multiples of 28 and 32
    (qwen-vl-utils' pre-resize and Qwen3-VL's leave it as it is)."""
    import json
    import pickle

    calls = [{"type": "function", "function": {"name": "zoom", "arguments": {"box": [4, 8, 60, 40]}}}]
    tool_turns = [
        {"role": "system", "content": "You look at pictures and call tools."},
        {"role": "user", "content": "Zoom on the cat."},
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "name": "zoom", "content": "a grey cat"},
        {"role": "assistant", "content": "A grey cat."},
    ]
    member = [{"__key__": "tools-member", "jpgs": pickle.dumps([]), "tools.json": json.dumps(TOOLS).encode(),
               "json": json.dumps(tool_turns).encode()}]
    in_json = [{"__key__": "tools-in-json", "jpgs": pickle.dumps([encoded_image(60, 448, 224)]), "videos": pickle.dumps([]),
                "json": json.dumps({"conversations": [{"from": "human", "value": "<image>\nZoom on the cat."},
                                                      {"from": "gpt", "value": "Zooming.", "tool_calls": calls}],
                                    "tools": TOOLS}).encode()}]
    theirs, ours = {}, {}
    for name, samples, dataset_yaml in (("member", member, TOOLS_YAML), ("in-json", in_json, PICKLED_YAML)):
        path = write_bridge_dataset(tmp_path / name, samples, dataset_yaml)
        theirs.update(_bridge_rows(path, processor_qwen3))
        ours.update(_our_rows(path, processor_qwen3))
    assert sorted(theirs) == sorted(ours) == ["tools-in-json", "tools-member"]
    tokenizer = processor_qwen3.tokenizer
    for key in sorted(ours):
        mine, bridge = ours[key], theirs[key]
        assert "error" not in bridge, (key, bridge.get("error"))
        text = tokenizer.decode(mine["input_ids"])
        assert '"name": "zoom"' in text and "<tool_call>" in text, key
        _assert_same_text_and_training(mine, bridge, tokenizer, key)
        if bridge["image_grid_thw"] is None:
            assert mine["image_grid_thw"] is None, key
            continue
        assert torch.equal(mine["image_grid_thw"], bridge["image_grid_thw"]), key
        torch.testing.assert_close(mine["pixel_values"].float(), bridge["pixel_values"].float(), rtol=0, atol=1e-5)


def test_a_single_file_video_member_fails_in_bridge_and_equals_the_processor_in_ours(tmp_path, processor):
    """A video file as one member (``videos: mp4``): Bridge 0.6.2's ``encode_sample`` takes the file's
    bytes for a list of frames (clipping it to its first ``max_num_frames`` = 60 bytes) and its collate
    hands them to qwen-vl-utils, which refuses anything but a path or a frame list (documented Bridge
    bug). Ours reads it as a video file, as our own format's videos: ids, grids and pixels equal the
    Hugging Face processor given its frames sampled at 2 fps."""
    import json
    from fractions import Fraction

    import numpy as np

    from tests.support.golden_media import make_video
    from tests.support.hf_reference import hf_reference

    video = make_video(np.random.default_rng(5), num_frames=20, rate=Fraction(10), size=(56, 84))
    samples = [{"__key__": "video-file", "mp4": video, "json": json.dumps(VIDEO_QUESTION).encode()}]
    path = write_bridge_dataset(tmp_path / "video-file", samples, VIDEO_FILE_YAML)
    theirs, ours = _bridge_rows(path, processor), _our_rows(path, processor)
    assert isinstance(theirs["video-file"].get("error"), AssertionError)  # qwen-vl-utils' fetch_video
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "\nWhat happens?"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "Flicker."}]}]
    reference = hf_reference(processor, messages, [], [video])
    mine = ours["video-file"]
    assert torch.equal(mine["input_ids"], reference["input_ids"][0])
    assert mine["video_grid_thw"].tolist() == reference["video_grid_thw"].tolist() == [[2, 20, 28]]
    torch.testing.assert_close(mine["pixel_values_videos"], reference["pixel_values_videos"], rtol=0, atol=1e-6)
    assert mine["second_per_grid_ts"].tolist() == [float(v) for v in reference["second_per_grid_ts"]]
