"""``energon-pack bench --media audio``: the audio mix (codecs, videos with sound, cache), the eager
side's audio call, the padding arithmetic, and one tiny run whose structure and ratios must hold."""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from types import SimpleNamespace

import av
import numpy as np
import pytest
import torch

from energon_pack.core.audio_inputs import AudioInputs
from energon_pack.data.synthetic import encode_audio, encode_video_with_sound, speech_like
from energon_pack.qwen.family import OMNI_FAMILIES
from energon_pack.tools.audio_mix import AUDIO_MIX_CODECS, AUDIO_MIX_FORMATS, AudioMix, audio_mix_dataset
from energon_pack.tools.bench_audio_mix import (
    AUDIO_LOADER, AudioBenchOptions, audio_bench_options, bench_audio_mix, floor_figures, padding_figures,
)
from energon_pack.tools.bench_loader import AudioCarried, RunFigures, padded_cat, row_audio_frames
from energon_pack.tools.common import omni_audio_kwargs

#: A mix small enough for a test: every kind of sample of the real one, short and small.
TINY_MIX = AudioMix(
    clips=6, clip_seconds=(0.5, 2.0), formats=tuple(AUDIO_MIX_FORMATS), sound_videos=1, video_seconds=(1.0, 2.0), video_size=(64, 48), images=2,
    image_size=(64, 48), text_chats=1,
)
#: The released Qwen2.5-Omni feature extractor's numbers (what the bench reads of it).
EXTRACTOR = SimpleNamespace(sampling_rate=16000, hop_length=160, n_samples=4_800_000, feature_size=128)


def test_speech_like_clips_have_pauses_and_the_asked_length() -> None:
    signal = speech_like(3.0, 16000, channels=2, seed=1)
    assert signal.shape == (2, 48000) and signal.dtype == np.float32
    assert np.abs(signal).max() < 1.0
    quiet = (np.abs(signal[0]) < 0.01).mean()
    assert 0.05 < quiet < 0.9  # syllables and pauses, not a tone
    assert np.allclose(signal[1], signal[0] * 0.8, atol=0.05)  # channel c at 1 - 0.2 c, plus a little noise


def test_the_mix_cycles_codecs_and_is_keyed_by_every_parameter() -> None:
    assert AudioMix(clips=7).clip_codecs() == [*AUDIO_MIX_CODECS, *AUDIO_MIX_CODECS[:2]]
    assert AudioMix(clips=3, formats=("wav_s16_44k_stereo", "ogg_opus")).clip_codecs() == ["wav_s16_44k_stereo", "ogg_opus", "wav_s16_44k_stereo"]
    assert set(AUDIO_MIX_CODECS) < set(AUDIO_MIX_FORMATS) and AUDIO_MIX_FORMATS["wav_s16_44k_stereo"] == ("wav_s16", 44100, 2)
    with pytest.raises(ValueError, match="audio formats opus: not among .*fix"):
        AudioMix(formats=("opus",))
    names = {AudioMix().folder_name, AudioMix(clips=39).folder_name, AudioMix(seed=1).folder_name}
    assert len(names) == 3 and AudioMix().folder_name.startswith("audiomix1-40clips-6videos-")
    with pytest.raises(ValueError, match=r"clip_seconds=\(0.0, 30.0\).*fix"):
        AudioMix(clip_seconds=(0.0, 30.0))
    with pytest.raises(ValueError, match="no sample; fix"):
        AudioMix(clips=0, sound_videos=0, images=0, text_chats=0)


def test_options_come_from_the_command_line_and_need_an_omni_family() -> None:
    args = argparse.Namespace(audio_clips=12, sound_videos=2, family="all", seq_length=None, buffer_sizes=[8, 64],
                              workers=1, epochs=2, prefetch_factor=1, clip_seconds=[1.0, 25.0],
                              audio_formats="wav_s16_44k_stereo,ogg_opus", images=3, images_heard=2, text_chats=5)
    options = audio_bench_options(args)
    assert options.families == OMNI_FAMILIES and options.mix == AudioMix(
        clips=12, sound_videos=2, clip_seconds=(1.0, 25.0), formats=("wav_s16_44k_stereo", "ogg_opus"), images=3,
        images_heard=2, text_chats=5,
    )
    loader = options.loader
    assert (loader.seq_length, loader.buffer_sizes, loader.workers, loader.epochs, loader.prefetch_factor) == (8192, (8,), 1, 2, 1)
    assert loader.pixel_dtypes == AUDIO_LOADER.pixel_dtypes == ("uint8",)
    with pytest.raises(ValueError, match="not qwen2.5-vl; fix: --family one of qwen2.5-omni"):
        audio_bench_options(argparse.Namespace(**{**vars(args), "family": "qwen2.5-vl"}))
    with pytest.raises(ValueError, match=r"buffer_sizes=\(16, 64\).*fix: give one of each"):
        AudioBenchOptions(loader=replace(AUDIO_LOADER, buffer_sizes=(16, 64)))


