"""Real loader runs shared by the loader, runtime, formats and bridge tests: configs, row digests,
whole-epoch runs and the packing-stage states inside a saved loader state."""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Iterator
from typing import Any

from energon_pack.config import PackingConfig
from energon_pack.loader import ROW_CHECKPOINTS, PackingLoaderState, get_packing_loader

#: Row width (tokens) of the loader tests.
W = 4096
#: Loader keyword arguments that save a worker checkpoint after every sample (exact resume anywhere;
#: get_packing_loader's default since issue 49, spelled out where a test depends on it).
EAGER = dict(ROW_CHECKPOINTS)
#: Energon's own defaults (a checkpoint a minute at most): a restore replays rows from the last one.
ENERGON_CHECKPOINTS = dict(checkpoint_every_sec=60, checkpoint_every_min_n_samples=None)
ROW_TENSORS = (
    "input_ids", "labels", "loss_mask", "position_ids", "mrope_position_ids", "padding_mask",
    "cu_seqlens_q", "cu_seqlens_q_padded",
)


def tensor_digest(row: dict[str, Any]) -> str:
    """SHA-256 (hex) over the bytes of a row's token tensors, pixel tensors and (Qwen-Omni rows)
    audio features and lengths (absent ones skipped)."""
    digest = hashlib.sha256()
    visual, audio = row["visual_inputs"], row.get("audio_inputs")
    sounds = [] if audio is None else [audio.input_features, audio.audio_feature_lengths]
    for tensor in [row[name] for name in ROW_TENSORS] + [visual.pixel_values, visual.pixel_values_videos] + sounds:
        if tensor is not None:
            digest.update(tensor.contiguous().numpy().tobytes())
    return digest.hexdigest()


def row_digest(row: dict[str, Any]) -> tuple[tuple[str, ...], str]:
    """A row's sample keys and ``tensor_digest``: two rows compare equal exactly when both are."""
    return tuple(row["__keys__"]), tensor_digest(row)


def make_config(num_workers: int, **overrides: Any) -> PackingConfig:
    """The loader tests' config: rows of ``W`` tokens, a 4-sample buffer, one epoch."""
    return PackingConfig(**{"seq_length": W, "buffer_size": 4, "num_workers": num_workers, "repeat": False,
                            "max_wait_rounds": 3, **overrides})


def full_run(path, processor, config, **kwargs) -> tuple[list, dict]:
    """Row digests of one whole epoch and the loader's stats."""
    rows, _, stats = full_run_with_pending(path, processor, config, **kwargs)
    return rows, stats


def full_run_with_pending(path, processor, config, **kwargs) -> tuple[list, list[int], dict]:
    """Row digests, the emitting worker's pending-sample count after each row, and the stats."""
    loader = get_packing_loader(path, config, processor, **kwargs)
    rows, pending = [], []
    for row in loader:
        rows.append(row_digest(row))
        pending.append(row["__stats__"]["pending_samples"])
    return rows, pending, loader.stats()


def rows_after_resume(path, processor, config, save_after: int, **kwargs) -> list:
    """Row digests of a fresh loader restored from the (pickled) state saved after row
    ``save_after`` of another: what a restarted job reads from there to the end of the epoch."""
    loader = get_packing_loader(path, config, processor, **kwargs)
    iterator = iter(loader)
    for _ in range(save_after):
        next(iterator)
    state = pickle.loads(pickle.dumps(loader.save_state_rank()))
    del iterator, loader
    resumed = get_packing_loader(path, config, processor, **kwargs)
    resumed.restore_state_rank(state)
    return [row_digest(row) for row in resumed]


def packing_stages(state: PackingLoaderState) -> Iterator[dict[str, Any]]:
    """The packing-stage state of each worker inside a loader state."""

    def walk(node: Any) -> Iterator[dict[str, Any]]:
        if isinstance(node, dict):
            if node.get("__class__") == "PendingGroupPackingDataset":
                yield node
            for value in node.values():
                yield from walk(value)
        elif isinstance(node, list):
            for value in node:
                yield from walk(value)

    for worker_state in state.energon_state.worker_states:
        yield from walk(worker_state if isinstance(worker_state, dict) else worker_state.state.dataset_state)
