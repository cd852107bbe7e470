"""Tool-use conversations and chat-template options against the official Qwen templates.

Golden comparisons: a record written as Hugging Face chat data (assistant ``tool_calls`` with dict
or JSON-string arguments, ``tool`` messages, a ``tools`` list, ``chat_template_kwargs``) goes
through our path (``parse_record`` -> the stored ``<key>.json`` -> ``chat_fields_from_parts`` ->
preencode -> postencode) and must give the input ids, grids and pixels of
``processor(text=[processor.apply_chat_template(messages, tools=tools, **kwargs)], images=...)``
on the very messages of the record, and train exactly each assistant turn after its header (its
``<tool_call>`` blocks included; tool results, which the templates render in user turns, never).
Templates: the official Qwen3-VL, Qwen3.6 and Qwen3-Omni (Instruct and Thinking) ones the offline
processors carry, and the official Qwen2.5-VL one (``energon_pack/qwen/templates``, sources in
SOURCES.md, hashes checked here).
Also: records whose template cannot render them are counted skips naming the template (at
``prepare`` with a processor, and in the loader), and the bad-input reasons of tool use.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from packaging.version import Version

from energon_pack import PackingConfig
from energon_pack.core.conversation import parse_record, stored_conversation
from energon_pack.core.samples import QwenVLChatSample
from energon_pack.formats.qwen_chat import chat_fields_from_parts
from energon_pack.errors import BadSampleError
from energon_pack.qwen.chat_templates import (
    OFFICIAL_TEMPLATE_FILES,
    OFFICIAL_VARIANT_FILES,
    chat_template_for,
    official_chat_template,
)
from energon_pack.runtime.task_encoder import QwenVLPackingTaskEncoder
from energon_pack.data.synthetic import encode_image
from tests.support.hf_reference import expected_targets, hf_reference
from tests.support.paths import TEMPLATES


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "zoom", "description": "Crop a region of the picture.",
        "parameters": {"type": "object", "properties": {"box": {"type": "array", "items": {"type": "integer"}}}}}},
]


def _image(seed: int, height: int, width: int) -> bytes:
    rng = np.random.default_rng(seed)
    return encode_image(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), "PNG", "RGB")


IMAGES = (_image(1, 64, 96), _image(2, 80, 48))


def _call(name: str, arguments: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def _user(text: str, images: int = 0) -> dict[str, Any]:
    """A user turn; a text-only one as a string, as records give it (the released Qwen3-Omni templates
    tell a query by it; the others render both forms alike)."""
    if not images:
        return {"role": "user", "content": text}
    return {"role": "user", "content": [{"type": "image"}] * images + [{"type": "text", "text": text}]}


#: name -> (messages as Hugging Face chat data, number of images, with the tools list).
CASES: dict[str, tuple[list[dict[str, Any]], int, bool]] = {
    "call_with_image": ([
        {"role": "system", "content": "You look at pictures and call tools."},
        _user("Where is this, and what is the weather there?", images=1),
        {"role": "assistant", "content": "", "tool_calls": [_call("get_weather", {"city": "Paris", "unit": "C"})]},
        {"role": "tool", "name": "get_weather", "tool_call_id": "c1", "content": "18 C, sunny"},
        {"role": "assistant", "content": "Paris; 18 C and sunny."},
    ], 1, True),
    "call_without_image": ([
        _user("Weather in Rome?"),
        {"role": "assistant", "tool_calls": [_call("get_weather", {"city": "Rome"})]},
        {"role": "tool", "content": "rain"},
        {"role": "assistant", "content": "It rains in Rome."},
    ], 0, True),
    "json_string_arguments": ([
        _user("Weather in Oslo?"),
        {"role": "assistant", "content": "", "tool_calls": [_call("get_weather", '{"city":"Oslo",  "unit": "F"}')]},
        {"role": "tool", "content": "30 F"},
        {"role": "assistant", "content": "30 F in Oslo."},
    ], 0, True),
    "parallel_calls_several_results": ([
        _user("Compare the two pictures' cities.", images=2),
        {"role": "assistant", "content": "Let me check both.", "tool_calls": [
            _call("get_weather", {"city": "Lima"}), _call("zoom", {"box": [0, 0, 10, 10]})]},
        {"role": "tool", "name": "get_weather", "content": "warm"},
        {"role": "tool", "name": "zoom", "content": [{"type": "text", "text": "a harbour"}]},
        {"role": "assistant", "content": "Lima is warm; the second shows a harbour."},
    ], 2, True),
    "thinking": ([
        _user("Weather where the picture was taken?", images=1),
        {"role": "assistant", "reasoning_content": "The sign says Kyoto.", "content": "",
         "tool_calls": [_call("get_weather", {"city": "Kyoto"})]},
        {"role": "tool", "content": "cool"},
        {"role": "assistant", "reasoning_content": "Report it.", "content": "Kyoto is cool."},
    ], 1, True),
}
#: Cases each template can render (Qwen3.6 iterates arguments, so a JSON string fails there, as in HF).
FAMILY_CASES = {
    "qwen3-vl": list(CASES),
    "qwen3.5": [name for name in CASES if name != "json_string_arguments"],
    "qwen3-omni": list(CASES),
    "qwen3-omni-thinking": list(CASES),
}
#: The Qwen-Omni path calls transformers 5.24's processor keywords; the compatibility run (5.12.1)
#: leaves it out (docs/omni.md, "Processors").
NEEDS_OMNI = pytest.mark.skipif(
    Version(transformers.__version__) < Version("5.24"), reason="the Qwen-Omni path needs transformers 5.24"
)
FIXTURES = {
    "qwen3-vl": "processor_qwen3", "qwen3.5": "processor_qwen35", "qwen2.5-vl": "processor",
    "qwen3-omni": "processor_qwen3_omni", "qwen3-omni-thinking": "processor_qwen3_omni_thinking",
}


def loaded_sample(record: dict[str, Any], images: tuple[bytes, ...], key: str = "s") -> QwenVLChatSample:
    """The loader's sample of ``record``: parsed as ``prepare`` parses it, stored, read back."""
    parsed = parse_record({**record, "images": [f"{i}.png" for i in range(len(images))]})
    parts = {"json": stored_conversation(parsed), **{f"{i}.png": data for i, data in enumerate(images)}}
    return QwenVLChatSample(__key__=key, __restore_key__=(), __subflavors__=None, __sources__=None,
                            **chat_fields_from_parts(parts))