def test_audio_frames_of_a_row_ours_real_only_eager_padded() -> None:
    ours = {"audio_inputs": AudioInputs.of([np.zeros((128, 100), np.float32), np.zeros((128, 37), np.float32)])}
    mask = torch.zeros(2, 3000, dtype=torch.int32)
    mask[0, :100], mask[1, :37] = 1, 1
    eager = {"input_features": torch.zeros(2, 128, 3000), "feature_attention_mask": mask}
    assert row_audio_frames(ours) == AudioCarried(2, 137, 137)
    assert row_audio_frames(eager) == AudioCarried(2, 137, 6000)
    assert row_audio_frames({"input_ids": torch.zeros(1, 8)}) == AudioCarried()
    assert AudioCarried(1, 100, 30000) + AudioCarried(1, 37, 30000) == AudioCarried(2, 137, 60000)
    figures = padding_figures(RunFigures(audio=AudioCarried(2, 1000, 60000)), EXTRACTOR)
    assert figures["padding %"] == pytest.approx(100 * 59000 / 60000) and figures["s carried / sound"] == 300.0
    assert figures["encoder input MiB"] == pytest.approx(60000 * 128 * 4 / 2**20)
    assert padding_figures(RunFigures(), EXTRACTOR)["padding %"] == 0.0


def test_an_eager_row_pads_each_samples_features_to_the_rows_longest() -> None:
    # Qwen3-Omni pads a sample's clips to its longest, so samples of one row differ in length.
    first, second = torch.ones(2, 128, 300), torch.full((1, 128, 500), 2.0)
    row = padded_cat([first, second])
    assert row.shape == (3, 128, 500) and row[:2, :, 300:].abs().sum() == 0 and torch.equal(row[2], second[0])
    masks = padded_cat([torch.ones(2, 300, dtype=torch.int32), torch.ones(1, 500, dtype=torch.int32)])
    assert masks.dtype == torch.int32 and int(masks.sum()) == 2 * 300 + 500
    pixels = [torch.zeros(4, 1176, dtype=torch.uint8), torch.ones(2, 1176, dtype=torch.uint8)]
    assert torch.equal(padded_cat(pixels), torch.cat(pixels))


def test_the_eager_side_hears_each_sound_in_placeholder_order() -> None:
    frames = np.zeros((8, 32, 32, 3), np.uint8)
    videos = [encode_video_with_sound(frames, 4, speech_like(s, 16000, seed=i)) for i, s in enumerate((2.0, 3.0))]
    audios = [encode_audio(speech_like(1.0, 22050, seed=5), 22050, "mp3")]
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "audio"}, {"type": "video"}, {"type": "text", "text": "?"}]}]
    processor = SimpleNamespace(feature_extractor=EXTRACTOR)
    heard = omni_audio_kwargs(processor, messages, audios, videos, use_audio_in_video=True)
    assert heard["load_audio_from_video"] is True and heard["audio_from_video_indices"] == [0, None, 1]
    assert [round(w.size / 16000) for w in heard["audio"]] == [2, 1, 3]  # 16 kHz mono, slot by slot
    assert all(w.dtype == np.float32 and w.ndim == 1 for w in heard["audio"])
    alone = omni_audio_kwargs(processor, messages, audios, videos, use_audio_in_video=False)
    assert list(alone) == ["audio"] and [round(w.size / 16000) for w in alone["audio"]] == [1]


@pytest.fixture(scope="module")
def tiny_mix(tmp_path_factory):
    return tmp_path_factory.mktemp("audio_mix")


@pytest.mark.slow
def test_the_mix_holds_every_kind_of_sample_and_is_made_once(tiny_mix) -> None:
    dataset = audio_mix_dataset(tiny_mix, TINY_MIX)
    raw = dataset.parent / "raw"
    records = [json.loads(line) for line in (raw / "records.jsonl").read_text().splitlines()]
    kinds = sorted(r["id"].rstrip("0123456789") for r in records)
    # 6 clips: 5 audio chats (the fifth hears two clips), 1 video, 2 images (one with a clip), 1 text chat.
    assert kinds == ["audio"] * 5 + ["image"] * 2 + ["text"] + ["video"]
    assert sorted(len(r.get("audios", [])) for r in records if r["id"].startswith("audio")) == [1, 1, 1, 1, 2]
    assert {name.rpartition(".")[2] for r in records for name in r.get("audios", [])} == {"wav", "flac", "mp3", "m4a", "ogg"}
    video = next(r for r in records if r["id"].startswith("video"))
    assert video["use_audio_in_video"] is True
    with av.open(str(raw / video["videos"][0])) as container:
        assert container.streams.video and container.streams.audio[0].codec_context.name == "aac"
    stamp = (raw / "records.jsonl").stat().st_mtime_ns
    assert audio_mix_dataset(tiny_mix, TINY_MIX) == dataset and (raw / "records.jsonl").stat().st_mtime_ns == stamp


