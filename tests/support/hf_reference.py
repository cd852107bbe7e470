"""The Hugging Face reference the golden tests compare preencode and postencode with.

``hf_reference(processor, messages, images, videos)`` calls the processor as
docs/batch_contract.md says:
``processor(text=[processor.apply_chat_template(messages)], images=[PIL images] or None,
videos=[rgb24 frames at the sampled indices], video_metadata=[VideoMetadata(T, fps_in, indices)],
do_sample_frames=False, return_tensors="pt")``.

Images are opened the way ``transformers.image_utils.load_image`` turns them upright
(``ImageOps.exif_transpose``), keeping their mode, so the processor's ``convert_to_rgb`` composites
transparency on white (``load_image``'s own ``convert("RGB")`` would drop alpha instead; the
processor on a plain ``Image.open`` is what docs/batch_contract.md promises for such images).

Videos are decoded here with PyAV, every frame, without ``energon_pack``'s header probe
(``probe_video``) or frame decoder (``decode_video_frames``): T is the number of frames the
decoder outputs and fps_in the stream's average rate, so a bug in either of ours shows up as a
golden difference. Only the frame *choice* (``sample_frame_indices``, checked against the
qwen-vl-utils formula in tests/qwen/test_geometry.py) is shared.
"""

from __future__ import annotations

import dataclasses
import io
from typing import Any

import av
import numpy as np
from PIL import Image, ImageOps
from transformers.video_utils import VideoMetadata

from energon_pack.qwen.geometry import VisionSpec, sample_frame_indices

#: The tests/conftest.py fixture holding each family's offline processor.
PROCESSOR_FIXTURES = {"qwen2.5-vl": "processor", "qwen3-vl": "processor_qwen3", "qwen3.5": "processor_qwen35"}


def decoded_frames(data: bytes) -> tuple[list[av.VideoFrame], float]:
    """Every decoded frame of the first video stream, not yet converted to RGB (T frames), and the
    stream's average rate (frames/s). Converting only the frames one needs is most of the saving:
    decoding took a fifth of the time the RGB conversions of every frame took (golden
    mix references: 3.7 s against 16.7 s under cProfile)."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        return list(container.decode(stream)), float(stream.average_rate)


def rgb_frames(frames: list[av.VideoFrame]) -> np.ndarray:
    """Decoded frames as RGB uint8 [T, H, W, 3]."""
    return np.stack([frame.to_ndarray(format="rgb24") for frame in frames])


def decoded_video(data: bytes) -> tuple[np.ndarray, float]:
    """Every frame of the first video stream as RGB uint8 [T, H, W, 3], and its average rate (frames/s)."""
    frames, rate = decoded_frames(data)
    return rgb_frames(frames), rate


def upright_image(data: bytes) -> Image.Image:
    """The image of ``data`` as ``load_image`` orients it (first frame, mode kept)."""
    return ImageOps.exif_transpose(Image.open(io.BytesIO(data)))


def hf_reference(
    processor: Any,
    messages: list[dict[str, Any]],
    images: list[bytes],
    videos: list[bytes],
    *,
    image_max_pixels: int | None = None,
    max_frames: int | None = None,
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> Any:
    """The processor's ``BatchFeature`` (batch of 1) for one chat; per-sample limits (a shrunk
    sample) go into this call only: ``image_max_pixels`` as the image size limit, ``max_frames``
    into the frame sampling. ``tools`` and ``template_kwargs`` go to ``apply_chat_template``."""
    call: dict[str, Any] = {}
    if image_max_pixels is not None:
        call["images_kwargs"] = {"size": {**dict(processor.image_processor.size), "longest_edge": image_max_pixels}}
    if videos:
        spec = VisionSpec.from_processor(processor)
        if max_frames is not None:
            spec = dataclasses.replace(spec, max_frames=max_frames)
        clips, metadata = [], []
        for data in videos:
            frames, rate = decoded_frames(data)
            indices = sample_frame_indices(len(frames), rate, spec)
            clips.append(rgb_frames([frames[index] for index in indices]))
            metadata.append(VideoMetadata(total_num_frames=len(frames), fps=rate, frames_indices=list(indices)))
        call.update(videos=clips, video_metadata=metadata, do_sample_frames=False)
    return processor(
        text=[processor.apply_chat_template(list(messages), tools=tools, **(template_kwargs or {}))],
        images=[upright_image(data) for data in images] or None,
        return_tensors="pt",
        **call,
    )


#: The token side of a reference: what preencode is compared with (no pixel tensors).
TOKEN_FIELDS = ("input_ids", "image_grid_thw", "video_grid_thw", "second_per_grid_ts")


class GoldenReferences:
    """HF references of golden samples, shared by the golden tests of one session.

    ``full`` runs the processor (pixels included) and keeps the token side; ``tokens`` returns a
    kept token side, or runs the processor. A key names the processor fixture, the mix seed and the
    sample's index, so one run of the processor serves the postencode (pixels) and the preencode
    (tokens) comparison of the same sample. Example: ``full("processor", 7, 3, ...)`` then
    ``tokens("processor", 7, 3, ...)`` -> the same ``input_ids``, the processor run once.
    """

    def __init__(self) -> None:
        self._tokens: dict[tuple[str, int, int], dict[str, Any]] = {}
        self._mixes: dict[tuple[int, str], list[Any]] = {}
        self.processor_runs = 0

    def samples(self, n: int, seed: int, family: str) -> list[Any]:
        """``golden_samples(n, seed, family=family)``, generated once per mix: the longest list made so
        far is kept and a shorter one is its prefix (mixes are prefix-stable). Example: 500 samples,
        then 300 of the same mix -> the first 300 of the 500, nothing encoded again."""
        from tests.support.golden_media import golden_samples

        kept = self._mixes.get((seed, family), [])
        if len(kept) < n:
            kept = self._mixes[(seed, family)] = golden_samples(n, seed, family=family)
        return kept[:n]

    def full(self, fixture: str, seed: int, index: int, processor: Any, golden: Any) -> Any:
        """The whole reference (``hf_reference``) of golden sample ``index`` of mix ``seed``."""
        reference = hf_reference(processor, golden.messages, golden.images, golden.videos)
        self.processor_runs += 1
        self._tokens[(fixture, seed, index)] = {name: reference[name] for name in TOKEN_FIELDS if name in reference}
        return reference

    def tokens(self, fixture: str, seed: int, index: int, processor: Any, golden: Any) -> dict[str, Any]:
        """The token side (``TOKEN_FIELDS`` present in the reference) of the same sample."""
        kept = self._tokens.get((fixture, seed, index))
        return kept if kept is not None else self.full(fixture, seed, index, processor, golden)


def expected_targets(ids: list[int], tokenizer: Any) -> np.ndarray:
    """Bool [L]: the tokens after each ``<|im_start|>assistant\\n`` through its ``<|im_end|>``."""
    header = tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    target = np.zeros(len(ids), dtype=bool)
    position = 0
    while position < len(ids):
        if ids[position:position + len(header)] == header:
            stop = ids.index(end, position + len(header))
            target[position + len(header):stop + 1] = True
            position = stop + 1
        else:
            position += 1
    return target