def assert_equals_hf(processor: Any, config: PackingConfig, record: dict[str, Any], images: tuple[bytes, ...],
                     template_kwargs: dict[str, Any]) -> torch.Tensor:
    """Our prepared and encoded sample of ``record`` equals the processor on its messages; returns the ids."""
    encoder = QwenVLPackingTaskEncoder(config, processor)
    prepared = encoder.preencode_sample(loaded_sample(record, images))
    assert prepared.skip_reason is None, prepared.skip_reason
    reference = hf_reference(processor, record["messages"], list(images), [], tools=record.get("tools"),
                             template_kwargs=template_kwargs)
    ids = reference["input_ids"][0]
    assert torch.equal(prepared.input_ids, ids)
    target = expected_targets(ids.tolist(), processor.tokenizer)
    np.testing.assert_array_equal(prepared.loss_mask.numpy()[:-1], target[1:].astype(np.float32))
    np.testing.assert_array_equal(prepared.labels.numpy()[:-1], np.where(target[1:], ids.numpy()[1:], -100))
    visual = encoder.postencode_sample(prepared).segment.visual
    if images:
        assert torch.equal(visual.image_grid_thw, reference["image_grid_thw"])
        assert torch.allclose(visual.pixel_values, reference["pixel_values"], atol=1e-6, rtol=0)
    else:
        assert visual.pixel_values is None and "pixel_values" not in reference
    return ids


def _config(**options: Any) -> PackingConfig:
    return PackingConfig(seq_length=8192, pixel_dtype="float32", **options)


# --- the official templates ------------------------------------------------------------------


