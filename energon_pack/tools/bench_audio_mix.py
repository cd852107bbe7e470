"""``energon-pack bench --media audio``: ours and the eager design on the audio mix, per Omni family.

The mix (`audio_mix`: speech-like clips of 1-30 s in WAV, FLAC, MP3, AAC/M4A and Ogg/Opus, short
videos heard with their sound, a few images, text chats) is prepared once. For each family (every
family of ``qwen.family.OMNI_FAMILIES`` by default) its offline processor runs ours (the package's
default pixel payload, uint8; each row carries its sounds' real feature frames) and the eager design
(`bench_loader.HFProcessorPackingTaskEncoder`: the Hugging Face processor in ``encode_sample``, so
every sound's features padded to the extractor's ``n_samples`` as the processor pads them, float32
pixels, first-fit-decreasing per buffer) at the same row width, buffer size and worker count,
interleaved ``epochs`` times (`bench_loader.measure_settings`).

Per side: `bench_loader.side_figures` (samples/s and tokens/s, samples per worker CPU second,
worker peak USS and RSS, worker CPU seconds) and worker CPU seconds per sample; the ratio row
ours / eager. The floor (`audio_floor.run_audio_floor`): decoding, resampling and featurising
every heard sound of the mix with PyAV and torch alone, in this process, per sample of the mix,
and ours' worker CPU seconds per sample against it. Padding: the audio feature frames the rows carried
(what reaches the audio encoder) against the sounds' real frames, per side. And where the workers'
time went, per stage (`bench_loader.stage_split`; ours' "audio" is decoding and features at
postencode, eager's "HF processor" its whole call).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from energon_pack.qwen.family import OMNI_FAMILIES
from energon_pack.tools.audio_floor import run_audio_floor
from energon_pack.tools.audio_mix import AudioMix, audio_mix_dataset, heard_sounds
from energon_pack.tools.bench_loader import (
    LoaderBenchOptions, RunFigures, check_one_setting, measure_settings, one_setting_from_args, settings_of, side_figures,
    stage_split,
)

__all__ = [
    "AUDIO_LOADER", "AudioBenchOptions", "audio_bench_options", "audio_tables", "bench_audio_mix", "floor_figures",
    "padding_figures",
]

#: The loader settings of the audio bench, both sides: rows of 8192 tokens (a 30-s clip is 750 tokens),
#: one buffer size, 2 workers, 3 interleaved runs, and our side's pixel payload (the package default).
AUDIO_LOADER = LoaderBenchOptions(seq_length=8192, buffer_sizes=(16,), pixel_dtypes=("uint8",))


@dataclass(frozen=True, kw_only=True)
class AudioBenchOptions:
    """Knobs of ``bench --media audio``: the mix, the Omni families, the loader settings both sides
    share (one buffer size, one pixel payload of ours)."""

    mix: AudioMix = AudioMix()
    families: tuple[str, ...] = OMNI_FAMILIES
    loader: LoaderBenchOptions = AUDIO_LOADER

    def __post_init__(self) -> None:
        check_one_setting(self.loader, "the audio bench")
        unheard = [family for family in self.families if family not in OMNI_FAMILIES]
        if unheard or not self.families:
            raise ValueError(
                f"--media audio needs families that hear audio, not {', '.join(unheard) or 'none'}; "
                f"fix: --family one of {', '.join(OMNI_FAMILIES)} or all"
            )


def padding_figures(run: RunFigures, extractor: Any) -> dict[str, float]:
    """Audio padding of one side's run: sounds, their real frames, the frames its rows carried, the
    padded share of those, seconds carried per sound and the encoder input in MiB (float32 features
    of the feature ``extractor``'s ``feature_size`` mel bins, ``hop_length`` samples a frame at ``sampling_rate``).

    Example: 2 sounds, 1000 real frames, 60000 carried, 128 bins, 100 frames/s -> padding 98.3 %,
    300 s per sound, 29.3 MiB.
    """
    real, carried = run.audio.real_frames, run.audio.carried_frames
    mib = extractor.feature_size * 4 / 2**20
    frame_seconds = extractor.hop_length / extractor.sampling_rate
    return {
        "sounds": run.audio.sounds,
        "real frames": real,
        "frames carried": carried,
        "padding %": 100 * (carried - real) / carried if carried else 0.0,
        "s carried / sound": carried * frame_seconds / run.audio.sounds if run.audio.sounds else 0.0,
        "encoder input MiB": carried * mib,
    }


def floor_figures(ours_cpu_s: float, samples: int, floor_cpu_s: float) -> dict[str, float]:
    """Ours' worker CPU seconds per sample against the floor's (its CPU seconds over the same
    ``samples``). Example: (3.0, 100, 2.0) -> ours 0.03, floor 0.02 s per sample, ours / floor 1.5."""
    ours, floor = ours_cpu_s / samples, floor_cpu_s / samples
    return {"ours CPU s / sample": ours, "floor CPU s / sample": floor, "ours / floor": _ratio(ours, floor)}


def _ratio(ours: float, eager: float) -> float:
    """ours / eager, nan when eager is 0. Example: (1.0, 4.0) -> 0.25; (0.0, 0.0) -> nan."""
    return ours / eager if eager else float("nan")


def audio_tables(options: AudioBenchOptions, dataset: Path) -> list[tuple[str, list[dict[str, Any]], list[str]]]:
    """Ours and eager per family on ``dataset``: the side-by-side table (a row per side, a ratio row
    ours / eager per family), the audio padding table (real frames against frames carried) and where
    the workers' time went (stage shares per side)."""
    from energon_pack.core.stage_times import STAGES
    from energon_pack.qwen.processor import load_processor

    loader_options = replace(options.loader, dataset=dataset)
    ours, eager = settings_of(loader_options)
    figures, padding, split, floors = [], [], [], []
    sounds = heard_sounds(dataset)
    for family in options.families:
        processor = load_processor(family=family)  # type: ignore[arg-type]
        runs, _ = measure_settings([ours, eager], loader_options, dataset, processor)
        sides = {s.side: _side(runs[s]) for s in (ours, eager)}
        for side, values in sides.items():
            figures.append({"family": family, "side": side, **values})
        # nan where eager measured 0 (no worker processes with --workers 0: no worker memory).
        ratio = {name: _ratio(sides["ours"][name], sides["eager"][name]) for name in sides["ours"] if name != "samples"}
        figures.append({"family": family, "side": "ours / eager", **ratio})
        # Every stage either side timed: the named ones, then the rest ("audio", "HF processor").
        seen = {stage for done in runs.values() for run in done for stage in run.stage_seconds}
        stages = [*STAGES, *sorted(seen - set(STAGES))]
        for setting in (ours, eager):
            padding.append({"family": family, "side": setting.side, **padding_figures(runs[setting][0], processor.feature_extractor)})
            split.append({"family": family, "side": setting.side, **stage_split(runs[setting], stages)})
        floor = run_audio_floor(sounds, processor.feature_extractor)
        floors.append({"family": family, "sounds": floor.sounds,
                       **floor_figures(sides["ours"]["worker CPU s"], sides["ours"]["samples"], floor.cpu_s)})
        padding.append({
            "family": family, "side": "ours / eager",
            "frames carried": _ratio(padding[-2]["frames carried"], padding[-1]["frames carried"]),
            "encoder input MiB": _ratio(padding[-2]["encoder input MiB"], padding[-1]["encoder input MiB"]),
        })
    mix = options.mix
    codecs = "/".join(mix.formats)
    title = (
        f"audio mix: {dataset} ({mix.clips} clips of {mix.clip_seconds[0]:g}-{mix.clip_seconds[1]:g} s in {codecs}, "
        f"{mix.sound_videos} videos with sound ({mix.video_seconds[0]:g}-{mix.video_seconds[1]:g} s, "
        f"{mix.video_size[0]}x{mix.video_size[1]}), {mix.images} images ({mix.images_heard} with a clip), "
        f"{mix.text_chats} text chats; "
        f"W={loader_options.seq_length}, B={ours.buffer_size}, {loader_options.workers} workers, "
        f"{loader_options.epochs} interleaved runs; ours {ours.pixel_dtype}, eager = HF processor in encode_sample + FFD "
        "per buffer, float32)"
    )
    padding_title = (
        "audio padding: feature frames the rows carried (the audio encoder's input) against the sounds' real frames "
        "(eager: each sound padded as the family's HF processor pads it, then to the row's longest)"
    )
    split_title = "where worker time goes (median seconds over runs, summed over workers; % of the total)"
    floor_title = (
        "audio floor: every heard sound decoded (PyAV, FFmpeg's mono), resampled to 16 kHz and featurised (the "
        "extractor's torch STFT) alone, CPU s of this process per sample of the mix, against ours' worker CPU s per sample"
    )
    split_columns = list(dict.fromkeys(name for row in split for name in row))
    return [
        (title, figures, list(figures[0])), (padding_title, padding, list(padding[0])), (split_title, split, split_columns),
        (floor_title, floors, list(floors[0])),
    ]


def _side(runs: list[RunFigures]) -> dict[str, float]:
    """`side_figures` of one side's runs, its samples and worker CPU seconds per sample."""
    figures = side_figures(runs)
    samples = runs[0].samples
    return {**figures, "CPU s / sample": figures["worker CPU s"] / samples if samples else float("nan"), "samples": samples}


def bench_audio_mix(work_dir: Path, options: AudioBenchOptions) -> list[tuple[str, list[dict[str, Any]], list[str]]]:
    """The audio mix of ``options.mix`` prepared (once) under ``work_dir``, then `audio_tables`."""
    return audio_tables(options, audio_mix_dataset(work_dir, options.mix))


def audio_bench_options(args: Any) -> AudioBenchOptions:
    """The audio bench's knobs from the command line (``--family all``: every Omni family)."""
    loader = one_setting_from_args(AUDIO_LOADER, args)
    return AudioBenchOptions(
        mix=AudioMix(
            clips=args.audio_clips, sound_videos=args.sound_videos, clip_seconds=tuple(args.clip_seconds),
            formats=tuple(args.audio_formats.split(",")), images=args.images, images_heard=args.images_heard,
            text_chats=args.text_chats,
        ),
        families=OMNI_FAMILIES if args.family == "all" else (args.family,),
        loader=loader,
    )
