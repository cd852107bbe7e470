"""The pack plan file: rows of samples named by Energon sample position, plus what they depend on.

A plan holds (both formats, written atomically, no pickles):

* ``meta``: JSON: ``format``, ``fingerprint`` (``dataset``: split and the shard
  table ``[[name, samples, bytes], ...]``; ``encoder``: processor, vision and rope identity;
  ``packing``: the config fields that decide rows), ``samples_in``, ``skipped`` (count by
  reason) and ``digest`` (SHA-256 over everything else, checked on load);
* ``row_offsets`` int64 [R+1]: row ``r`` holds members ``row_offsets[r]:row_offsets[r+1]``;
* ``member_shard`` int32 [N]: index into the shard table; ``member_index`` int32 [N]: sample
  index inside that shard; ``member_tokens`` int32 [N]: real tokens of the sample;
* optional per-row arrays by name (``row_arrays``, one value per row), e.g. ``row_flops`` int64
  [R], only in a plan built with ``balance_steps``: each row's modelled fwd+bwd FLOPs
  (``energon_pack.rows.flops``), which the plan loader deals steps by (``plan.row_flops``).
  Plans without it keep their digest and are read with plain dealing.

A member's Energon restore key is ``("Webdataset", shard offset + index)`` (see
``energon_pack.plan.build.webdataset_index``). 12 bytes per sample: 100k samples -> ~1.2 MB.

Formats:

* ``energon_pack.plan/2`` (written by :meth:`PackPlan.save`): one flat file
  (:mod:`energon_pack.plan.columns`), the arrays memory-mapped by :func:`open_plan`, so a rank
  reads only the pages of its own rows; the header's chunk hashes are checked lazily, chunk by
  chunk, as rows are read. Its ``digest`` is the columns digest (meta + every array's 4 MiB
  chunk hashes), so it differs from the format-1 digest of the same rows.
* ``energon_pack.plan/1``: a NumPy ``.npz`` archive, loaded whole and hashed on load; still
  read (``format`` stays 1, with its own digest definition), never converted silently; its only
  row array is ``row_flops``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from energon_pack.plan.columns import ColumnsFile, PlanFormatError, Verify, columns_digest, is_columns_file, write_columns

__all__ = ["PLAN_FORMAT", "PLAN_FORMAT_V1", "MappedPlan", "PackPlan", "PlanFormatError", "open_plan"]

#: The format :meth:`PackPlan.save` writes.
PLAN_FORMAT = "energon_pack.plan/2"
#: The ``.npz`` format of earlier releases (still read).
PLAN_FORMAT_V1 = "energon_pack.plan/1"
_ARRAYS = ("row_offsets", "member_shard", "member_index", "member_tokens")
_DTYPES = {"row_offsets": np.int64, "member_shard": np.int32, "member_index": np.int32, "member_tokens": np.int32}
#: The row arrays a format-1 (``.npz``) plan may hold.
_V1_ROW_ARRAYS = ("row_flops",)


class _PlanRows:
    """Row reading shared by the in-memory and the memory-mapped plan: subclasses provide
    ``fingerprint``, ``row_offsets``, ``member_index``, ``row_arrays`` and ``_slice(name, lo, hi)``."""

    fingerprint: dict[str, Any]
    row_offsets: np.ndarray
    member_index: np.ndarray
    row_arrays: Mapping[str, np.ndarray]

    def _slice(self, name: str, lo: int, hi: int) -> np.ndarray:
        raise NotImplementedError

    @property
    def row_flops(self) -> np.ndarray | None:
        """int64 [R]: modelled FLOPs of each row (the row array of a plan built with
        ``balance_steps``), else None. Example: a balanced 3-row plan -> ``[9e12, 8e12, 9e12]``."""
        return self.row_arrays.get("row_flops")

    @property
    def num_rows(self) -> int:
        """Rows R in one epoch."""
        return len(self.row_offsets) - 1

    @property
    def num_samples(self) -> int:
        """Samples planned (each in exactly one row)."""
        return len(self.member_index)

    @property
    def shards(self) -> list[list[Any]]:
        """The shard table ``[[name, samples, bytes], ...]`` of the planned split."""
        return self.fingerprint["dataset"]["shards"]

    @cached_property
    def shard_offsets(self) -> np.ndarray:
        """int64 [S+1]: global Energon sample index of each shard's first sample (and the total)."""
        counts = np.array([count for _, count, _ in self.shards], dtype=np.int64)
        return np.concatenate([[0], np.cumsum(counts)])

    def _bounds(self, row: int) -> tuple[int, int]:
        bounds = self._slice("row_offsets", row, row + 2)
        return int(bounds[0]), int(bounds[1])

    def global_indices(self, row: int) -> list[int]:
        """Energon sample indices (``"Webdataset"`` restore-key index) of row ``row``'s members."""
        lo, hi = self._bounds(row)
        return (self.shard_offsets[self._slice("member_shard", lo, hi)] + self._slice("member_index", lo, hi)).tolist()

    def row_tokens(self, row: int) -> list[int]:
        """Real tokens of row ``row``'s members."""
        lo, hi = self._bounds(row)
        return self._slice("member_tokens", lo, hi).tolist()