def test_official_templates_are_the_recorded_files():
    """The shipped files are the texts SOURCES.md names (a changed byte fails here), and the offline
    Qwen3-VL / Qwen3.5 processors carry them."""
    sources = (TEMPLATES / "SOURCES.md").read_text(encoding="utf-8")
    for name in sorted({*OFFICIAL_TEMPLATE_FILES.values(), *OFFICIAL_VARIANT_FILES.values()}):
        digest = hashlib.sha256((TEMPLATES / name).read_bytes()).hexdigest()
        assert f"`{name}`: `{digest}`" in sources, name
    assert chat_template_for("qwen3-vl") == official_chat_template("qwen3-vl")
    assert chat_template_for("qwen3.5") == official_chat_template("qwen3.5")
    assert chat_template_for("qwen3-omni") == official_chat_template("qwen3-omni", "instruct")
    assert chat_template_for("qwen3-omni", "thinking") == official_chat_template("qwen3-omni", "thinking")
    assert official_chat_template("qwen3-omni", "instruct") != official_chat_template("qwen3-omni", "thinking")


@pytest.mark.parametrize("messages", [
    [_user("Hi", images=2), {"role": "assistant", "content": "Yo"}],
    [{"role": "system", "content": "Be brief."}, _user("Q"), {"role": "assistant", "content": "A"},
     {"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "\nand this?"}]},
     {"role": "assistant", "content": [{"type": "text", "text": "B"}]}],
])
def test_offline_qwen25_template_renders_as_the_official_one(processor, messages):
    """Without options the offline Qwen2-VL / Qwen2.5-VL template (kept: row digests and saved
    states depend on its hash) renders exactly as the official one."""
    official = official_chat_template("qwen2.5-vl")
    assert processor.apply_chat_template(messages) == processor.apply_chat_template(messages, chat_template=official)


# --- golden: tool use -----------------------------------------------------------------------


@pytest.mark.parametrize("family,case", [
    pytest.param(family, case, marks=[NEEDS_OMNI] if family.startswith("qwen3-omni") else [])
    for family, cases in FAMILY_CASES.items() for case in cases
])
def test_tool_use_equals_hf(request, family, case):
    processor = request.getfixturevalue(FIXTURES[family])
    messages, num_images, with_tools = CASES[case]
    record = {"messages": messages, **({"tools": TOOLS} if with_tools else {})}
    ids = assert_equals_hf(processor, _config(), record, IMAGES[:num_images], {})
    tokens = ids.tolist()
    target = expected_targets(tokens, processor.tokenizer)
    call = processor.tokenizer.convert_tokens_to_ids("<tool_call>")
    response = processor.tokenizer.convert_tokens_to_ids("<tool_response>")
    calls = sum(len(m.get("tool_calls", [])) for m in messages)
    assert sum(target[i] for i, t in enumerate(tokens) if t == call) == calls  # every call is trained (the
    # tools prompt's example <tool_call> is not)
    results = sum(m["role"] == "tool" for m in messages)
    assert tokens.count(response) >= results and not any(target[i] for i, t in enumerate(tokens) if t == response)


def test_json_string_arguments_on_qwen36_fail_there_as_in_hf(processor_qwen35):
    """The Qwen3.6 template iterates arguments (``|items``): HF raises on a JSON string, we skip the record."""
    messages = CASES["json_string_arguments"][0]
    with pytest.raises(TypeError, match="mapping"):
        processor_qwen35.apply_chat_template(messages, tools=TOOLS)
    prepared = QwenVLPackingTaskEncoder(_config(), processor_qwen35).preencode_sample(
        loaded_sample({"messages": messages, "tools": TOOLS}, ())
    )
    assert prepared.skip_reason == "template_error"


# --- golden: template options ---------------------------------------------------------------


def _two_images() -> dict[str, Any]:
    return {"messages": [_user("Compare.", images=2), {"role": "assistant", "content": "The first is wider."}]}


@pytest.mark.parametrize("family", ["qwen2.5-vl", "qwen3-vl"])
@pytest.mark.parametrize("where", ["dataset", "record"])
def test_add_vision_id_equals_hf(request, family, where):
    processor = request.getfixturevalue(FIXTURES[family])
    if family == "qwen2.5-vl":  # the official template (the offline one has no options)
        processor = copy.copy(processor)
        processor.chat_template = official_chat_template("qwen2.5-vl")
    options = {"add_vision_id": True}
    record = {**_two_images(), **({"chat_template_kwargs": options} if where == "record" else {})}
    config = _config(**({"chat_template_kwargs": options} if where == "dataset" else {}))
    with_ids = assert_equals_hf(processor, config, record, IMAGES, options)
    plain = hf_reference(processor, record["messages"], list(IMAGES), [])["input_ids"][0]
    assert not torch.equal(with_ids, plain)
    text = processor.tokenizer.decode(with_ids)
    assert "Picture 1: <|vision_start|>" in text and "Picture 2: <|vision_start|>" in text


def test_record_options_win_over_the_dataset(processor_qwen3):
    record = {**_two_images(), "chat_template_kwargs": {"add_vision_id": False}}
    ids = assert_equals_hf(processor_qwen3, _config(chat_template_kwargs={"add_vision_id": True}), record, IMAGES,
                           {"add_vision_id": False})
    assert "Picture 1:" not in processor_qwen3.tokenizer.decode(ids)


HISTORY = [
    _user("2+2?"),
    {"role": "assistant", "reasoning_content": "Two and two.", "content": "4"},
    _user("And 3+3?", images=1),
    {"role": "assistant", "reasoning_content": "Three and three.", "content": "6"},
]


@pytest.mark.parametrize("where", ["dataset", "record"])
def test_preserve_thinking_equals_hf(processor_qwen35, where):
    """Qwen3.6 keeps an earlier turn's thinking only with ``preserve_thinking`` (and trains it then)."""
    options = {"preserve_thinking": True}
    record = {"messages": HISTORY, **({"chat_template_kwargs": options} if where == "record" else {})}
    config = _config(**({"chat_template_kwargs": options} if where == "dataset" else {}))
    ids = assert_equals_hf(processor_qwen35, config, record, IMAGES[:1], options)
    assert "Two and two." in processor_qwen35.tokenizer.decode(ids)
    plain = assert_equals_hf(processor_qwen35, _config(), {"messages": HISTORY}, IMAGES[:1], {})
    assert "Two and two." not in processor_qwen35.tokenizer.decode(plain)


def test_thinking_off_renders_empty_think_blocks(processor_qwen35):
    messages = [{**m} for m in CASES["thinking"][0]]
    for message in messages:
        message.pop("reasoning_content", None)
    ids = assert_equals_hf(processor_qwen35, _config(), {"messages": messages, "tools": TOOLS}, IMAGES[:1], {})
    assert processor_qwen35.tokenizer.decode(ids).count("<think>\n\n</think>\n\n") == 2


# --- golden: the released Qwen3-Omni templates ---------------------------------------------

OMNI_VARIANTS = ["qwen3-omni", "qwen3-omni-thinking"]
#: Thinking with a tool call after a text query: the answers after the last text query render their
#: ``<think>`` blocks (the call's and the final one's), as both released templates do.
THINKING_CALL = [
    _user("Weather in Rome?"),
    {"role": "assistant", "reasoning_content": "Rome is a city; ask the tool.", "content": "",
     "tool_calls": [_call("get_weather", {"city": "Rome"})]},
    {"role": "tool", "content": "rain"},
    {"role": "assistant", "reasoning_content": "Report it.", "content": "It rains in Rome."},
]


def _think_tokens_are_trained(ids: torch.Tensor, prepared_loss_mask: torch.Tensor, tokenizer: Any) -> int:
    """The number of ``<think>`` / ``</think>`` tokens, after asserting each is a target (its loss
    sits on the position before it)."""
    marks = {tokenizer.convert_tokens_to_ids(t) for t in ("<think>", "</think>")}
    positions = [i for i, t in enumerate(ids.tolist()) if t in marks]
    assert all(prepared_loss_mask[i - 1] == 1 for i in positions)
    return len(positions)


@NEEDS_OMNI
@pytest.mark.parametrize("family", OMNI_VARIANTS)
@pytest.mark.parametrize("name,messages,with_tools", [
    ("history", HISTORY, False), ("thinking_call", THINKING_CALL, True),
])
def test_qwen3_omni_thinking_equals_hf(request, family, name, messages, with_tools):
    """Reasoning as the released templates render it: every answer after the last text query
    (a turn holding media is no query there) with its ``<think>`` block, trained like the answer."""
    processor = request.getfixturevalue(FIXTURES[family])
    record = {"messages": messages, **({"tools": TOOLS} if with_tools else {})}
    images = IMAGES[:sum(isinstance(m["content"], list) and {"type": "image"} in m["content"] for m in messages)]
    ids = assert_equals_hf(processor, _config(), record, images, {})
    text = processor.tokenizer.decode(ids)
    for message in messages:
        if message.get("reasoning_content"):
            assert f"<think>\n{message['reasoning_content']}\n</think>\n\n" in text
    encoder = QwenVLPackingTaskEncoder(_config(), processor)
    prepared = encoder.preencode_sample(loaded_sample(record, images))
    assert _think_tokens_are_trained(ids, prepared.loss_mask, processor.tokenizer) == 4


@NEEDS_OMNI
def test_qwen3_omni_plain_chat_renders_as_released(processor_qwen3_omni):
    """A plain chat: the answer to a text query opens with an empty ``<think>`` block (Instruct too);
    one to a turn holding audio does not. The released template tells a query by string content
    only, so the same text turn as typed parts would render no block: we render text turns as strings."""
    plain = [_user("Hi"), {"role": "assistant", "content": "Yo"}]
    expected = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nYo<|im_end|>\n"
    assert processor_qwen3_omni.apply_chat_template(plain) == expected
    record = loaded_sample({"messages": plain}, ())
    ids = assert_equals_hf(processor_qwen3_omni, _config(), {"messages": plain}, (), {})
    assert processor_qwen3_omni.tokenizer.decode(ids) == expected and record.conversation[0]["content"][0]["text"] == "Hi"
    options = {"enable_thinking": False}  # read by the generation prompt alone
    assert torch.equal(assert_equals_hf(processor_qwen3_omni, _config(chat_template_kwargs=options), {"messages": plain}, (),
                                        options), ids)
    typed_text = [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}, plain[1]]
    assert "<think>" not in processor_qwen3_omni.apply_chat_template(typed_text)
    heard = [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "Hi"}]}, plain[1]]
    assert processor_qwen3_omni.apply_chat_template(heard) == (
        "<|im_start|>user\n<|audio_start|><|audio_pad|><|audio_end|>Hi<|im_end|>\n<|im_start|>assistant\nYo<|im_end|>\n"
    )


