"""The pack plan file: rows of samples named by Energon sample position, plus what they depend on.

On disk a plan is one NumPy ``.npz`` archive (no pickles), written atomically:

* ``meta``: UTF-8 JSON bytes: ``format``, ``fingerprint`` (``dataset``: split and the shard
  table ``[[name, samples, bytes], ...]``; ``encoder``: processor, vision and rope identity;
  ``packing``: the config fields that decide rows), ``samples_in``, ``skipped`` (count by
  reason) and ``digest`` (SHA-256 over everything else, checked on load);
* ``row_offsets`` int64 [R+1]: row ``r`` holds members ``row_offsets[r]:row_offsets[r+1]``;
* ``member_shard`` int32 [N]: index into the shard table; ``member_index`` int32 [N]: sample
  index inside that shard; ``member_tokens`` int32 [N]: real tokens of the sample.

A member's Energon restore key is ``("Webdataset", shard offset + index)`` (see
``energon_pack.plan.build.webdataset_index``). 12 bytes per sample: 100k samples -> ~1.2 MB.
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

__all__ = ["PLAN_FORMAT", "PackPlan", "PlanFormatError"]

PLAN_FORMAT = "energon_pack.plan/1"
_ARRAYS = ("row_offsets", "member_shard", "member_index", "member_tokens")


class PlanFormatError(ValueError):
    """A file that is not a readable pack plan of this format (or whose digest does not match)."""


@dataclass(frozen=True, kw_only=True, eq=False)
class PackPlan:
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

    # ----------------------------------------------------------------------- geometry

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

    def global_indices(self, row: int) -> list[int]:
        """Energon sample indices (``"Webdataset"`` restore-key index) of row ``row``'s members."""
        lo, hi = int(self.row_offsets[row]), int(self.row_offsets[row + 1])
        return (self.shard_offsets[self.member_shard[lo:hi]] + self.member_index[lo:hi]).tolist()

    def row_tokens(self, row: int) -> list[int]:
        """Real tokens of row ``row``'s members."""
        return self.member_tokens[int(self.row_offsets[row]) : int(self.row_offsets[row + 1])].tolist()

    # ----------------------------------------------------------------------- identity

    def meta(self) -> dict[str, Any]:
        """The JSON part of the file (without ``digest``)."""
        return {
            "format": PLAN_FORMAT,
            "fingerprint": self.fingerprint,
            "samples_in": self.samples_in,
            "skipped": dict(sorted(self.skipped.items())),
        }

    @cached_property
    def digest(self) -> str:
        """SHA-256 (hex) over the meta JSON and the bytes of every array: the plan's identity."""
        hasher = hashlib.sha256(json.dumps(self.meta(), sort_keys=True).encode("utf-8"))
        for name in _ARRAYS:
            array = np.ascontiguousarray(getattr(self, name))
            hasher.update(f"{name}:{array.dtype.str}:{array.shape}".encode())
            hasher.update(array.tobytes())
        return hasher.hexdigest()

    # ----------------------------------------------------------------------- I/O

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the plan to ``path`` (atomically: a temporary file, then rename)."""
        meta = json.dumps({**self.meta(), "digest": self.digest}, sort_keys=True).encode("utf-8")
        path = Path(path)
        partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(partial, "wb") as out:
            np.savez(out, meta=np.frombuffer(meta, dtype=np.uint8), **{n: getattr(self, n) for n in _ARRAYS})
        os.replace(partial, path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> PackPlan:
        """Read a plan written by :meth:`save`; a wrong format or digest raises ``PlanFormatError``."""
        try:
            with np.load(path, allow_pickle=False) as archive:
                meta = json.loads(archive["meta"].tobytes().decode("utf-8"))
                arrays = {name: archive[name] for name in _ARRAYS}
        except (OSError, ValueError, KeyError) as err:
            raise PlanFormatError(
                f"{os.fspath(path)}: not a pack plan ({err}); fix: pass a file written by energon-pack plan"
            ) from err
        if not isinstance(meta, Mapping) or meta.get("format") != PLAN_FORMAT:
            found = meta.get("format") if isinstance(meta, Mapping) else None
            raise PlanFormatError(
                f"{os.fspath(path)}: plan format {found!r}, expected {PLAN_FORMAT!r}; "
                "fix: rebuild the plan with this version's energon-pack plan"
            )
        plan = cls(
            fingerprint=meta["fingerprint"],
            samples_in=int(meta["samples_in"]),
            skipped={str(k): int(v) for k, v in meta["skipped"].items()},
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
    ) -> PackPlan:
        """:meth:`from_rows` for rows given as CSR arrays of global sample indices: row ``r`` is
        ``members[row_offsets[r]:row_offsets[r + 1]]`` (no Python list per sample).

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
        )
