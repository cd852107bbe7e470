"""Megatron-Bridge-format datasets read in place, without Megatron-Bridge (``formats.bridge_chatml``).

Datasets are written the way Bridge's tutorial and examples write them (tests/support/bridge_datasets.py):
text only, one image, several images, a frame-list video, ``role``/``content`` and ``from``/``value``
turns. Our rows equal the Hugging Face processor on the conversation Bridge's normalisation gives
(media before the text of their turn); untrusted pickles run nothing and are counted skips.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch

from energon_pack import PackingConfig, get_packing_loader
from energon_pack.errors import BadSampleError, UsageError
from energon_pack.formats.bridge_chatml import bridge_fields, check_field_map, is_bridge_dataset_config
from energon_pack.formats.safe_pickle import load_plain_pickle
from tests.support.bridge_datasets import (
    PICKLED_YAML,
    TUTORIAL_YAML,
    audio_samples,
    encoded_image,
    pickled_samples,
    tutorial_samples,
    write_bridge_dataset,
)
from tests.support.hf_reference import hf_reference

PICKLED_MAP = {"imgs": "jpgs", "videos": "videos", "conversation": "json"}


class _Touch:
    """A pickle payload that would create ``path`` when loaded by plain ``pickle.loads``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def _fields(parts: dict, field_map: dict = PICKLED_MAP) -> dict:
    return bridge_fields(parts, field_map=field_map)


@pytest.mark.slow  # more than ~3 s: make test runs it, make test-fast leaves it out
def test_reading_a_bridge_dataset_never_imports_megatron_bridge(tmp_path):
    """In a fresh interpreter (Bridge may be installed there or not): its modules stay unimported."""
    import subprocess
    import sys

    dataset = write_bridge_dataset(tmp_path / "ds", pickled_samples(), PICKLED_YAML)
    code = (
        "import sys\n"
        "from megatron.energon import WorkerConfig, get_loader, get_val_dataset\n"
        "from energon_pack.formats.dispatch import reading_formats\n"
        "with reading_formats():\n"
        f"    ds = get_val_dataset({str(dataset)!r}, split_part='train', batch_size=None,\n"
        "                         worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0))\n"
        "keys = [s.__key__ for s in get_loader(ds)]\n"
        "print(len(keys), sorted(m for m in sys.modules if m.startswith('megatron.bridge')))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip().splitlines()[-1] == "5 []", result.stdout


@pytest.mark.parametrize(
    "module",
    ["megatron.bridge.data.energon.task_encoder_utils", "megatron.bridge.models.qwen_vl.data.energon",
     "megatron.bridge.recipes.qwen_vl.data.energon.task_encoder"],
)
def test_every_module_path_of_chatmlwebdataset_is_recognised(module):
    assert is_bridge_dataset_config({"__module__": module, "__class__": "ChatMLWebdataset", "field_map": {}})
    assert not is_bridge_dataset_config({"__module__": "other.module", "__class__": "ChatMLWebdataset"})


def test_the_worked_example_keeps_the_space_around_a_placeholder():
    image = encoded_image(1, 32, 32)
    fields = _fields({
        "jpgs": pickle.dumps([image]), "videos": pickle.dumps([]),
        "json": json.dumps([{"from": "human", "value": "What is <image> this?"}, {"from": "gpt", "value": "A cat."}]).encode(),
    })
    assert fields["invalid_reason"] is None
    assert fields["conversation"] == [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]},
    ]
    assert fields["images"] == [image] and fields["videos"] == []