@NEEDS_OMNI
def test_qwen3_omni_variants_differ_in_the_tools_prompt(processor_qwen3_omni, processor_qwen3_omni_thinking):
    """Instruct writes an empty line before ``# Tools`` without a system turn and renders a system
    turn's image into the tools prompt; Thinking adds a system turn's content as a string, so a
    system turn holding an image fails there (``template_error``), as in Hugging Face."""
    messages = [_user("Weather in Rome?"), {"role": "assistant", "content": "Rain."}]
    instruct = processor_qwen3_omni.apply_chat_template(messages, tools=TOOLS)
    thinking = processor_qwen3_omni_thinking.apply_chat_template(messages, tools=TOOLS)
    assert instruct.startswith("<|im_start|>system\n\n\n# Tools\n") and thinking.startswith("<|im_start|>system\n# Tools\n")
    seeing = [{"role": "system", "content": [{"type": "image"}, {"type": "text", "text": "Look."}]}, *messages]
    assert_equals_hf(processor_qwen3_omni, _config(), {"messages": seeing, "tools": TOOLS}, IMAGES[:1], {})
    with pytest.raises(TypeError):
        processor_qwen3_omni_thinking.apply_chat_template(seeing, tools=TOOLS)
    prepared = QwenVLPackingTaskEncoder(_config(), processor_qwen3_omni_thinking).preencode_sample(
        loaded_sample({"messages": seeing, "tools": TOOLS}, IMAGES[:1])
    )
    assert prepared.skip_reason == "template_error"