@dataclass(frozen=True, kw_only=True, eq=False)
class PackPlan(_PlanRows):
    """Rows of one split planned globally; see the module docstring for the arrays' meaning."""

    fingerprint: dict[str, Any]
    row_offsets: np.ndarray
    member_shard: np.ndarray
    member_index: np.ndarray
    member_tokens: np.ndarray
    #: Samples read while planning (planned + skipped).
    samples_in: int
    #: Samples left out, by reason (``overlong``, ``corrupt_image``, ...).
    skipped: dict[str, int] = field(default_factory=dict)
    #: Optional per-row arrays by name, each of length ``num_rows`` (stored and digested with the rows).
    row_arrays: Mapping[str, np.ndarray] = field(default_factory=dict)
    #: ``PLAN_FORMAT`` (new plans) or ``PLAN_FORMAT_V1`` (a loaded format-1 file).
    format: str = PLAN_FORMAT

    def __post_init__(self) -> None:
        offsets = self.row_offsets
        members = len(self.member_index)
        if offsets.ndim != 1 or len(offsets) < 1 or offsets[0] != 0 or offsets[-1] != members:
            raise PlanFormatError(
                f"row_offsets must run from 0 to the member count {members}, got {offsets[:3]}...{offsets[-3:]}; "
                "fix: rebuild the plan with energon-pack plan"
            )
        if len(self.member_shard) != members or len(self.member_tokens) != members:
            raise PlanFormatError("member arrays differ in length; fix: rebuild the plan with energon-pack plan")
        if len(offsets) > 1 and int(np.diff(offsets).min()) < 1:
            raise PlanFormatError("a plan row has no member; fix: rebuild the plan with energon-pack plan")
        for name, values in self.row_arrays.items():
            if name in _ARRAYS or values.shape != (self.num_rows,):
                raise PlanFormatError(
                    f"row array {name!r} of shape {values.shape}: a per-row array needs a new name and one value "
                    f"per row ({self.num_rows}); fix: rebuild the plan with energon-pack plan"
                )
        if self.format not in (PLAN_FORMAT, PLAN_FORMAT_V1) or (
            self.format == PLAN_FORMAT_V1 and not set(self.row_arrays) <= set(_V1_ROW_ARRAYS)
        ):
            raise PlanFormatError(
                f"plan format {self.format!r} with row arrays {sorted(self.row_arrays)}: format 2 holds any row arrays, "
                f"format 1 only {list(_V1_ROW_ARRAYS)}; fix: rebuild the plan with this version's energon-pack plan"
            )

    def _slice(self, name: str, lo: int, hi: int) -> np.ndarray:
        return getattr(self, name)[lo:hi]

    # ----------------------------------------------------------------------- identity

    def meta(self) -> dict[str, Any]:
        """The JSON part of the file (without ``digest``)."""
        return {
            "format": self.format,
            "fingerprint": self.fingerprint,
            "samples_in": self.samples_in,
            "skipped": dict(sorted(self.skipped.items())),
        }

    def arrays(self) -> dict[str, np.ndarray]:
        """Every stored array by name: the four member arrays, then the row arrays by name."""
        return {**{name: getattr(self, name) for name in _ARRAYS}, **dict(sorted(self.row_arrays.items()))}

    @cached_property
    def digest(self) -> str:
        """SHA-256 (hex) of the meta and the bytes of every array: the plan's identity.

        Format 2: the columns digest (:func:`~energon_pack.plan.columns.columns_digest`), equal
        to the one its file stores; format 1: SHA-256 over the meta JSON and each array's bytes
        (``row_flops`` only when present).
        """
        if self.format == PLAN_FORMAT:
            return columns_digest(self.meta(), self.arrays())
        hasher = hashlib.sha256(json.dumps(self.meta(), sort_keys=True).encode("utf-8"))
        for name, array in self.arrays().items():
            array = np.ascontiguousarray(array)
            hasher.update(f"{name}:{array.dtype.str}:{array.shape}".encode())
            hasher.update(array.tobytes())
        return hasher.hexdigest()

    # ----------------------------------------------------------------------- I/O

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the plan to ``path`` in its format (atomically: a temporary file, then rename)."""
        if self.format == PLAN_FORMAT:
            write_columns(path, self.meta(), self.arrays())
            return
        meta = json.dumps({**self.meta(), "digest": self.digest}, sort_keys=True).encode("utf-8")
        path = Path(path)
        partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(partial, "wb") as out:
            np.savez(out, meta=np.frombuffer(meta, dtype=np.uint8), **self.arrays())
        os.replace(partial, path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> PackPlan:
        """Read a whole plan of either format, every byte checked; a wrong format or digest raises
        ``PlanFormatError``. (:func:`open_plan` maps a format-2 file instead of reading it.)"""
        if _is_format_2(path):
            return MappedPlan.open(path, verify="full").to_plan()
        try:
            with np.load(path, allow_pickle=False) as archive:
                meta = json.loads(archive["meta"].tobytes().decode("utf-8"))
                arrays = {name: archive[name] for name in _ARRAYS}
                row_arrays = {name: archive[name] for name in _V1_ROW_ARRAYS if name in archive.files}
        except (OSError, ValueError, KeyError) as err:
            raise PlanFormatError(
                f"{os.fspath(path)}: not a pack plan ({err}); fix: pass a file written by energon-pack plan"
            ) from err
        if not isinstance(meta, Mapping) or meta.get("format") != PLAN_FORMAT_V1:
            found = meta.get("format") if isinstance(meta, Mapping) else None
            raise PlanFormatError(
                f"{os.fspath(path)}: plan format {found!r}, expected {PLAN_FORMAT!r} or {PLAN_FORMAT_V1!r}; "
                "fix: rebuild the plan with this version's energon-pack plan"
            )
        plan = cls(
            fingerprint=meta["fingerprint"],
            samples_in=int(meta["samples_in"]),
            skipped={str(k): int(v) for k, v in meta["skipped"].items()},
            format=PLAN_FORMAT_V1,
            row_arrays=row_arrays,
            **arrays,
        )
        if plan.digest != meta.get("digest"):
            raise PlanFormatError(
                f"{os.fspath(path)}: content digest {plan.digest[:16]} does not match the stored "
                f"{str(meta.get('digest'))[:16]} (truncated or edited file); fix: rebuild the plan"
            )
        return plan

    @classmethod
    def from_rows(
        cls,
        rows: list[list[int]],
        tokens: np.ndarray,
        *,
        fingerprint: dict[str, Any],
        samples_in: int,
        skipped: Mapping[str, int],
    ) -> PackPlan:
        """Build a plan from rows of global sample indices and the tokens of every global index.

        ``fingerprint["dataset"]["shards"]`` maps global indices to (shard, index in shard).
        Example: shards ``[["a.tar", 2, 10], ["b.tar", 2, 10]]``, rows ``[[3, 0], [1]]`` ->
        member_shard ``[1, 0, 0]``, member_index ``[1, 0, 1]``, row_offsets ``[0, 2, 3]``.
        """
        flat = np.array([i for row in rows for i in row], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum([len(row) for row in rows], dtype=np.int64)]).astype(np.int64)
        return cls.from_csr(offsets, flat, tokens, fingerprint=fingerprint, samples_in=samples_in, skipped=skipped)

    @classmethod
    def from_csr(
        cls,
        row_offsets: np.ndarray,
        members: np.ndarray,
        tokens: np.ndarray,
        *,
        fingerprint: dict[str, Any],
        samples_in: int,
        skipped: Mapping[str, int],
        row_arrays: Mapping[str, np.ndarray] | None = None,
    ) -> PackPlan:
        """:meth:`from_rows` for rows given as CSR arrays of global sample indices: row ``r`` is
        ``members[row_offsets[r]:row_offsets[r + 1]]`` (no Python list per sample); ``row_arrays``
        as the field (e.g. ``{"row_flops": ...}``).

        Example: shards ``[["a.tar", 2, 10], ["b.tar", 2, 10]]``, offsets ``[0, 2, 3]``, members
        ``[3, 0, 1]`` -> member_shard ``[1, 0, 0]``, member_index ``[1, 0, 1]``.
        """
        counts = np.array([count for _, count, _ in fingerprint["dataset"]["shards"]], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(counts)])
        flat = np.asarray(members, dtype=np.int64)
        if len(flat) and (flat.min() < 0 or flat.max() >= starts[-1]):
            raise ValueError(f"sample indices must lie in [0, {starts[-1]}), the split's samples")
        shard = np.searchsorted(starts, flat, side="right") - 1
        return cls(
            fingerprint=fingerprint,
            row_offsets=np.asarray(row_offsets, dtype=np.int64),
            member_shard=shard.astype(np.int32),
            member_index=(flat - starts[shard]).astype(np.int32),
            member_tokens=np.asarray(tokens, dtype=np.int64)[flat].astype(np.int32),
            samples_in=samples_in,
            skipped=dict(skipped),
            row_arrays=dict(row_arrays or {}),
        )


def _is_format_2(path: str | os.PathLike[str]) -> bool:
    try:
        return is_columns_file(path)
    except OSError as err:
        raise PlanFormatError(f"{os.fspath(path)}: cannot read the plan ({err}); fix: pass a file written by energon-pack plan") from err


class MappedPlan(_PlanRows):
    """A format-2 plan opened memory-mapped: :class:`PackPlan`'s reading interface
    (``num_rows``, ``global_indices(row)``, ``row_tokens(row)``, ``shards``, ``digest``,
    ``fingerprint``, ``samples_in``, ``skipped``, ``row_arrays``, ``format``); a row read touches
    only that row's pages, and (``verify="lazy"``) checks the 4 MiB chunks it reads.
    Pickles as its path (a worker process maps the file again)."""

    def __init__(self, columns: ColumnsFile) -> None:
        meta = columns.meta
        if not isinstance(meta, Mapping) or meta.get("format") != PLAN_FORMAT or not set(_ARRAYS) <= set(columns.arrays):
            raise PlanFormatError(
                f"{columns.path}: a columns file but not a {PLAN_FORMAT!r} pack plan; fix: rebuild the plan with energon-pack plan"
            )
        self._columns = columns
        for name in _ARRAYS:
            if columns.arrays[name].dtype != _DTYPES[name]:
                raise PlanFormatError(f"{columns.path}: {name} has dtype {columns.arrays[name].dtype}; fix: rebuild the plan")
        self.row_offsets = columns.arrays["row_offsets"]
        self.member_index = columns.arrays["member_index"]
        if len(self.row_offsets) < 1 or len({len(columns.arrays[name]) for name in _ARRAYS[1:]}) != 1:
            raise PlanFormatError(f"{columns.path}: member arrays differ in length; fix: rebuild the plan")

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, verify: Verify = "lazy") -> MappedPlan:
        """Map the format-2 plan at ``path`` (header checked now, array bytes per ``verify``)."""
        return cls(ColumnsFile.open(path, verify=verify))

    def __reduce__(self) -> tuple[Any, ...]:
        return (_reopen, (os.fspath(self._columns.path), self._columns.verify))

    def _slice(self, name: str, lo: int, hi: int) -> np.ndarray:
        return self._columns.read(name, lo, hi)

    @property
    def path(self) -> Path:
        return self._columns.path

    @property
    def format(self) -> str:
        return PLAN_FORMAT

    @property
    def fingerprint(self) -> dict[str, Any]:  # type: ignore[override]
        return self._columns.meta["fingerprint"]

    @property
    def digest(self) -> str:
        return self._columns.digest

    @property
    def samples_in(self) -> int:
        return int(self._columns.meta["samples_in"])

    @property
    def skipped(self) -> dict[str, int]:
        return {str(k): int(v) for k, v in self._columns.meta["skipped"].items()}

    @property
    def row_arrays(self) -> dict[str, np.ndarray]:
        """The optional per-row arrays by name (memory-mapped, unchecked)."""
        return {name: array for name, array in self._columns.arrays.items() if name not in _ARRAYS}

    def to_plan(self) -> PackPlan:
        """The in-memory :class:`PackPlan` over the mapped arrays (same digest)."""
        arrays = self._columns.arrays
        return PackPlan(
            fingerprint=self.fingerprint,
            samples_in=self.samples_in,
            skipped=self.skipped,
            row_arrays=self.row_arrays,
            **{name: arrays[name] for name in _ARRAYS},
        )


def _reopen(path: str, verify: Verify) -> MappedPlan:
    return MappedPlan.open(path, verify=verify)


def open_plan(path: str | os.PathLike[str], *, verify: Verify = "lazy") -> PackPlan | MappedPlan:
    """A plan file of either format for reading rows: format 2 memory-mapped (O(1) in its size;
    ``verify``: ``"lazy"`` checks each 4 MiB chunk when first read, ``"full"`` all now,
    ``"none"`` never), format 1 loaded whole and checked (``PackPlan.load``).

    Example: ``open_plan("train.plan").global_indices(0)`` -> ``[17, 3, 9]``.
    """
    if _is_format_2(path):
        return MappedPlan.open(path, verify=verify)
    return PackPlan.load(path)
