"""``energon-pack bench --stage loader``: the packing loader against the eager design, on your data.

The eager design is the Hugging Face processor in ``encode_sample`` (pixels, and for Qwen-Omni
audio features padded as the processor pads them, for every buffered sample) and
first-fit-decreasing per buffer with Energon's own ``PackingDataset``
(`HFProcessorPackingTaskEncoder`), as Megatron-Bridge does. Both run on the same prepared dataset, row width and worker count; for every buffer size ours runs with each
pixel payload and eager with its float32 payload. Runs are interleaved (every setting once per
round, the order alternating) and repeated ``--epochs`` times; each run is one finite epoch.

Per setting: samples/s (median and min-max over the runs), worker peak USS (private memory:
``psutil memory_full_info().uss``, sampled every 50 ms in every worker process) and RSS, peak
buffered bytes per worker, pixel bytes per row, rows in flight per worker (being built +
``prefetch_factor`` queued), fill, and where the workers' time went (``energon_pack.core.stage_times``).

Efficiency of our settings: the decode-and-resize floor of the samples the loader emitted
(``energon_pack.tools.floor``, one pass in this process after every round of runs) divided by
the workers' active seconds (summed over workers, time waiting for the consumer excluded), in
wall and in CPU seconds; best of the runs on both sides. 1.0 means the loader costs what
decoding and resizing alone cost.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
from megatron.energon import Sample, TaskEncoder
from megatron.energon.edataclass import edataclass
from megatron.energon.task_encoder.base import stateless

from energon_pack.core.samples import QwenVLChatSample
from energon_pack.core.stage_times import STAGES
from energon_pack.tools.common import BenchRows, bench_dataset, hf_processor_outputs

__all__ = [
    "AudioCarried",
    "HFProcessorPackingTaskEncoder",
    "LoaderBenchOptions",
    "LoaderSetting",
    "WorkerMemorySampler",
    "bench_loader",
    "check_one_setting",
    "loader_bench_tables",
    "loader_options",
    "measure_settings",
    "one_setting_from_args",
    "padded_cat",
    "row_audio_frames",
    "side_figures",
    "stage_split",
]

#: Visual and (Qwen-Omni) audio fields of the processor output that the baseline buffers and packs:
#: audio features padded per clip as the processor pads them, [n, n_mels, frames], and their mask [n, frames].
PROCESSED_FIELDS = (
    "pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "input_features", "feature_attention_mask",
)


def padded_cat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """``tensors`` concatenated along dim 0, each first zero-padded along its last dim to the longest
    (a padded batch: audio features the processor padded per sample, to different lengths).

    Example: [2, 128, 300] and [1, 128, 500] -> [3, 128, 500]; [4, 1176] and [2, 1176] -> [6, 1176].
    """
    longest = max(t.shape[-1] for t in tensors)
    return torch.cat([t if t.shape[-1] == longest else torch.nn.functional.pad(t, (0, longest - t.shape[-1])) for t in tensors])


@edataclass
class ProcessedSample(Sample):
    """Baseline sample: the full HF processor output of one chat (token ids, pixel and audio tensors)."""

    input_ids: torch.Tensor
    pixel_values: Optional[torch.Tensor] = None
    image_grid_thw: Optional[torch.Tensor] = None
    pixel_values_videos: Optional[torch.Tensor] = None
    video_grid_thw: Optional[torch.Tensor] = None
    input_features: Optional[torch.Tensor] = None
    feature_attention_mask: Optional[torch.Tensor] = None

    def nbytes(self) -> int:
        """Bytes of every tensor the sample holds."""
        tensors = (self.input_ids, *(getattr(self, name) for name in PROCESSED_FIELDS))
        return sum(t.nbytes for t in tensors if t is not None)


class HFProcessorPackingTaskEncoder(TaskEncoder[QwenVLChatSample, ProcessedSample, dict, dict]):
    """The baseline: the full HF processor in ``encode_sample``, then Energon's own ``PackingDataset``.

    Every buffered sample is fully processed (pixel tensors held in the buffer); each buffer
    of ``packing_buffer_size`` samples is packed first-fit-decreasing into rows of ``seq_length``
    tokens (overlong samples dropped). Each row carries ``__stats__`` with the bytes and sample
    count of the worker's last full buffer and its seconds per stage ("HF processor", "row
    assembly"), as the packing loader's rows carry theirs.
    """

    decoder = None

    def __init__(self, processor: Any, *, seq_length: int) -> None:
        super().__init__()
        self.processor = processor
        self.seq_length = seq_length
        self._buffer_bytes = 0
        self._buffer_samples = 0
        #: This process's CPU clock at its first sample (None before): the worker's CPU seconds.
        self._cpu_start: float | None = None

    @stateless
    def encode_sample(self, sample: QwenVLChatSample) -> ProcessedSample:
        from energon_pack.core.stage_times import timed

        if self._cpu_start is None:
            self._cpu_start = time.process_time()
        with timed("HF processor"):
            outputs = hf_processor_outputs(
                self.processor, sample.conversation, sample.images, sample.videos, sample.audios or (),
                use_audio_in_video=sample.use_audio_in_video,
            )
        visual = {name: outputs.get(name) for name in PROCESSED_FIELDS}
        return ProcessedSample.derive_from(sample, input_ids=outputs["input_ids"][0], **visual)

    def select_samples_to_pack(self, samples: list[ProcessedSample]) -> list[list[ProcessedSample]]:
        from energon_pack.packing.algorithms import RowBudget, first_fit_decreasing

        self._buffer_bytes = sum(s.nbytes() for s in samples)
        self._buffer_samples = len(samples)
        fitting = [s for s in samples if s.input_ids.numel() <= self.seq_length]
        bins = first_fit_decreasing([s.input_ids.numel() for s in fitting], RowBudget(tokens=self.seq_length))
        return [[fitting[i] for i in positions] for positions in bins]

    def pack_selected_samples(self, samples: list[ProcessedSample]) -> dict:
        from energon_pack.core.stage_times import stage_seconds, timed

        with timed("row assembly"):
            row = self._assemble(samples)
        worker = torch.utils.data.get_worker_info()
        row["__stats__"] = {
            "buffered_bytes": self._buffer_bytes,
            "buffered_samples": self._buffer_samples,
            "worker_id": 0 if worker is None else worker.id,
            "stage_seconds": stage_seconds(),
            # CPU only: the worker's wall clock also runs while it waits for the consumer.
            "worker_seconds": {"cpu": time.process_time() - (self._cpu_start or time.process_time())},
        }
        return row

    def _assemble(self, samples: list[ProcessedSample]) -> dict:
        lengths = torch.tensor([0] + [s.input_ids.numel() for s in samples])
        input_ids = torch.full((1, self.seq_length), int(self.processor.tokenizer.pad_token_id), dtype=torch.int64)
        tokens = torch.cat([s.input_ids for s in samples])
        input_ids[0, : tokens.numel()] = tokens
        row: dict[str, Any] = {
            "input_ids": input_ids,
            "cu_seqlens_q": torch.cumsum(lengths, 0).to(torch.int32),
            "__keys__": [s.__key__ for s in samples],
            "__restore_key__": (),
        }
        for name in PROCESSED_FIELDS:
            present = [getattr(s, name) for s in samples if getattr(s, name) is not None]
            row[name] = padded_cat(present) if present else None
        return row

    @stateless
    def batch(self, rows: list[dict]) -> dict:
        return rows[0]


#: Stage of the eager design's worker: the whole Hugging Face processor call.
HF_PROCESSOR_STAGE = "HF processor"


@dataclass(frozen=True, kw_only=True)
class LoaderBenchOptions:
    """Knobs of the loader benchmark (``energon-pack bench --stage loader ...``)."""

    dataset: Path | None = None
    samples: int = 48
    seq_length: int = 8192
    buffer_sizes: tuple[int, ...] = (16, 64, 256)
    workers: int = 2
    pixel_dtypes: tuple[str, ...] = ("float32", "uint8")
    epochs: int = 3
    prefetch_factor: int = 2
    #: Ours' ``decode_threads`` settings, each a setting of its own (None: the default, chosen per machine).
    decode_threads: tuple[int | None, ...] = (None,)


@dataclass(frozen=True, kw_only=True)
class LoaderSetting:
    """One column of the comparison: ``side`` "ours" or "eager", payload dtype, buffer size, and
    ours' ``decode_threads`` (None: the default)."""

    side: str
    pixel_dtype: str
    buffer_size: int
    decode_threads: int | None = None

    @property
    def label(self) -> str:
        """Example: ``LoaderSetting(side="ours", pixel_dtype="uint8", buffer_size=64).label`` -> "ours uint8 B64";
        with ``decode_threads=1`` -> "ours uint8 B64 T1"."""
        threads = "" if self.decode_threads is None else f" T{self.decode_threads}"
        return f"{self.side} {self.pixel_dtype} B{self.buffer_size}{threads}"