# --- what a template cannot render ----------------------------------------------------------


def test_tools_on_a_template_without_tools_are_a_counted_skip(processor):
    messages, _, _ = CASES["call_without_image"]
    official = copy.copy(processor)
    official.chat_template = official_chat_template("qwen2.5-vl")
    for candidate in (processor, official):
        prepared = QwenVLPackingTaskEncoder(_config(), candidate).preencode_sample(loaded_sample({"messages": messages}, ()))
        assert prepared.skip_reason == "template_cannot_render_tools"
    with pytest.raises(BadSampleError, match="Qwen2_5_VLProcessor.*renders none of them.*fix: train a model"):
        from energon_pack.qwen.template import render_conversation

        render_conversation(processor, loaded_sample({"messages": [_user("x"), {"role": "assistant", "content": "y"}],
                                                      "tools": TOOLS}, ()).conversation, tools=TOOLS)


def test_unknown_template_options(processor, processor_qwen3):
    with pytest.raises(ValueError, match="'preserve_thinking'.*never reads them"):
        QwenVLPackingTaskEncoder(_config(chat_template_kwargs={"preserve_thinking": True}), processor_qwen3)
    record = {**_two_images(), "chat_template_kwargs": {"add_vision_id": True}}
    prepared = QwenVLPackingTaskEncoder(_config(), processor).preencode_sample(loaded_sample(record, IMAGES))
    assert prepared.skip_reason == "unknown_template_option"  # the offline Qwen2.5-VL template has no options


