"""Per-worker packing statistics: counters kept in savable state and aggregated in the main process.

Each worker's packing stage owns one ``PackingStats`` (part of its saved state, so counters
survive an exact resume) and attaches a snapshot to every row it emits (``row["__stats__"]``).
The loader keeps the latest snapshot per worker; ``aggregate_stats`` sums them.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from megatron.energon.savable import Savable

FILL_BINS = 20  # fill histogram buckets of width 1/FILL_BINS
#: Bucket edges of the fill histogram: bucket i counts rows with fill in [edges[i], edges[i+1])
#: (the last bucket includes 1.0). ``[0.0, 0.05, ..., 1.0]``.
FILL_HISTOGRAM_EDGES: tuple[float, ...] = tuple(round(i / FILL_BINS, 6) for i in range(FILL_BINS + 1))
#: ``kind`` of the per-row counters of :func:`row_counts` (a worker snapshot has no ``kind``).
ROW_COUNTS = "row_counts"
#: A worker writes its statistics file at most this often (seconds), plus when it starts and
#: when its stream ends; every row carries a fresh snapshot anyway.
STATS_PUBLISH_INTERVAL_S = 2.0


#: Counters kept per blend entry (``PackingStats.sources``).
SOURCE_COUNTERS: tuple[str, ...] = ("samples", "real_tokens", "supervised_tokens", "skipped")


@dataclass
class PackingStats(Savable):
    """Counters of one worker's packing stage. Token counts are real tokens; slots are physical."""

    worker_id: int = 0
    samples_in: int = 0
    samples_packed: int = 0
    rows: int = 0
    real_tokens: int = 0
    row_slots: int = 0
    rounds: int = 0
    #: Rows (and their real tokens) emitted by the end-of-stream flush of a finite epoch.
    flush_rows: int = 0
    flush_real_tokens: int = 0
    max_wait_rounds_seen: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    fill_histogram: list[int] = field(default_factory=lambda: [0] * FILL_BINS)
    #: Samples shrunk to fit a row (``on_overlong="shrink"``), and their token counts before and after.
    shrunk: int = 0
    shrunk_tokens_before: int = 0
    shrunk_tokens_after: int = 0
    #: Per row-cost key (``PackedRow.row_cost``): its sum and its largest value over the rows.
    row_cost_sum: dict[str, int] = field(default_factory=dict)
    row_cost_max: dict[str, int] = field(default_factory=dict)
    #: Sample reads retried after a transient storage error (``core.storage_retries``).
    storage_retries: int = 0
    #: Per blend entry (its index as a string; empty outside a metadataset blend): samples packed,
    #: their real and supervised tokens, and samples skipped (``SOURCE_COUNTERS``).
    sources: dict[str, dict[str, int]] = field(default_factory=dict)

    def count_skip(self, reason: str, *, source: int | None = None) -> None:
        """Count one skipped sample under ``reason`` (a short snake_case key), and for its blend
        entry ``source`` when it came from a blend."""
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        if source is not None:
            self._source(source)["skipped"] += 1

    def count_source_sample(self, source: int | None, *, real_tokens: int, supervised_tokens: int) -> None:
        """Count one packed sample of blend entry ``source`` (nothing outside a blend)."""
        if source is None:
            return
        counters = self._source(source)
        counters["samples"] += 1
        counters["real_tokens"] += real_tokens
        counters["supervised_tokens"] += supervised_tokens

    def _source(self, source: int) -> dict[str, int]:
        return self.sources.setdefault(str(source), dict.fromkeys(SOURCE_COUNTERS, 0))

    def count_shrunk(self, tokens_before: int, tokens_after: int) -> None:
        """Count one sample shrunk from ``tokens_before`` to ``tokens_after`` tokens."""
        self.shrunk += 1
        self.shrunk_tokens_before += tokens_before
        self.shrunk_tokens_after += tokens_after

    def count_row(
        self,
        real_tokens: int,
        width: int,
        num_samples: int,
        *,
        flush: bool = False,
        cost: Mapping[str, int] | None = None,
    ) -> None:
        """Count one emitted row of ``width`` slots holding ``real_tokens`` tokens of ``num_samples``
        samples, and its ``cost`` (``PackedRow.row_cost``) when given."""
        for key, value in (cost or {}).items():
            self.row_cost_sum[key] = self.row_cost_sum.get(key, 0) + value
            self.row_cost_max[key] = max(self.row_cost_max.get(key, 0), value)
        if flush:
            self.flush_rows += 1
            self.flush_real_tokens += real_tokens
        self.rows += 1
        self.samples_packed += num_samples
        self.real_tokens += real_tokens
        self.row_slots += width
        bucket = min(FILL_BINS - 1, int(real_tokens / width * FILL_BINS))
        self.fill_histogram[bucket] += 1

    def add_row_counts(self, counts: Mapping[str, Any]) -> None:
        """Add what one batch of samples contributed (:func:`row_counts`): reads, skips and its row."""
        self.samples_in += counts["samples_in"]
        self.storage_retries += counts.get("storage_retries", 0)
        for reason, count in counts["skipped"].items():
            self.skipped[reason] = self.skipped.get(reason, 0) + count
        for before, after in counts["shrunk"]:
            self.count_shrunk(before, after)
        cost = counts["cost"]
        if cost is not None:
            self.count_row(cost["real_tokens"], counts["width"], cost["segments"], cost=cost)

    def snapshot(self) -> dict[str, Any]:
        """A plain-dict copy (picklable, safe to attach to a row), less ``sources`` outside a blend."""
        snapshot = asdict(self)
        if not snapshot["sources"]:
            del snapshot["sources"]
        return snapshot

    def save_state(self) -> dict[str, Any]:
        """The snapshot, less ``storage_retries`` while it is 0: a state of a run without retries (and
        without a blend) is byte-identical to one saved before the counters existed (golden state digests)."""
        state = self.snapshot()
        if not state["storage_retries"]:
            del state["storage_retries"]
        return state

    def restore_state(self, state: Mapping[str, Any] | None) -> None:
        fresh = asdict(PackingStats(worker_id=self.worker_id))
        # A copy (counting on must not change the state object: it may be restored again); a
        # counter the state lacks (saved before it existed, or 0) starts at its default.
        for name, value in (fresh if state is None else {**fresh, **copy.deepcopy(dict(state))}).items():
            setattr(self, name, value)