def test_typed_content_puts_media_before_text_like_bridge():
    fields = _fields(
        {"image.png": encoded_image(2, 28, 28, "PNG"), "conversation.json": json.dumps({"messages": [
            {"role": "user", "content": [{"type": "text", "text": "Look:"}, {"type": "image"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Seen."}]},
        ]}).encode()},
        {"imgs": "image.png", "conversation": "conversation.json"},
    )
    assert [part["type"] for part in fields["conversation"][0]["content"]] == ["image", "text"]


def test_text_only_samples_carry_empty_pickled_lists():
    fields = _fields({"jpgs": pickle.dumps([]), "videos": pickle.dumps([]), "json": b'[{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}]'})
    assert fields["invalid_reason"] is None and fields["images"] == [] and fields["videos"] == []


def test_a_pickle_that_would_run_code_runs_nothing_and_is_unsafe(tmp_path):
    marker = tmp_path / "executed"
    payload = pickle.dumps([_Touch(marker)])
    fields = _fields({"jpgs": payload, "videos": pickle.dumps([]), "json": b'[{"from": "human", "value": "<image>"}, {"from": "gpt", "value": "x"}]'})
    assert fields["invalid_reason"] == "unsafe_pickle" and "pathlib" in fields["invalid_detail"]
    assert not marker.exists()


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (pickle.dumps([b"abc"])[:-3], "truncated_pickle"),
        (b"not a pickle at all", "truncated_pickle"),
        (pickle.dumps([b"x" * 400]), "member_too_large"),
        (pickle.dumps(__import__("numpy").zeros((2, 2), dtype="uint8")), "pickled_pixel_arrays"),
        (pickle.dumps({"not": "a list"}), "malformed_media_list"),
    ],
)
def test_bad_pickled_members_are_skips_with_their_own_reason(data, reason):
    fields = bridge_fields(
        {"jpgs": data, "videos": pickle.dumps([]), "json": b'[{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}]'},
        field_map=PICKLED_MAP, max_pickle_bytes=300,
    )
    assert fields["invalid_reason"] == reason, fields["invalid_detail"]


@pytest.mark.parametrize(
    ("parts", "reason"),
    [
        ({"jpgs": pickle.dumps([]), "json": b'[{"from": "human", "value": "<image>Hi"}, {"from": "gpt", "value": "Yo"}]'}, "placeholder_mismatch"),
        ({"jpgs": pickle.dumps([]), "json": b'[{"from": "human", "value": "Hi"}]'}, "no_assistant_turn"),
        ({"jpgs": pickle.dumps([]), "json": b"\xff\xfe"}, "non_utf8_text"),
        ({"jpgs": pickle.dumps([])}, "malformed_conversation"),
        ({"json": b'{"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}], "tools": {"name": "f"}}'}, "malformed_tools"),
        ({"json": b'{"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}], "tools": ["f"]}'}, "malformed_tools"),
    ],
)
def test_bad_conversations_are_counted_reasons(parts, reason):
    assert _fields(parts)["invalid_reason"] == reason


TOOLS = [{"type": "function", "function": {
    "name": "zoom", "description": "Crop a region of the picture.",
    "parameters": {"type": "object", "properties": {"box": {"type": "array", "items": {"type": "integer"}}}}}}]
TOOL_TURNS = [{"from": "human", "value": "<image>Zoom on the cat."}, {"from": "gpt", "value": "Zooming."}]


@pytest.mark.parametrize(
    ("field_map", "member"),
    [
        (PICKLED_MAP, {}),
        ({**PICKLED_MAP, "tools": "tools.json"}, {"tools.json": json.dumps(TOOLS).encode()}),
        ({**PICKLED_MAP, "tools": "tools.pyd"}, {"tools.pyd": pickle.dumps(TOOLS)}),
    ],
    ids=["in-conversation-json", "json-member", "pickled-member"],
)
def test_a_bridge_sample_with_tools_gives_the_processor_ids_with_those_tools(processor_qwen3, field_map, member):
    """Bridge 0.6.2 passes a sample's tools (its ``tools`` member, else the conversation JSON's) to
    ``apply_chat_template(messages, tools=...)``; our rows equal the Qwen3-VL processor called so."""
    from energon_pack.core.samples import QwenVLChatSample
    from energon_pack.runtime.task_encoder import QwenVLPackingTaskEncoder

    image = encoded_image(3, 64, 48)
    payload = {"conversations": TOOL_TURNS, **({} if member else {"tools": TOOLS})}
    fields = bridge_fields({"jpgs": pickle.dumps([image]), "json": json.dumps(payload).encode(), **member}, field_map=field_map)
    assert fields["invalid_reason"] is None and fields["tools"] == TOOLS
    sample = QwenVLChatSample(__key__="t", __restore_key__=(), __subflavors__=None, __sources__=None, **fields)
    prepared = QwenVLPackingTaskEncoder(PackingConfig(seq_length=4096), processor_qwen3).preencode_sample(sample)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Zoom on the cat."}]},
                {"role": "assistant", "content": [{"type": "text", "text": "Zooming."}]}]
    reference = hf_reference(processor_qwen3, messages, [image], [], tools=TOOLS)
    without = hf_reference(processor_qwen3, messages, [image], [])
    assert torch.equal(prepared.input_ids, reference["input_ids"][0])
    assert len(reference["input_ids"][0]) > len(without["input_ids"][0])