def check_one_setting(options: LoaderBenchOptions, bench: str) -> None:
    """ValueError unless ``options`` give one buffer size and one pixel payload (one setting per side)."""
    if len(options.buffer_sizes) != 1 or len(options.pixel_dtypes) != 1:
        raise ValueError(
            f"{bench} compares ours and eager at one setting, not buffer_sizes={options.buffer_sizes} "
            f"and pixel_dtypes={options.pixel_dtypes}; fix: give one of each"
        )


def one_setting_from_args(base: LoaderBenchOptions, args: Any) -> LoaderBenchOptions:
    """``base`` with the command line's row width (``--seq-length``; None keeps base's), first buffer
    size, workers, epochs and prefetch factor: the one setting of the realistic and audio benches."""
    import dataclasses

    return dataclasses.replace(
        base,
        seq_length=args.seq_length if args.seq_length is not None else base.seq_length,
        buffer_sizes=(args.buffer_sizes[0],),
        workers=args.workers,
        epochs=args.epochs,
        prefetch_factor=args.prefetch_factor,
    )


def settings_of(options: LoaderBenchOptions) -> list[LoaderSetting]:
    """Every setting of a benchmark: per buffer size, ours with each payload dtype and decoder thread
    setting, then eager (float32).

    Example: buffers (16,), dtypes ("uint8",) -> [ours uint8 B16, eager float32 B16]; decode threads
    (None, 1) -> [ours uint8 B16, ours uint8 B16 T1, eager float32 B16].
    """
    out = []
    for buffer_size in options.buffer_sizes:
        out += [
            LoaderSetting(side="ours", pixel_dtype=dtype, buffer_size=buffer_size, decode_threads=threads)
            for dtype in options.pixel_dtypes for threads in options.decode_threads
        ]
        out.append(LoaderSetting(side="eager", pixel_dtype="float32", buffer_size=buffer_size))
    return out