def row_counts(
    *,
    samples_in: int,
    skipped: Mapping[str, int],
    width: int = 0,
    cost: Mapping[str, int] | None = None,
    shrunk: Iterable[tuple[int, int]] = (),
    storage_retries: int = 0,
) -> dict[str, Any]:
    """Counters one batch of samples contributes: reads, skips by reason, shrunk samples
    ``(tokens before, after)``, sample reads retried after a transient storage error and its row
    (``width`` slots, ``cost`` = ``PackedRow.row_cost``; no row when ``cost`` is None).

    Rows built from a fixed set of samples (in-batch rows, plan rows) carry these instead of a
    worker snapshot; the loader sums them in the main process, exactly at the consumer's position.
    Example: 4 samples, 1 corrupt image, a row of 1024 slots costing ``{"real_tokens": 900,
    "segments": 3, ...}`` -> ``{"kind": "row_counts", "samples_in": 4, "skipped": {"corrupt_image": 1},
    "width": 1024, "cost": {...}, "shrunk": [], "storage_retries": 0}``.
    """
    return {
        "kind": ROW_COUNTS,
        "samples_in": samples_in,
        "skipped": dict(skipped),
        "width": width,
        "cost": None if cost is None else dict(cost),
        "shrunk": [list(pair) for pair in shrunk],
        "storage_retries": storage_retries,
    }