def test_bridge_turns_keep_their_tool_calls_and_tool_results(processor_qwen3):
    """Bridge keeps every field of a turn (``cook_chatml_sample``): an assistant turn's ``tool_calls``
    and a tool turn's ``name`` / ``tool_call_id`` reach the template, in ``from``/``value`` turns too;
    our ids equal the processor's on those messages (the compatibility run checks Bridge's own)."""
    from energon_pack.core.samples import QwenVLChatSample
    from energon_pack.runtime.task_encoder import QwenVLPackingTaskEncoder

    call = {"type": "function", "function": {"name": "zoom", "arguments": {"box": [1, 2, 3, 4]}}}
    turns = [{"from": "human", "value": "Zoom on the cat."}, {"from": "gpt", "value": "", "tool_calls": [call]},
             {"role": "tool", "name": "zoom", "tool_call_id": "c1", "content": "a grey cat"},
             {"from": "gpt", "value": "A grey cat.", "reasoning_content": "It is grey."}]
    fields = bridge_fields({"json": json.dumps({"conversations": turns, "tools": TOOLS}).encode()},
                           field_map={"conversation": "json"})
    assert fields["invalid_reason"] is None, fields["invalid_detail"]
    assert fields["conversation"][1]["tool_calls"] == [call]
    assert {k: fields["conversation"][2][k] for k in ("name", "tool_call_id")} == {"name": "zoom", "tool_call_id": "c1"}
    sample = QwenVLChatSample(__key__="c", __restore_key__=(), __subflavors__=None, __sources__=None, **fields)
    prepared = QwenVLPackingTaskEncoder(PackingConfig(seq_length=4096), processor_qwen3).preencode_sample(sample)
    messages = [{"role": "user", "content": "Zoom on the cat."}, {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "name": "zoom", "tool_call_id": "c1", "content": "a grey cat"},
                {"role": "assistant", "content": "A grey cat."}]
    reference = hf_reference(processor_qwen3, messages, [], [], tools=TOOLS)
    assert prepared.skip_reason is None, prepared.skip_detail
    assert torch.equal(prepared.input_ids, reference["input_ids"][0])
    assert "<tool_call>" in processor_qwen3.tokenizer.decode(prepared.input_ids)