def interleaved(settings: Sequence[LoaderSetting], epochs: int) -> Iterator[tuple[int, LoaderSetting]]:
    """(epoch, setting) in run order: every setting once per epoch, reversed every other epoch.

    Example: settings a, b and 2 epochs -> (0, a), (0, b), (1, b), (1, a).
    """
    for epoch in range(epochs):
        for setting in settings if epoch % 2 == 0 else reversed(settings):
            yield epoch, setting


class WorkerMemorySampler(threading.Thread):
    """Samples USS and RSS of this process's new child processes (the loader's workers) every
    ``interval`` seconds until stopped; keeps the peak of each over all children."""

    def __init__(self, interval: float = 0.05) -> None:
        import psutil

        super().__init__(daemon=True)
        self.interval = interval
        self._parent = psutil.Process()
        self._existing = {child.pid for child in self._parent.children(recursive=True)}
        self._stop_event = threading.Event()
        self.peak_uss = 0
        self.peak_rss = 0

    def sample(self) -> None:
        """One reading of every worker's USS and RSS."""
        import psutil

        for child in self._parent.children(recursive=True):
            if child.pid in self._existing:
                continue
            try:
                info = child.memory_full_info()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            self.peak_uss = max(self.peak_uss, info.uss)
            self.peak_rss = max(self.peak_rss, info.rss)

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            self.sample()

    def stop(self) -> None:
        """Stop sampling (after one last reading)."""
        self.sample()
        self._stop_event.set()
        self.join()