@pytest.mark.slow
def test_a_tiny_audio_bench_carries_real_frames_ours_and_padded_frames_eager(tiny_mix) -> None:
    from energon_pack.qwen.processor import load_processor

    loader = replace(AUDIO_LOADER, seq_length=4096, buffer_sizes=(4,), workers=1, epochs=1, prefetch_factor=1)
    options = AudioBenchOptions(mix=TINY_MIX, loader=loader)  # every Omni family
    tables = bench_audio_mix(tiny_mix, options)
    (title, rows, columns), (padding_title, padding, _), (_, split, split_columns), (floor_title, floors, _) = tables
    assert "audio floor" in floor_title and [row["family"] for row in floors] == list(OMNI_FAMILIES)
    assert "audio mix" in title and "6 clips" in title and "padded as the family's HF processor pads it" in padding_title
    sides = ("ours", "eager", "ours / eager")
    assert [(r["family"], r["side"]) for r in rows] == [(family, side) for family in OMNI_FAMILIES for side in sides]
    assert [(r["family"], r["side"]) for r in padding] == [(r["family"], r["side"]) for r in rows]
    for row in rows:
        insane = {name: row[name] for name in columns[2:] if name in row and not (math.isfinite(row[name]) and row[name] > 0)}
        assert not insane, f"{row['family']} {row['side']}: not positive and finite: {insane}"
    for index, family in enumerate(OMNI_FAMILIES):
        ours, eager, ratio = rows[3 * index : 3 * index + 3]
        assert ours["samples"] == eager["samples"] == 9  # every record, on both sides
        assert ours["worker peak RSS MiB"] >= ours["worker peak USS MiB"] and eager["worker peak RSS MiB"] >= eager["worker peak USS MiB"]
        assert ratio["samples/s"] == pytest.approx(ours["samples/s"] / eager["samples/s"])
        assert ours["CPU s / sample"] == pytest.approx(ours["worker CPU s"] / 9)
        assert ratio["CPU s / sample"] == pytest.approx(ours["CPU s / sample"] / eager["CPU s / sample"])
        # The floor decodes and featurises the same 8 sounds; ours is set against it per sample.
        floor = floors[index]
        assert floor["sounds"] == 8 and floor["ours CPU s / sample"] == pytest.approx(ours["CPU s / sample"])
        assert floor["ours / floor"] == pytest.approx(floor["ours CPU s / sample"] / floor["floor CPU s / sample"])
        assert ratio["worker peak USS MiB"] == pytest.approx(ours["worker peak USS MiB"] / eager["worker peak USS MiB"])
        pad_ours, pad_eager, pad_ratio = padding[3 * index : 3 * index + 3]
        # The same 8 sounds on both sides (7 clips heard, 1 video's track): the HF mask counts exactly
        # our real frames; ours carries nothing else, eager carries them padded.
        assert pad_ours["sounds"] == pad_eager["sounds"] == 8 and pad_ours["padding %"] == 0.0
        assert pad_ours["real frames"] == pad_eager["real frames"] == pad_ours["frames carried"] > 0
        assert pad_eager["frames carried"] > pad_ours["frames carried"]
        assert pad_ratio["frames carried"] == pytest.approx(pad_ours["frames carried"] / pad_eager["frames carried"])
        # Where the workers' time went: ours decodes and featurises sounds ("audio"), eager is one processor call.
        split_ours, split_eager = split[2 * index : 2 * index + 2]
        assert {"audio %", "HF processor %", "probe %"} <= set(split_columns) and split_ours["worker s"] > 0
        assert split_ours["audio %"] > 0 and split_ours.get("HF processor %", 0.0) == 0.0 and split_eager["HF processor %"] > 50
        assert sum(value for name, value in split_ours.items() if name.endswith("%")) == pytest.approx(100.0)
    # Qwen2.5-Omni's processor pads every sound to n_samples (300 s): 8 x 30000 frames.
    qwen25 = padding[3 * OMNI_FAMILIES.index("qwen2.5-omni") + 1]
    assert qwen25["frames carried"] == 8 * load_processor(family="qwen2.5-omni").feature_extractor.nb_max_frames
    assert qwen25["s carried / sound"] == 300.0


def test_floor_figures_set_ours_against_the_floor_per_sample() -> None:
    figures = floor_figures(3.0, 100, 2.0)
    assert figures == pytest.approx({"ours CPU s / sample": 0.03, "floor CPU s / sample": 0.02, "ours / floor": 1.5})