def test_a_tools_member_wins_over_the_conversation_json_and_a_malformed_one_is_a_skip():
    field_map = {"conversation": "json", "tools": "tools.json"}
    other = [{"type": "function", "function": {"name": "other"}}]
    turns = json.dumps({"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}], "tools": other}).encode()
    assert bridge_fields({"json": turns, "tools.json": json.dumps(TOOLS).encode()}, field_map=field_map)["tools"] == TOOLS
    assert bridge_fields({"json": turns, "tools.json": b""}, field_map=field_map)["tools"] == other
    assert bridge_fields({"json": turns, "tools.json": b"[]"}, field_map=field_map)["tools"] is None
    assert bridge_fields({"json": turns, "tools.json": b"{not json"}, field_map=field_map)["invalid_reason"] == "malformed_tools"
    assert bridge_fields({"json": turns, "tools.json": b'"zoom"'}, field_map=field_map)["invalid_reason"] == "malformed_tools"


AUDIO_MAP = {"imgs": "jpgs", "audio": "audio", "conversation": "json"}


def test_the_audio_member_is_the_records_one_audio():
    samples = {sample["__key__"]: sample for sample in audio_samples()}
    for key, sample in samples.items():
        fields = _fields(sample, AUDIO_MAP)
        assert fields["invalid_reason"] is None, fields["invalid_detail"]
        assert fields["conversation"] == sample["record"]["messages"], key
        assert fields.get("audios", []) == ([sample["audio"]] if sample["audio"] else []), key
    assert "audios" not in _fields(samples["speech-3"], AUDIO_MAP)  # an empty member: no audio


def test_an_audio_without_its_placeholder_is_a_counted_skip():
    turns = json.dumps([{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}]).encode()
    fields = bridge_fields({"json": turns, "audio.wav": b"RIFF"}, field_map={"conversation": "json", "audio": "audio.wav"})
    assert fields["invalid_reason"] == "placeholder_mismatch" and "0 audio placeholder(s) but 1 audio(s)" in fields["invalid_detail"]


@pytest.mark.slow  # builds the offline Qwen2.5-VL processor when no other test did
def test_a_vision_processor_hears_no_bridge_audio(processor):
    from energon_pack.core.samples import QwenVLChatSample
    from energon_pack.runtime.task_encoder import QwenVLPackingTaskEncoder

    sample = audio_samples()[0]
    raw = QwenVLChatSample(__key__="s", __restore_key__=(), __subflavors__=None, __sources__=None, **_fields(sample, AUDIO_MAP))
    prepared = QwenVLPackingTaskEncoder(PackingConfig(seq_length=4096), processor).preencode_sample(raw)
    assert prepared.skip_reason == "audio_not_supported"


def test_the_restricted_unpickler_admits_plain_values_of_every_protocol():
    value = [b"\xff\xd8", bytearray(b"ab"), "s", 1, 2.5, (1, 2), {"k": {1, 2}}, frozenset({3}), None, True, 1j]
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        assert load_plain_pickle(pickle.dumps(value, protocol=protocol), what="jpgs") == value


@pytest.mark.parametrize(
    ("field_map", "needle"),
    [
        ({"imgs": "jpgs"}, "no conversation"),
        ({"conversation": "json", "captions": "txt"}, "unknown fields ['captions']"),
        ({"conversation": "json", "videos": "jpgs"}, "one-frame video"),
        ({"conversation": "json", "imgs": "image.txt"}, "cannot read as imgs"),
        ({"conversation": "json", "audio": "npy"}, "not an audio file member"),
        ({"conversation": "json", "audio": "pyd"}, "not an audio file member"),
    ],
)
def test_an_unreadable_field_map_is_refused_in_one_line(field_map, needle):
    with pytest.raises(UsageError) as caught:
        check_field_map(field_map)
    assert needle in str(caught.value) and "fix:" in str(caught.value) and "\n" not in str(caught.value)


def _rows(path: Path, processor, **config) -> tuple[list[dict], dict]:
    settings = {"seq_length": 2048, "buffer_size": 4, "num_workers": 0, "repeat": False, "pixel_dtype": "float32", **config}
    with get_packing_loader(path, PackingConfig(**settings), processor) as loader:
        rows = list(loader)
        return rows, loader.stats()


def row_segments(row: dict) -> dict[str, torch.Tensor]:
    """Each sample's real input ids in a THD row, by key (cu_seqlens_q: real lengths, _padded: starts)."""
    lengths = row["cu_seqlens_q"].diff().tolist()
    starts = row["cu_seqlens_q_padded"].tolist()
    return {key: row["input_ids"][0, start : start + length] for key, start, length in zip(row["__keys__"], starts, lengths)}


def test_bridge_datasets_load_with_rows_equal_to_the_hf_processor(tmp_path, processor):
    """Tutorial and pickled layouts; every sample's ids equal HF on Bridge's normalised conversation."""
    expected = {}
    for layout, samples in (("tutorial", tutorial_samples()), ("pickled", pickled_samples(with_video=False))):
        for sample in samples:
            images = [sample["image.png"]] if layout == "tutorial" else pickle.loads(sample["jpgs"])
            fields = bridge_fields(dict(sample), field_map=(
                {"imgs": "image.png", "conversation": "conversation.json"} if layout == "tutorial" else PICKLED_MAP))
            reference = hf_reference(processor, fields["conversation"], images, [])
            expected[sample["__key__"]] = reference["input_ids"][0]
    tutorial = write_bridge_dataset(tmp_path / "tutorial", tutorial_samples(), TUTORIAL_YAML)
    pickled = write_bridge_dataset(tmp_path / "pickled", pickled_samples(with_video=False), PICKLED_YAML)
    seen = {}
    for path in (tutorial, pickled):
        rows, stats = _rows(path, processor)
        assert stats["skipped"] == {}, stats["skipped"]
        for row in rows:
            for key, segment in row_segments(row).items():
                seen[key] = segment
    assert sorted(seen) == sorted(expected)
    for key, ids in expected.items():
        assert torch.equal(seen[key], ids), key


def _hf_frame_list_reference(processor, messages, videos):
    """The Hugging Face processor given the frames themselves (decoded with Pillow), every one of
    them, without sampling (``do_sample_frames=False``: it pads an odd count with the last frame),
    their metadata saying they were taken at the processor's rate (``VisionSpec.fps``):
    docs/foreign_datasets.md."""
    import io

    import numpy as np
    from PIL import Image
    from transformers.video_utils import VideoMetadata

    from energon_pack.qwen.geometry import VisionSpec

    rate = VisionSpec.from_processor(processor).fps
    clips = [np.stack([np.asarray(Image.open(io.BytesIO(frame)).convert("RGB")) for frame in frames]) for frames in videos]
    metadata = [VideoMetadata(total_num_frames=len(clip), fps=rate, frames_indices=list(range(len(clip)))) for clip in clips]
    return processor(
        text=[processor.apply_chat_template(list(messages))], videos=clips, video_metadata=metadata,
        do_sample_frames=False, return_tensors="pt",
    )


@pytest.mark.parametrize("num_frames", [3, 5, 6, 7, 9])
@pytest.mark.parametrize("family", ["processor", "processor_qwen3"])
def test_a_frame_list_video_equals_the_hf_processor_given_those_frames(request, family, num_frames):
    """Golden: ids, grids, pixels (float32 and the uint8 payload) and ``second_per_grid_ts`` of a
    frame list equal the processor's given every frame; an odd count keeps its last frame (the
    processor repeats it: t = ceil(n / 2)), and preencode's token count (headers only) is the
    decoded row's."""
    from energon_pack import QwenVLPackingTaskEncoder
    from energon_pack.core.samples import QwenVLChatSample
    from tests.support.bridge_datasets import frame_list

    processor = request.getfixturevalue(family)
    frames = frame_list(7, num_frames, 96, 64)
    fields = _fields({
        "jpgs": pickle.dumps([]), "videos": pickle.dumps([frames]),
        "json": json.dumps([{"from": "human", "value": "<video>\nWhat happens?"}, {"from": "gpt", "value": "Flicker."}]).encode(),
    })
    assert fields["invalid_reason"] is None and fields["videos"] == [tuple(frames)]
    sample = QwenVLChatSample(__key__="v", __restore_key__=(), __subflavors__=None, __sources__=None, **fields)
    reference = _hf_frame_list_reference(processor, fields["conversation"], fields["videos"])
    assert reference["video_grid_thw"][0, 0] == -(-num_frames // 2)
    visuals = {}
    for dtype in ("float32", "uint8"):
        encoder = QwenVLPackingTaskEncoder(PackingConfig(seq_length=4096, pixel_dtype=dtype), processor)
        prepared = encoder.preencode_sample(sample)
        assert prepared.skip_reason is None, prepared.skip_detail
        assert torch.equal(prepared.input_ids, reference["input_ids"][0])
        slots = encoder.allocate_row_pixels([prepared])[0]
        encoded = encoder.postencode_sample(prepared, slots)
        assert torch.equal(encoded.segment.input_ids, prepared.input_ids)
        visuals[dtype] = encoded.segment.visual
        assert torch.equal(visuals[dtype].video_grid_thw, reference["video_grid_thw"])
        if "second_per_grid_ts" in reference:
            assert prepared.second_per_grid_ts == [float(v) for v in reference["second_per_grid_ts"]] == [1.0]
    torch.testing.assert_close(visuals["float32"].pixel_values_videos, reference["pixel_values_videos"], rtol=0, atol=1e-6)
    normalised = visuals["uint8"].normalized_for_model()["pixel_values_videos"]
    torch.testing.assert_close(normalised, reference["pixel_values_videos"], rtol=0, atol=1e-6)


@pytest.mark.parametrize("family", ["processor", "processor_qwen3"])
def test_a_one_frame_list_is_what_the_processor_makes_of_one_frame(request, family):
    """Qwen2.5-VL pads one frame to a temporal step; Qwen3-VL from transformers 5.15 refuses a clip
    shorter than the temporal patch, and so do we (``too_few_frames``)."""
    from energon_pack import QwenVLPackingTaskEncoder
    from energon_pack.core.samples import QwenVLChatSample
    from energon_pack.qwen.geometry import VisionSpec
    from tests.support.bridge_datasets import frame_list

    processor = request.getfixturevalue(family)
    fields = _fields({"videos": pickle.dumps([frame_list(3, 1, 96, 64)]),
                      "json": b'[{"from": "human", "value": "<video>Go"}, {"from": "gpt", "value": "x"}]'})
    sample = QwenVLChatSample(__key__="one", __restore_key__=(), __subflavors__=None, __sources__=None, **fields)
    encoder = QwenVLPackingTaskEncoder(PackingConfig(seq_length=4096, pixel_dtype="float32"), processor)
    prepared = encoder.preencode_sample(sample)
    if VisionSpec.from_processor(processor).clip_rule == "round":
        with pytest.raises(ValueError, match="temporal_factor"):
            _hf_frame_list_reference(processor, fields["conversation"], fields["videos"])
        assert prepared.skip_reason == "too_few_frames"
        return
    reference = _hf_frame_list_reference(processor, fields["conversation"], fields["videos"])
    assert prepared.skip_reason is None and torch.equal(prepared.input_ids, reference["input_ids"][0])
    visual = encoder.postencode_sample(prepared).segment.visual
    assert torch.equal(visual.video_grid_thw, reference["video_grid_thw"]) and visual.video_grid_thw[0, 0] == 1
    torch.testing.assert_close(visual.pixel_values_videos, reference["pixel_values_videos"], rtol=0, atol=1e-6)


def test_frame_lists_with_mixed_sizes_are_a_counted_skip(processor):
    from energon_pack import QwenVLPackingTaskEncoder
    from energon_pack.core.samples import QwenVLChatSample
    from tests.support.bridge_datasets import frame_list

    frames = frame_list(8, 3, 64, 48) + frame_list(9, 1, 48, 64)
    fields = _fields({"videos": pickle.dumps([frames]),
                      "json": b'[{"from": "human", "value": "<video>"}, {"from": "gpt", "value": "x"}]'})
    sample = QwenVLChatSample(__key__="m", __restore_key__=(), __subflavors__=None, __sources__=None, **fields)
    prepared = QwenVLPackingTaskEncoder(PackingConfig(seq_length=4096), processor).preencode_sample(sample)
    assert prepared.skip_reason == "mixed_frame_sizes" and "frame 3 is 48x64" in prepared.skip_detail


def test_a_frame_list_uint8_payload_normalises_to_the_float32_payload(processor):
    """The default uint8 payload (patched straight into the row by ``VideoPatcher``) of a frame list."""
    from energon_pack import QwenVLPackingTaskEncoder
    from energon_pack.core.samples import QwenVLChatSample
    from tests.support.bridge_datasets import frame_list

    fields = _fields({"videos": pickle.dumps([frame_list(10, 4, 96, 64)]),
                      "json": b'[{"from": "human", "value": "<video>Go"}, {"from": "gpt", "value": "x"}]'})
    sample = QwenVLChatSample(__key__="u", __restore_key__=(), __subflavors__=None, __sources__=None, **fields)
    visuals = {}
    for dtype in ("float32", "uint8"):
        encoder = QwenVLPackingTaskEncoder(PackingConfig(seq_length=4096, pixel_dtype=dtype), processor)
        prepared = encoder.preencode_sample(sample)
        slots = encoder.allocate_row_pixels([prepared])[0]
        visuals[dtype] = encoder.postencode_sample(prepared, slots).segment.visual
    assert visuals["uint8"].pixel_values_videos.dtype == torch.uint8
    normalised = visuals["uint8"].normalized_for_model()["pixel_values_videos"]
    torch.testing.assert_close(normalised, visuals["float32"].pixel_values_videos, rtol=0, atol=1e-6)