@dataclass(frozen=True)
class AudioCarried:
    """Sounds in rows, their real feature frames and the frames the rows carry (padding included);
    sums with ``+``. Example: ``AudioCarried(1, 100, 30000) + AudioCarried(1, 37, 30000)`` ->
    ``AudioCarried(2, 137, 60000)``."""

    sounds: int = 0
    real_frames: int = 0
    carried_frames: int = 0

    def __add__(self, other: "AudioCarried") -> "AudioCarried":
        return AudioCarried(
            self.sounds + other.sounds, self.real_frames + other.real_frames, self.carried_frames + other.carried_frames
        )


@dataclass
class RunFigures:
    """What one finite epoch of one setting measured."""

    #: What the rows carried: samples and their keys, rows, real tokens, pixel payload bytes, sounds.
    samples: int = 0
    keys: set[str] = field(default_factory=set)
    rows: int = 0
    real_tokens: int = 0
    pixel_bytes: int = 0
    audio: AudioCarried = AudioCarried()
    #: Wall seconds of the epoch in the trainer process.
    seconds: float = 0.0
    #: Per worker id, the telemetry its last row carried (``runtime.stats.worker_telemetry``: running totals).
    last_telemetry: dict[int, Mapping[str, Any]] = field(default_factory=dict)
    #: Peak memory in bytes: USS and RSS of the loader's processes, packing-buffer bytes.
    peak_uss: int = 0
    peak_rss: int = 0
    peak_buffered: int = 0

    @property
    def stage_seconds(self) -> dict[str, float]:
        """Seconds per stage, summed over workers (``stage_times.stage_seconds``)."""
        return self._summed("stage_seconds")

    @property
    def worker_seconds(self) -> dict[str, float]:
        """Active wall and CPU seconds of the workers, summed (``stage_times.worker_seconds``)."""
        return self._summed("worker_seconds")

    def _summed(self, key: str) -> dict[str, float]:
        """Per name, the sum over workers of their last ``telemetry[key][name]``.

        Example: workers' last ``{"decode": 2.0}`` and ``{"decode": 1.0, "pack": 0.5}`` -> ``{"decode": 3.0, "pack": 0.5}``.
        """
        summed: dict[str, float] = {}
        for telemetry in self.last_telemetry.values():
            for name, value in telemetry.get(key, {}).items():
                summed[name] = summed.get(name, 0.0) + value
        return summed


def row_pixel_bytes(row: dict[str, Any]) -> int:
    """Bytes of a row's pixel tensors, ours (``visual_inputs``) or eager (top-level fields).

    Example: a row whose pixel_values is uint8 [10, 1176] and no video -> 11760.
    """
    source = row.get("visual_inputs")
    tensors = (
        [getattr(source, name) for name in ("pixel_values", "pixel_values_videos")]
        if source is not None
        else [row.get(name) for name in ("pixel_values", "pixel_values_videos")]
    )
    return sum(t.nbytes for t in tensors if t is not None)


def row_audio_frames(row: dict[str, Any]) -> AudioCarried:
    """The sounds of a row's audio features, ours (``audio_inputs``: real frames only) or eager
    (``input_features`` [n, n_mels, T] padded, ``feature_attention_mask`` [n, T]).

    Example: an eager row of two clips of 100 and 37 frames padded to 30000 -> ``AudioCarried(2, 137, 60000)``.
    """
    audio = row.get("audio_inputs")
    if audio is not None:
        return AudioCarried(int(audio.audio_feature_lengths.numel()), audio.frames, audio.frames)
    features, mask = row.get("input_features"), row.get("feature_attention_mask")
    if features is None:
        return AudioCarried()
    return AudioCarried(int(features.shape[0]), int(mask.sum()), int(features.shape[0] * features.shape[-1]))