@pytest.mark.parametrize("options,match", [
    ("yes", "must be an object"),
    ({"tools": []}, "'tools' is an argument of apply_chat_template"),
    ({"add_generation_prompt": True}, "training renders no generation prompt"),
    ({"not a name": 1}, "not a template variable name"),
])
def test_bad_dataset_options_are_one_line_errors(options, match):
    with pytest.raises(ValueError, match=match) as raised:
        PackingConfig.from_dict({"seq_length": 4096, "chat_template_kwargs": options})
    assert len([line for line in str(raised.value).splitlines() if line.strip().startswith("- ")]) == 1


# --- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize("messages,extra,reason", [
    ([_user("x"), {"role": "tool", "content": "42"}, {"role": "assistant", "content": "ok"}], {},
     "tool_result_before_call"),
    ([_user("x"), {"role": "assistant", "tool_calls": [{"type": "function", "function": {"arguments": {}}}]}], {},
     "tool_call_without_name"),
    ([_user("x"), {"role": "assistant", "tool_calls": [_call("f", "[1, 2]")]}], {}, "bad_tool_arguments"),
    ([_user("x"), {"role": "assistant", "tool_calls": [_call("f", "city=Paris")]}], {}, "bad_tool_arguments"),
    ([_user("x"), {"role": "assistant", "tool_calls": [_call("f", 5)]}], {}, "bad_tool_arguments"),
    ([_user("x"), {"role": "assistant", "content": "y"}], {"tools": {"name": "f"}}, "malformed_tools"),
    ([_user("x"), {"role": "assistant", "content": "y"}], {"chat_template_kwargs": ["x"]}, "bad_template_options"),
    ([_user("x"), {"role": "user", "content": "y", "tool_calls": [_call("f", {})]}], {}, "malformed_conversation"),
])
def test_bad_tool_input_is_a_counted_skip(messages, extra, reason):
    with pytest.raises(BadSampleError) as raised:
        parse_record({"messages": messages, **extra})
    assert raised.value.reason == reason
    document = json.dumps({"messages": messages, **extra}).encode()
    assert chat_fields_from_parts({"json": document})["invalid_reason"] == reason  # the loader, the same


def test_a_call_alone_is_an_assistant_turn_to_train():
    record = parse_record({"messages": [_user("x"), {"role": "assistant", "tool_calls": [_call("f", {"a": 1})]}]})
    assert record.messages[1] == {"role": "assistant", "content": [], "tool_calls": [_call("f", {"a": 1})]}


def test_records_without_tools_are_stored_as_before():
    record = parse_record({"messages": [_user("x"), {"role": "assistant", "content": "y"}]})
    assert json.loads(stored_conversation(record)) == record.messages


