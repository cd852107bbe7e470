"""What the benchmarks share: the benchmark mix, its prepared dataset, and the baseline
Hugging Face processor call that each benchmark measures our pipeline against."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from energon_pack.core.samples import QwenVLChatSample

#: Image and video sizes of the benchmark mix: photos of about 0.3-12 MP, panning clips of 10-120 s
#: (encoded with x264 "ultrafast" and generated frame by frame, so the mix is quick to make).
BENCH_SPEC_KWARGS: dict[str, Any] = dict(
    min_image_side=548,
    max_image_side=3464,
    min_video_seconds=10.0,
    max_video_seconds=120.0,
    video_fps_choices=(10, 24),
    max_video_side=320,
    panning_video=True,
    video_preset="ultrafast",
)
#: Version of the bench mix in its cache folder names (bumped when BENCH_SPEC_KWARGS change).
BENCH_MIX_VERSION = 2

#: Table rows of one benchmark: ``{"what": ..., "ours": ..., "HF": ..., "ratio": ...}``.
BenchRows = list[dict[str, Any]]


def bench_samples(work_dir: Path, num_samples: int, *, seed: int = 0) -> list[QwenVLChatSample]:
    """The benchmark mix (``energon_pack.data.synthetic`` records with big images), generated once under ``work_dir``.

    Media are read back as compressed bytes into ``QwenVLChatSample`` objects (no Energon dataset).
    """
    from energon_pack.core.conversation import parse_record
    from energon_pack.data.synthetic import SyntheticSpec, make_records

    raw = Path(work_dir) / f"mix{BENCH_MIX_VERSION}-{num_samples}-{seed}"
    done = raw / ".complete"
    if not done.exists():
        print(f"generating {num_samples} benchmark samples in {raw} (once)")
        make_records(raw, num_samples, seed=seed, spec=SyntheticSpec(**BENCH_SPEC_KWARGS))
        done.touch()
    samples = []
    for line in (raw / "records.jsonl").read_text(encoding="utf-8").splitlines():
        record = parse_record(json.loads(line))
        samples.append(
            QwenVLChatSample(
                __key__=record.id,
                __restore_key__=(),
                __subflavors__=None,
                __sources__=None,
                conversation=record.messages,
                images=[(raw / name).read_bytes() for name in record.images],
                videos=[(raw / name).read_bytes() for name in record.videos],
            )
        )
    return samples


def bench_dataset(work_dir: Path, num_samples: int, *, seed: int = 0) -> Path:
    """The benchmark mix of `bench_samples` prepared (once) as an Energon dataset; returns its path."""
    from energon_pack.data.prepare import prepare_dataset

    bench_samples(work_dir, num_samples, seed=seed)
    raw = Path(work_dir) / f"mix{BENCH_MIX_VERSION}-{num_samples}-{seed}"
    out = Path(work_dir) / f"dataset{BENCH_MIX_VERSION}-{num_samples}-{seed}"
    if not (out / ".nv-meta" / "dataset.yaml").exists():
        prepare_dataset(raw / "records.jsonl", raw, out, samples_per_shard=16, progress=False)
    return out


def hf_processor_outputs(
    processor: Any,
    messages: Sequence[dict],
    images: Sequence[bytes],
    videos: Sequence[bytes],
    audios: Sequence[bytes] = (),
    *,
    use_audio_in_video: bool = False,
) -> Any:
    """The baseline: the Hugging Face processor output for one chat, called as docs/batch_contract.md says.

    Images go in as opened PIL images turned upright by their EXIF orientation (as
    ``transformers.image_utils.load_image`` turns them); video frames are decoded with PyAV (rgb24), every
    frame in order as ``load_video`` does (no seeking), kept at the frame indices of
    ``sample_frame_indices`` and passed with ``do_sample_frames=False`` and their ``VideoMetadata``.
    Qwen-Omni: each sound (an audio, or with ``use_audio_in_video`` a video's sound track) decoded to
    the feature extractor's rate (`qwen.audio.decode_audio`), one per slot in placeholder order with
    ``audio_from_video_indices`` and ``load_audio_from_video`` (`omni_audio_kwargs`); the processor
    pads them as it does (Qwen2.5-Omni: each to 300 s). Returns the processor's ``BatchFeature`` (tensors, batch of 1).
    """
    from PIL import Image, ImageOps

    from energon_pack.qwen.geometry import VisionSpec, sample_frame_indices
    from energon_pack.qwen.media import probe_video
    from energon_pack.qwen.pixels import decode_video_frames
    from energon_pack.qwen.template import VideoTiming

    call_kwargs: dict[str, Any] = {}
    if videos:
        spec = VisionSpec.from_processor(processor)
        frames, metadata = [], []
        for data in videos:
            info = probe_video(data)
            timing = VideoTiming(
                total_frames=info.num_frames,
                fps=info.fps,
                frame_indices=tuple(sample_frame_indices(info.num_frames, info.fps, spec)),
            )
            frames.append(decode_video_frames(data, timing.frame_indices, timing.total_frames, seek=False))
            metadata.append(timing.metadata())
        call_kwargs.update(videos=frames, video_metadata=metadata, do_sample_frames=False)
    if audios or use_audio_in_video:
        call_kwargs.update(omni_audio_kwargs(processor, messages, audios, videos, use_audio_in_video=use_audio_in_video))
    return processor(
        text=[processor.apply_chat_template(list(messages))],
        images=[ImageOps.exif_transpose(Image.open(io.BytesIO(data))) for data in images] or None,
        return_tensors="pt",
        **call_kwargs,
    )


def omni_audio_kwargs(
    processor: Any, messages: Sequence[dict], audios: Sequence[bytes], videos: Sequence[bytes], *, use_audio_in_video: bool
) -> dict[str, Any]:
    """The Qwen-Omni processor's audio keywords for one chat: ``audio`` (one mono float32 waveform
    per sound slot, in placeholder order) and, with ``use_audio_in_video``, ``load_audio_from_video``
    and ``audio_from_video_indices`` (None for an audio part, the video's index for a heard video).

    Example: parts [video, audio] heard -> audio=[sound of videos[0], audios[0]], indices [0, None].
    """
    from energon_pack.tools.audio_floor import pyav_waveform

    # The processor hears what it is given, up to the model's cap: decoded with PyAV frame by frame
    # (the plain decode an eager pipeline writes; the same waveform as ours) at its extractor's rate.
    extractor = processor.feature_extractor
    rate, cap = int(extractor.sampling_rate), int(extractor.n_samples)
    slots: list[int | None] = []
    video_index = 0
    for message in messages:
        for part in message["content"]:
            if part["type"] == "audio":
                slots.append(None)
            elif part["type"] == "video":
                if use_audio_in_video:
                    slots.append(video_index)
                video_index += 1
    standalone = iter(audios)
    waveforms = [pyav_waveform(next(standalone) if slot is None else videos[slot], rate)[:cap] for slot in slots]
    kwargs: dict[str, Any] = {"audio": waveforms} if waveforms else {}
    if use_audio_in_video:
        kwargs.update(load_audio_from_video=True, audio_from_video_indices=slots)
    return kwargs


def tensor_bytes(outputs: Any) -> int:
    """Bytes of every tensor in a mapping (e.g. a ``BatchFeature``). Example: {"a": int64 [4]} -> 32."""
    import torch

    return sum(v.numel() * v.element_size() for v in outputs.values() if isinstance(v, torch.Tensor))