def measure_run(make_loader: Callable[[], Any], desc: str, *, sample_memory: bool = True) -> RunFigures:
    """Iterate a fresh loader to the end of its epoch while sampling its workers' memory (unless
    ``sample_memory`` is False: in-process loading has no workers, and the sampler's scans of the
    process table would run on the loader's own cores and in its CPU seconds)."""
    from tqdm import tqdm

    from energon_pack.core import stage_times

    stage_times.reset()  # in-process loading (--workers 0): this run's seconds only

    figures = RunFigures()
    sampler = WorkerMemorySampler()
    if sample_memory:
        sampler.start()
    start = time.perf_counter()
    try:
        for row in tqdm(make_loader(), desc=desc, unit="row", leave=False):
            figures.rows += 1
            if sample_memory and figures.rows == 1:
                sampler.sample()  # the workers are up now: a reading even if the epoch ends within one interval
            figures.samples += len(row["__keys__"])
            figures.keys.update(row["__keys__"])
            figures.real_tokens += int(row["cu_seqlens_q"][-1])
            figures.pixel_bytes += row_pixel_bytes(row)
            figures.audio += row_audio_frames(row)
            telemetry = row["__stats__"]
            figures.peak_buffered = max(figures.peak_buffered, telemetry.get("buffered_bytes", 0))
            figures.last_telemetry[telemetry.get("worker_id", 0)] = telemetry
    finally:
        figures.seconds = time.perf_counter() - start
        if sample_memory:
            sampler.stop()
    figures.peak_uss, figures.peak_rss = sampler.peak_uss, sampler.peak_rss
    return figures


def _loader_factory(setting: LoaderSetting, dataset: Path, processor: Any, options: LoaderBenchOptions) -> Callable[[], Any]:
    from megatron.energon import SavableDataLoader, WorkerConfig, get_train_dataset

    from energon_pack.config import PackingConfig
    from energon_pack.loader import get_packing_loader
    from energon_pack.runtime.pinning import pin_only_with_accelerator

    config = PackingConfig(
        seq_length=options.seq_length,
        buffer_size=setting.buffer_size,
        num_workers=options.workers,
        repeat=False,
        pixel_dtype=setting.pixel_dtype,
        prefetch_factor=options.prefetch_factor,
        decode_threads=setting.decode_threads,
    )
    # No watchdog on either side: a row of long or 4K clips on a busy machine can take longer than its
    # 60 s, and its stack dumps (on stdout) would bury the tables.
    no_watchdog = {"watchdog_timeout_seconds": None}
    if setting.side == "ours":
        return lambda: get_packing_loader(dataset, config, processor, **no_watchdog)

    def eager() -> Any:
        eager_dataset = get_train_dataset(
            dataset,
            worker_config=WorkerConfig(rank=0, world_size=1, num_workers=options.workers, seed_offset=config.seed),
            batch_size=1,
            packing_buffer_size=setting.buffer_size,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
            task_encoder=HFProcessorPackingTaskEncoder(processor, seq_length=options.seq_length),
            repeat=False,
        )
        return pin_only_with_accelerator(
            SavableDataLoader(eager_dataset, prefetch_factor=options.prefetch_factor, **no_watchdog)
        )

    return eager


def _spread(values: Sequence[float]) -> str:
    return f"{min(values):.3g}-{max(values):.3g}"


def measure_settings(
    settings: Sequence[LoaderSetting], options: LoaderBenchOptions, dataset: Path, processor: Any
) -> tuple[dict[LoaderSetting, list[RunFigures]], list[tuple[Any, Any]]]:
    """Run every setting ``options.epochs`` times, interleaved; (runs per setting, floor passes as
    (media, seconds)). With ``workers=0`` the runs use one torch thread (as a loader worker and the floor do)."""
    runs: dict[LoaderSetting, list[RunFigures]] = {setting: [] for setting in settings}
    passes: list[tuple[Any, Any]] = []
    threads = torch.get_num_threads()
    if options.workers == 0:
        # One loader process, as a DataLoader worker runs it (torch sets 1 thread there) and as the
        # floor runs: several torch threads only contend for the cores (2-3x slower resizes on 2 cores).
        torch.set_num_threads(1)
    try:
        _run_interleaved(options, dataset, processor, runs, passes)
    finally:
        torch.set_num_threads(threads)
    return runs, passes


