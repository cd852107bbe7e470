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
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests.support.bridge_datasets import PICKLED_YAML, TUTORIAL_YAML, encoded_image, frame_list, write_bridge_dataset

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
        "json": json.dumps([{"from": "human", "value": "<video>\nWhat happens?"}, {"from": "gpt", "value": "Flicker."}]).encode(),
    })
    tutorial = [
        {"__key__": f"tutorial-{i:06d}", "image.png": encoded_image(30 + i, 28 * (2 + i), 56, "PNG"),
         "conversation.json": json.dumps([
             {"role": "user", "content": [{"type": "text", "text": f"Picture {i}?"}, {"type": "image"}]},
             {"role": "assistant", "content": [{"type": "text", "text": f"Noise {i}."}]},
         ]).encode()}
        for i in range(3)
    ]
    return pickled, tutorial


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
    rows = {}
    for key, sample in _read(path, ours=False).items():
        collated = encoder.collate_fn([encoder.encode_sample(sample).example])
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
        if key == "bridge-000002":  # documented: Bridge glues the words around a placeholder
            assert "Compare and." in tokenizer.decode(mine["input_ids"])
            assert "Compareand." in tokenizer.decode(bridge["input_ids"])
        else:
            assert torch.equal(mine["input_ids"], bridge["input_ids"]), key
            extra = set(bridge["trained"]) - set(mine["trained"])
            assert set(mine["trained"]) <= set(bridge["trained"]), key
            assert extra == _newlines_after_assistant_end(mine["input_ids"], mine["trained"], tokenizer), (key, extra)
            assert extra, f"{key}: Bridge is expected to train the newline after <|im_end|>"
        if key == "bridge-video":
            assert torch.equal(mine["video_grid_thw"], bridge["video_grid_thw"])
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