# --- prepared and loaded --------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3-vl", "qwen3.5"])
def test_prepared_tool_records_load_as_hf_renders_them(request, tmp_path, family):
    """``prepare`` (with the processor) and the loader: every row equals the processor on the record."""
    from energon_pack import get_packing_loader
    from energon_pack.data.prepare import prepare_dataset

    processor = request.getfixturevalue(FIXTURES[family])
    media = tmp_path / "media"
    media.mkdir()
    for index, data in enumerate(IMAGES):
        (media / f"{index}.png").write_bytes(data)
    records = {}
    for case in FAMILY_CASES[family]:
        messages, num_images, _ = CASES[case]
        records[case] = {"id": case, "messages": messages, "tools": TOOLS,
                         "images": [f"{i}.png" for i in range(num_images)]}
    options = {"add_vision_id": True} if family == "qwen3-vl" else {"preserve_thinking": True}
    records["options"] = {"id": "options", "messages": HISTORY, "images": ["0.png"], "chat_template_kwargs": options}
    records["no_tools_template"] = {"id": "no_tools_template", "messages": [_user("x"), {"role": "assistant", "content": "y"}],
                                    "chat_template_kwargs": {"no_such_option": 1}}
    (tmp_path / "records.jsonl").write_text("\n".join(json.dumps(r) for r in records.values()))
    report = prepare_dataset(tmp_path / "records.jsonl", media, tmp_path / "data", processor=processor, progress=False)
    assert [(p.record_id, p.reason) for p in report.problems] == [("no_tools_template", "unknown_template_option")]
    config = PackingConfig(seq_length=8192, max_segments=1, num_workers=0, repeat=False, pixel_dtype="float32")
    seen = set()
    with get_packing_loader(tmp_path / "data", config, processor) as loader:
        for row in loader:
            (key,) = row["__keys__"]
            record = records[key]
            reference = hf_reference(processor, record["messages"], [IMAGES[int(p[0])] for p in record["images"]], [],
                                     tools=record.get("tools"), template_kwargs=record.get("chat_template_kwargs"))
            length = int(row["cu_seqlens_q"][1])
            assert torch.equal(row["input_ids"][0, :length], reference["input_ids"][0]), key
            target = expected_targets(reference["input_ids"][0].tolist(), processor.tokenizer)
            assert torch.equal(row["loss_mask"][0, :length - 1] > 0, torch.from_numpy(target[1:])), key
            visual = row["visual_inputs"]
            if record["images"]:
                assert torch.equal(visual.image_grid_thw, reference["image_grid_thw"]), key
                assert torch.allclose(visual.pixel_values, reference["pixel_values"], atol=1e-6, rtol=0), key
            seen.add(key)
    assert seen == set(records) - {"no_tools_template"}
    from energon_pack.plan.build import measure_dataset

    _, how = measure_dataset(tmp_path / "data", QwenVLPackingTaskEncoder(config, processor), num_workers=0, progress=False)
    assert how.startswith("measured from facts")
    with_options = PackingConfig(seq_length=8192, num_workers=0, chat_template_kwargs={"add_vision_id": True})
    measured, how = measure_dataset(tmp_path / "data", QwenVLPackingTaskEncoder(with_options, processor), num_workers=0,
                                    progress=False)
    assert "chat_template_kwargs" in how  # the facts' text tokens hold no dataset options: preencoded instead


def test_template_options_enter_the_fingerprints_only_when_set():
    from energon_pack.identity import packing_fingerprint

    plain, vision_ids = PackingConfig(seq_length=4096), PackingConfig(seq_length=4096, chat_template_kwargs={"add_vision_id": True})
    assert "chat_template_kwargs" not in plain.fingerprint() and "chat_template_kwargs" not in packing_fingerprint(plain)
    assert vision_ids.fingerprint()["chat_template_kwargs"] == {"add_vision_id": True}
    assert packing_fingerprint(vision_ids)["chat_template_kwargs"] == {"add_vision_id": True}
    assert PackingConfig.from_dict(vision_ids.to_dict()).chat_template_kwargs == {"add_vision_id": True}