def fill(real_tokens: int, row_slots: int) -> float:
    """Fraction of row slots holding real tokens. Example: (7900, 8192) -> 0.9644."""
    return real_tokens / row_slots if row_slots else 0.0


def aggregate_stats(snapshots: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Sum per-worker snapshots into one report dict (adds ``fill``, ``fill_before_flush`` (None
    when every row came from the end-of-epoch flush), ``fill_histogram_edges`` (FILL_BINS + 1
    edges of ``fill_histogram``), ``skipped_total`` and, per row-cost key, ``row_cost_mean``
    (per row) and ``row_cost_max`` (over every worker's rows)).

    Example: two workers with rows 3 and 4 -> ``{"rows": 7, ...}``.
    """
    total: dict[str, Any] = {"workers": 0, "skipped": Counter(), "fill_histogram": [0] * FILL_BINS}
    summed = (
        "samples_in", "samples_packed", "rows", "real_tokens", "row_slots", "rounds", "flush_rows", "flush_real_tokens",
        "shrunk", "shrunk_tokens_before", "shrunk_tokens_after", "storage_retries",
    )
    for name in summed:
        total[name] = 0
    total["max_wait_rounds_seen"] = 0
    cost_sum: Counter[str] = Counter()
    cost_max: dict[str, int] = {}
    per_source = []
    for snap in snapshots:
        total["workers"] += 1
        per_source.append(snap.get("sources", {}))
        for name in summed:
            total[name] += snap.get(name, 0)
        total["max_wait_rounds_seen"] = max(total["max_wait_rounds_seen"], snap["max_wait_rounds_seen"])
        total["skipped"].update(snap["skipped"])
        total["fill_histogram"] = [a + b for a, b in zip(total["fill_histogram"], snap["fill_histogram"])]
        cost_sum.update(snap.get("row_cost_sum", {}))
        for key, value in snap.get("row_cost_max", {}).items():
            cost_max[key] = max(cost_max.get(key, 0), value)
    total["sources"] = sum_sources(per_source)
    total["row_cost_mean"] = {key: value / total["rows"] for key, value in cost_sum.items()} if total["rows"] else {}
    total["row_cost_max"] = cost_max
    total["skipped"] = dict(sorted(total["skipped"].items()))
    total["skipped_total"] = sum(total["skipped"].values())
    total["fill"] = fill(total["real_tokens"], total["row_slots"])
    total["fill_histogram_edges"] = list(FILL_HISTOGRAM_EDGES)
    # Fill of the rows selected while the stream was running (the end-of-epoch flush excluded);
    # None (not applicable) when every row came from the flush.
    steady_rows = total["rows"] - total["flush_rows"]
    width = total["row_slots"] // total["rows"] if total["rows"] else 0
    total["fill_before_flush"] = (
        fill(total["real_tokens"] - total["flush_real_tokens"], steady_rows * width) if steady_rows else None
    )
    return total


def sum_sources(per_worker: Iterable[Mapping[str, Mapping[str, int]]]) -> dict[int, dict[str, int]]:
    """Per blend entry, the sum of the workers' per-source counters (empty outside a blend).

    Example: ``[{"0": {"samples": 2, ...}}, {"0": {"samples": 3, ...}, "1": {...}}]`` -> ``{0: {"samples": 5, ...}, 1: {...}}``.
    """
    total: dict[int, dict[str, int]] = {}
    for sources in per_worker:
        for source, counters in sources.items():
            summed = total.setdefault(int(source), dict.fromkeys(SOURCE_COUNTERS, 0))
            for name in SOURCE_COUNTERS:
                summed[name] += counters.get(name, 0)
    return dict(sorted(total.items()))


def peak_rss_bytes(pid: int | None = None) -> int:
    """Peak resident set size in bytes of process ``pid`` (default: this one).

    Linux ``VmHWM`` from ``/proc/<pid>/status``; current RSS (psutil) elsewhere. Raises
    ``psutil.NoSuchProcess`` when the process is gone.
    """
    try:
        with open(f"/proc/{'self' if pid is None else pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import psutil

    return int(psutil.Process(pid).memory_info().rss)


def worker_telemetry(
    buffered_bytes: Iterable[int], *, pending_samples: int, reads: Mapping[str, int] | None = None
) -> dict[str, int]:
    """Measurements attached to a row (not part of the saved state): peak RSS, buffer contents,
    samples this process read again by restore key (``reads``: ``restore_reads`` when a restored
    worker started, ``parked_reads`` when a parked sample's row came) and this process's seconds
    per pipeline stage and its active wall / CPU seconds (``energon_pack.core.stage_times``).

    Example: buffers holding samples of 100 and 300 bytes, one of them pending ->
    ``{"peak_rss_bytes": ..., "buffered_samples": 2, "buffered_bytes": 400, "pending_samples": 1,
    "restore_reads": 0, "parked_reads": 0, ...}``.
    """
    reads = reads or {}
    from energon_pack.core.stage_times import stage_seconds, worker_seconds

    sizes = list(buffered_bytes)
    return {
        "peak_rss_bytes": peak_rss_bytes(),
        "buffered_samples": len(sizes),
        "buffered_bytes": sum(sizes),
        "pending_samples": pending_samples,
        "restore_reads": reads.get("restore", 0),
        "parked_reads": reads.get("parked", 0),
        "stage_seconds": stage_seconds(),
        "worker_seconds": worker_seconds(),
    }


def publish_snapshot(directory: str, snapshot: Mapping[str, Any]) -> None:
    """Atomically write a worker's snapshot to ``directory/worker-<id>.json`` for the main process.

    Rows carry snapshots too, but a skip after a worker's last row (or a worker whose samples
    are all bad) would never reach the main process that way. Nothing is written once the
    directory is gone: its loader was dropped while a row stream was still open (a stream
    closed by garbage collection publishes last), so nobody can read the snapshot any more.
    """
    import json
    import os

    if not os.path.isdir(directory):
        return
    path = os.path.join(directory, f"worker-{snapshot['worker_id']}.json")
    partial = f"{path}.{os.getpid()}.tmp"
    with open(partial, "w", encoding="utf-8") as out:
        json.dump(snapshot, out)
    os.replace(partial, path)


def progress(snapshot: Mapping[str, Any]) -> tuple[int, int, int]:
    """How far a worker's snapshot is: (samples in, rows, skips); later snapshots compare greater.

    Example: ``progress({"samples_in": 9, "rows": 2, "skipped": {"corrupt_image": 1}})`` -> (9, 2, 1).
    """
    return snapshot["samples_in"], snapshot["rows"], sum(snapshot["skipped"].values())


def latest_snapshots(*sources: Mapping[int, Mapping[str, Any]]) -> dict[int, Mapping[str, Any]]:
    """Per worker id, the most advanced snapshot (:func:`progress`) among ``sources``; on a tie,
    the one from the later source.

    Example: rows carried ``{0: {samples_in: 8, ...}}``, files hold ``{0: {samples_in: 6, ...}}``
    (published a second earlier) -> the one with 8.
    """
    latest: dict[int, Mapping[str, Any]] = {}
    for source in sources:
        for worker, snapshot in source.items():
            if worker not in latest or progress(snapshot) >= progress(latest[worker]):
                latest[worker] = snapshot
    return latest


def read_snapshots(directory: str) -> dict[int, dict[str, Any]]:
    """The latest published snapshot of each worker, by worker id."""
    import json
    from pathlib import Path

    snapshots = {}
    for path in Path(directory).glob("worker-*.json"):
        snapshot = json.loads(path.read_text(encoding="utf-8"))
        snapshots[int(snapshot["worker_id"])] = snapshot
    return snapshots