def side_figures(runs: Sequence[RunFigures]) -> dict[str, float]:
    """One side's figures over its runs: samples/s and tokens/s (median, wall), samples per worker CPU
    second and worker CPU seconds (best run), worker peak USS and RSS in MiB (max over runs).

    Example: runs of 10 samples in 2 s and 4 s with 2 and 3 worker CPU s -> samples/s 3.75, samples/worker CPU s 5.0.
    """
    cpu = min(run.worker_seconds.get("cpu", float("inf")) for run in runs)
    mib = float(2**20)
    return {
        "samples/s": statistics.median(run.samples / run.seconds for run in runs),
        "tokens/s": statistics.median(run.real_tokens / run.seconds for run in runs),
        # Per CPU second of the workers: what samples/s would be on cores of its own (a shared machine's
        # other jobs slow the wall clock, not this).
        "samples/worker CPU s": runs[0].samples / cpu,
        "worker peak USS MiB": max(run.peak_uss for run in runs) / mib,
        "worker peak RSS MiB": max(run.peak_rss for run in runs) / mib,
        "worker CPU s": cpu,
    }


def stage_split(runs: Sequence[RunFigures], stages: Sequence[str]) -> dict[str, float]:
    """Where one side's worker time went: "worker s", the sum over ``stages`` of each stage's median
    seconds over ``runs`` (summed over workers), then each stage's share of it in percent.

    Example: runs with {"decode": 3.0, "probe": 1.0} and {"decode": 5.0, "probe": 1.0}, stages
    ("probe", "decode") -> {"worker s": 5.0, "probe %": 20.0, "decode %": 80.0}.
    """
    seconds = {stage: statistics.median(run.stage_seconds.get(stage, 0.0) for run in runs) for stage in stages}
    total = sum(seconds.values()) or 1.0
    return {"worker s": total, **{f"{stage} %": 100 * value / total for stage, value in seconds.items()}}


def loader_bench_tables(
    options: LoaderBenchOptions, dataset: Path, processor: Any = None
) -> list[tuple[str, list[dict[str, Any]], list[str]]]:
    """Run every setting ``options.epochs`` times, interleaved (`measure_settings`) with ``processor``
    (None: ``load_processor()``); returns (title, rows, columns) tables: the side-by-side figures, the
    split of worker time by stage and ours' efficiency against the floor."""
    from energon_pack.qwen.processor import load_processor

    settings = settings_of(options)
    runs, passes = measure_settings(settings, options, dataset, processor if processor is not None else load_processor())
    media = passes[0][0] if passes else None

    def rate(setting: LoaderSetting) -> float:
        return statistics.median(run.samples / run.seconds for run in runs[setting])

    def peak(setting: LoaderSetting, name: str) -> int:
        return max(getattr(run, name) for run in runs[setting])

    eager_of = {s.buffer_size: s for s in settings if s.side == "eager"}
    smallest_eager = eager_of[min(eager_of)]
    mib = float(2**20)
    figures, stages = [], []
    for setting in settings:
        first = runs[setting][0]
        eager = eager_of[setting.buffer_size]
        figures.append({
            "setting": setting.label,
            "samples/s median": rate(setting),
            "samples/s min-max": _spread([run.samples / run.seconds for run in runs[setting]]),
            "vs eager same B": rate(setting) / rate(eager),
            "worker peak USS MiB": peak(setting, "peak_uss") / mib,
            # No worker processes (--workers 0): no worker memory to compare.
            "USS vs eager B{}".format(smallest_eager.buffer_size): peak(setting, "peak_uss") / (peak(smallest_eager, "peak_uss") or 1),
            "worker peak RSS MiB": peak(setting, "peak_rss") / mib,
            "peak buffered MiB/worker": peak(setting, "peak_buffered") / mib,
            "pixel MiB/row": first.pixel_bytes / first.rows / mib if first.rows else 0.0,
            "rows in flight/worker": options.prefetch_factor + 1,
            "fill": first.real_tokens / (first.rows * options.seq_length) if first.rows else 0.0,
            "rows": first.rows,
            "samples": first.samples,
        })
        stages.append({"setting": setting.label, **stage_split(runs[setting], (*STAGES, HF_PROCESSOR_STAGE))})
    from energon_pack.config import LoaderOptions

    auto_threads = LoaderOptions(num_workers=options.workers).resolved_decode_threads()
    title = (
        f"loader: {dataset} (W={options.seq_length}, {options.workers} workers, prefetch_factor "
        f"{options.prefetch_factor}, {options.epochs} interleaved runs per setting; ours' decode_threads: the "
        f"default ({auto_threads} here) unless Tn; eager = HF processor in encode_sample + FFD per buffer)"
    )
    stage_title = "where worker time goes (median seconds over runs, summed over workers; % of the total)"
    tables = [(title, figures, list(figures[0])), (stage_title, stages, list(stages[0]))]
    efficiency = efficiency_rows(runs, [seconds for _, seconds in passes])
    if efficiency:
        assert media is not None
        efficiency_title = (
            f"efficiency: decode+resize floor of the {len(media.images)} images and {len(media.videos)} videos "
            "emitted (PIL bicubic, one process) / workers' active seconds; best of the runs (floor: PIL's resize "
            "is slower than torch's on AVX2/AVX512 CPUs, so the floor is not a strict lower bound)"
        )
        tables.append((efficiency_title, efficiency, list(efficiency[0])))
    return tables


def _run_interleaved(
    options: LoaderBenchOptions, dataset: Path, processor: Any, runs: dict[LoaderSetting, list[RunFigures]],
    floors: list[tuple[Any, Any]],
) -> None:
    """Every setting ``options.epochs`` times (``interleaved``) into ``runs``; after each round of runs,
    one floor pass over the samples ours emitted, appended to ``floors`` as (media, seconds)."""
    from energon_pack.tools.floor import floor_media, run_floor

    media = None
    for epoch, setting in interleaved(list(runs), options.epochs):
        factory = _loader_factory(setting, dataset, processor, options)
        desc = f"{setting.label}, run {epoch + 1}/{options.epochs}"
        runs[setting].append(measure_run(factory, desc, sample_memory=options.workers > 0))
        if all(len(done) == epoch + 1 for done in runs.values()):  # a round of runs is over: one floor pass
            if media is None:
                emitted = set().union(*(run.keys for s, done in runs.items() if s.side == "ours" for run in done))
                media = floor_media(dataset, emitted, processor)
            floors.append((media, run_floor(media)))


def efficiency_rows(runs: dict[LoaderSetting, list[RunFigures]], floors: Sequence[Any]) -> list[dict[str, Any]]:
    """One row per setting of ours: best floor and best worker active seconds, wall and CPU, and
    their ratios (floor / loader). Example: floor 1.0 s, workers 1.25 s -> efficiency 0.8."""
    out = []
    for setting, done in runs.items():
        active = [run.worker_seconds for run in done if run.worker_seconds]
        if setting.side != "ours" or not active or not floors:
            continue
        row: dict[str, Any] = {"setting": setting.label}
        for clock in ("wall", "cpu"):
            floor, loader = min(getattr(f, clock) for f in floors), min(a[clock] for a in active)
            row |= {f"floor {clock} s": floor, f"workers {clock} s": loader, f"efficiency {clock}": floor / loader}
        out.append(row)
    return out


def bench_loader(num_samples: int, work_dir: Path, options: LoaderBenchOptions | None = None) -> list[tuple[str, BenchRows, list[str]]]:
    """The packing loader vs the eager design on ``options.dataset``, or on the bench mix of
    ``num_samples`` samples prepared (once) under ``work_dir``; (title, rows, columns) tables."""
    import dataclasses

    options = dataclasses.replace(options or LoaderBenchOptions(), samples=num_samples)
    dataset = options.dataset if options.dataset is not None else bench_dataset(work_dir, num_samples)
    return loader_bench_tables(options, dataset)


def loader_options(args: Any) -> LoaderBenchOptions:
    """The loader benchmark's knobs from the command line (defaults where ``args`` lacks one)."""
    defaults = LoaderBenchOptions()
    return LoaderBenchOptions(
        dataset=getattr(args, "dataset", None),
        samples=args.samples,
        seq_length=getattr(args, "seq_length", defaults.seq_length),
        buffer_sizes=tuple(getattr(args, "buffer_sizes", defaults.buffer_sizes)),
        workers=getattr(args, "workers", defaults.workers),
        pixel_dtypes=tuple(getattr(args, "pixel_dtype", defaults.pixel_dtypes)),
        epochs=getattr(args, "epochs", defaults.epochs),
        prefetch_factor=getattr(args, "prefetch_factor", defaults.prefetch_factor),
        decode_threads=tuple(getattr(args, "decode_threads", defaults.decode_threads)),
    )
