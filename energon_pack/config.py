"""Packing configuration: parallel topology, validated knobs, YAML I/O, resume fingerprints.

Everything here is plain Python (no torch) so that it can be imported cheaply by the
CLI, by Energon worker processes and by training scripts before any GPU work starts.
A configuration error fails fast, on construction, with a ``ValueError`` that names
the offending value, the rule and the fix (docs/configuration.md).
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from energon_pack.alignment import aligned_length
from energon_pack.loss_reduction import LOSS_REDUCTIONS

__all__ = [
    "CONFIG_PARTS",
    "DEFAULT_BUFFER_SIZE",
    "LOSS_REDUCTIONS",
    "OVERLONG_POLICIES",
    "PACKING_MODES",
    "PIXEL_DTYPES",
    "ConfigError",
    "LoaderOptions",
    "PackingConfig",
    "PackingPolicy",
    "ParallelTopology",
    "ResumeMismatchError",
    "RowLayout",
    "TrainerSettings",
    "check_resume_fingerprint",
    "check_training_compat",
    "fingerprint_mismatches",
]

_LOG = logging.getLogger(__name__)

OVERLONG_POLICIES: tuple[str, ...] = ("skip", "error", "shrink")
#: ``online``: per-worker bin selection into rows of W; ``in_batch``: one row of every k samples.
PACKING_MODES: tuple[str, ...] = ("online", "in_batch")
PIXEL_DTYPES: tuple[str, ...] = ("float32", "uint8")

_ABSENT = object()


# --------------------------------------------------------------------------- value rules
# Each rule returns one error line ("name=value: rule; fix: ...") or None when the value is valid.


def _int_problem(name: str, value: Any, *, minimum: int, optional: bool = False) -> str | None:
    """Check that ``value`` is an int (not a bool) >= ``minimum``; None passes when ``optional``.

    Example: ``_int_problem("buffer_size", 0, minimum=1)`` ->
    ``"buffer_size=0: must be an integer >= 1; fix: set buffer_size to an integer >= 1"``.
    """
    if optional and value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= minimum:
        return None
    rule = f"an integer >= {minimum}" + (" or null" if optional else "")
    return f"{name}={value!r}: must be {rule}; fix: set {name} to {rule}"


def _bool_problem(name: str, value: Any) -> str | None:
    """Check that ``value`` is a bool. Example: ``_bool_problem("repeat", "yes")`` -> an error line."""
    if isinstance(value, bool):
        return None
    return f"{name}={value!r}: must be a boolean; fix: set {name} to true or false"


def _choice_problem(name: str, value: Any, choices: tuple[str, ...]) -> str | None:
    """Check that ``value`` is one of ``choices``.

    Example: ``_choice_problem("on_overlong", "cut", ("skip", "error"))`` -> an error line.
    """
    if isinstance(value, str) and value in choices:
        return None
    options = " or ".join(repr(c) for c in choices)
    return f"{name}={value!r}: must be one of {options}; fix: set {name} to {options}"


def _next_multiple(value: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is >= ``value`` (and >= ``multiple``).

    Example: ``_next_multiple(8190, 4)`` -> ``8192``; ``_next_multiple(0, 4)`` -> ``4``.
    """
    return max(multiple, aligned_length(value, multiple))


def _micro_batch_problem(name: str, value: Any) -> str | None:
    """Packing emits one packed row per micro-batch, so the micro-batch size must be exactly 1."""
    if isinstance(value, int) and not isinstance(value, bool) and value == 1:
        return None
    return (
        f"{name}={value!r}: packing emits one packed THD row per micro-batch, so the micro-batch "
        f"size must be 1; fix: set {name}=1 and raise the global batch size "
        "(gradient accumulation) instead, or set mode: in_batch to pack every k samples into one row"
    )


def _in_batch_micro_batch_problem(name: str, value: Any, k: int) -> str | None:
    """In mode ``in_batch`` one row holds the trainer's micro-batch of ``k`` samples."""
    if value == k and not isinstance(value, bool):
        return None
    return (
        f"{name}={value!r}: in mode 'in_batch' each row holds one micro-batch of the config's "
        f"micro_batch_size={k} samples; fix: set {name}={k}"
    )


def _in_batch_problems(row: RowLayout, micro_batch_size: int) -> Iterator[str | None]:
    """Rules of ``mode="in_batch"`` that involve the row layout (k = micro_batch_size samples per row)."""
    if row.fixed_width is not False:
        yield (
            f"fixed_width={row.fixed_width!r}: mode 'in_batch' builds one row of variable width from every "
            "micro_batch_size samples (sum of their aligned lengths, rounded up to width_multiple); "
            "fix: set fixed_width: false, or mode: online for fixed-width rows"
        )
    if row.max_segments is not None and micro_batch_size > row.max_segments:
        yield (
            f"micro_batch_size={micro_batch_size}: mode 'in_batch' puts micro_batch_size samples in one row, "
            f"more than max_segments={row.max_segments}; fix: raise max_segments to at least "
            f"{micro_batch_size} or lower micro_batch_size"
        )


def _global_batch_problem(name: str, value: Any, dp: int) -> str | None:
    """``value`` (when not None) must be a multiple of the data-parallel size ``dp`` and >= ``dp``.

    Example: ``_global_batch_problem("global_batch_size", 6, 4)`` -> error suggesting 8.
    """
    problem = _int_problem(name, value, minimum=1, optional=True)
    if problem or value is None:
        return problem
    if value % dp == 0 and value >= dp:
        return None
    return (
        f"{name}={value}: must be divisible by and >= the data-parallel size dp={dp} "
        f"(every data-parallel rank takes whole micro-batches of one packed row); "
        f"fix: set {name} to a multiple of {dp}, e.g. {_next_multiple(value, dp)}"
    )


def _pipeline_problem(name: str, value: Any) -> str | None:
    """Pipeline parallel (> 1) is rejected by name."""
    problem = _int_problem(name, value, minimum=1)
    if problem or value == 1:
        return problem
    return (
        f"{name}={value}: pipeline parallel is not supported by packed THD rows in energon_pack; "
        f"fix: set {name}=1 and shard the model with tp/cp/ep instead"
    )


def _mtp_problem(name: str, value: Any) -> str | None:
    """Multi-token prediction layers (> 0) are rejected by name."""
    problem = _int_problem(name, value, minimum=0)
    if problem or value == 0:
        return problem
    return (
        f"{name}={value}: multi-token prediction (MTP) is not supported with packed THD rows "
        f"in energon_pack; fix: set {name}=0"
    )


def _cuda_graph_problem(name: str, *, fixed_width: bool, pad_cu_seqlens: bool) -> str | None:
    """CUDA graphs replay fixed tensor shapes: they need fixed-width rows and padded cu_seqlens."""
    if fixed_width is True and pad_cu_seqlens is True:
        return None
    return (
        f"{name}=True: CUDA graphs need fixed tensor shapes, i.e. fixed_width=True and "
        f"pad_cu_seqlens=True with max_segments (got fixed_width={fixed_width!r}, "
        f"pad_cu_seqlens={pad_cu_seqlens!r}); fix: set fixed_width: true, pad_cu_seqlens: true "
        "and max_segments: N in the packing config, or disable CUDA graphs"
    )


class ConfigError(ValueError):
    """An invalid configuration; ``problems`` holds one line per violated rule (value, rule, fix)."""

    def __init__(self, what: str, problems: list[str]) -> None:
        super().__init__(f"invalid {what}:\n  - " + "\n  - ".join(problems))
        self.problems = problems


def _raise_if_problems(what: str, problems: Iterable[str | None]) -> None:
    """Raise one ConfigError listing every non-None problem line, if any."""
    lines = [p for p in problems if p is not None]
    if lines:
        raise ConfigError(what, lines)


def closest_keys(key: str, valid: Iterable[str], *, cutoff: float = 0.6) -> list[str]:
    """Every valid key that is as close to ``key`` as the closest one (difflib ratio >= ``cutoff``).

    Example: ``closest_keys("cpp", ["tp", "cp", "pp"])`` -> ``["cp", "pp"]`` (both ratio 0.8);
    ``closest_keys("zzz", ["tp"])`` -> ``[]``.
    """
    ratios = {name: difflib.SequenceMatcher(None, key, name).ratio() for name in valid}
    best = max(ratios.values(), default=0.0)
    return [name for name, ratio in ratios.items() if ratio == best] if best >= cutoff else []


def _unknown_key_problem(what: str, keys: Iterable[Any], valid: Iterable[str]) -> str | None:
    """Name every key not in ``valid`` (with every equally close match) and list the valid ones.

    Example: ``_unknown_key_problem("PackingConfig", ["bufer_size"], ["buffer_size"])`` ->
    ``"unknown PackingConfig key(s): 'bufer_size' (did you mean 'buffer_size'?); valid keys: buffer_size"``.
    """
    valid = list(valid)
    unknown = sorted((k for k in keys if k not in valid), key=str)
    if not unknown:
        return None
    described = []
    for key in unknown:
        close = " or ".join(repr(name) for name in closest_keys(str(key), valid))
        described.append(f"{key!r}" + (f" (did you mean {close}?)" if close else ""))
    return f"unknown {what} key(s): {', '.join(described)}; valid keys: {', '.join(valid)}"


def _raise_if_unknown_keys(problems: Iterable[str | None]) -> None:
    """Raise one ValueError for all unknown-key lines, with the fix."""
    lines = [p for p in problems if p is not None]
    if lines:
        raise ValueError("\n".join(lines) + "\nfix: remove or rename the unknown key(s)")


def _field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


# --------------------------------------------------------------------------- topology


@dataclass(frozen=True, kw_only=True)
class ParallelTopology:
    """Model-parallel layout of the training job; only its alignment consequences matter here.

    tp: tensor parallel size; cp: context parallel size; sp: sequence parallel (shards the
    sequence over the tp ranks; no effect when tp == 1); ep: expert parallel size;
    pp: pipeline parallel size (must be 1); dp: data-parallel size (informational: the
    loader takes the real rank and world size from torch.distributed).
    """

    tp: int = 1
    cp: int = 1
    sp: bool = False
    ep: int = 1
    pp: int = 1
    dp: int = 1

    def __post_init__(self) -> None:
        _raise_if_problems(
            "ParallelTopology",
            [
                *(_int_problem(name, getattr(self, name), minimum=1) for name in ("tp", "cp", "ep", "dp")),
                _bool_problem("sp", self.sp),
                _pipeline_problem("pp", self.pp),
            ],
        )

    @property
    def pad_multiple(self) -> int:
        """Alignment multiple (tokens) every packed segment is padded to.

        lcm(2*cp if cp > 1 else 1, cp*tp if sp and tp > 1 else 1): CP load balancing splits
        each segment into 2*cp chunks; sequence parallel splits the row over cp*tp ranks.
        Examples: TP1/CP1 -> 1; TP4/SP -> 4; CP2/TP4/SP -> lcm(4, 8) = 8.
        """
        cp_multiple = 2 * self.cp if self.cp > 1 else 1
        sp_multiple = self.cp * self.tp if self.sp and self.tp > 1 else 1
        return math.lcm(cp_multiple, sp_multiple)

    def to_dict(self) -> dict[str, Any]:
        """Plain mapping, e.g. ``{"tp": 1, "cp": 1, "sp": False, "ep": 1, "pp": 1, "dp": 1}``."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ParallelTopology:
        """Build from a mapping such as ``{"tp": 2, "cp": 2, "sp": True}``; unknown keys raise ValueError."""
        if not isinstance(data, Mapping):
            raise ValueError(
                f"topology={data!r}: must be a mapping such as {{tp: 2, cp: 2, sp: true}}; "
                "fix: write topology as a nested mapping"
            )
        _raise_if_unknown_keys([_unknown_key_problem("topology", data.keys(), _field_names(cls))])
        return cls(**data)


# --------------------------------------------------------------------------- config parts
# Each part is a frozen keyword-only dataclass validated on construction. A field whose value
# does not change the rows a loader yields is marked ``_NOT_FINGERPRINTED``; every other field
# of the row layout, packing policy and loader options enters the resume fingerprint by itself.

_NOT_FINGERPRINTED = {"fingerprint": False}


def _fingerprint_fields(part: Any) -> dict[str, Any]:
    """The part's fields that exact resume depends on (those not marked ``_NOT_FINGERPRINTED``)."""
    return {f.name: getattr(part, f.name) for f in dataclasses.fields(part) if f.metadata.get("fingerprint", True)}


@dataclass(frozen=True, kw_only=True)
class RowLayout:
    """How a packed row is laid out; widths and multiples are in tokens.

    seq_length: row width W (physical tokens per packed row).
    topology: parallel layout; derives the default alignment multiple.
    pad_to_multiple_of: explicit per-segment alignment (a multiple of ``topology.pad_multiple``);
        None uses ``topology.pad_multiple``.
    width_multiple: kernel constraint on the row width (e.g. 128 for a HybridEP combine chunk).
    fixed_width: every row is exactly ``seq_length`` wide (tail padded); False: a row is as wide as
        the sum of its samples' aligned lengths, rounded up to ``width_multiple`` (no tail gap).
    pad_cu_seqlens: cu_seqlens tensors have fixed length ``max_segments + 1`` (CUDA graphs).
    max_segments: most segments (samples) per row; None = unbounded.
    pixel_dtype: dtype of the emitted pixel tensors: "uint8" (default: resized, patchified pixels,
        4x smaller to hold, pin and copy; normalised on the device by
        ``VisualInputs.normalized_for_model``, equal to the float32 payload) or "float32"
        (model-ready, the Hugging Face processor's ``pixel_values``).
    fast_jpeg_decode: decode a JPEG whose resized size is at most half its own size (each side)
        at 1/2, 1/4 or 1/8 scale in the DCT domain (PIL ``Image.draft``), then resize it to the
        exact target size; faster for big photos, pixels close to but not equal to the exact path
        (``energon-pack bench --stage jpeg`` reports the difference). Grids and tokens are unchanged.
    loss_reduction: what the trainer's per-token loss averages over: "token" (every supervised
        token alike), "sample" (each sample's mean loss alike) or "square" (InternVL's
        1/sqrt(n) weighting), realised as per-token weights in ``loss_mask``.
    """

    seq_length: int
    #: Enters the fingerprint through ``pad_multiple``.
    topology: ParallelTopology = field(default_factory=ParallelTopology, metadata=_NOT_FINGERPRINTED)
    pad_to_multiple_of: int | None = field(default=None, metadata=_NOT_FINGERPRINTED)
    width_multiple: int | None = None
    fixed_width: bool = True
    pad_cu_seqlens: bool = False
    max_segments: int | None = None
    pixel_dtype: Literal["float32", "uint8"] = "uint8"
    fast_jpeg_decode: bool = False
    loss_reduction: Literal["token", "sample", "square"] = "token"

    def __post_init__(self) -> None:
        _raise_if_problems(type(self).__name__, self.problems())

    @property
    def pad_multiple(self) -> int:
        """Per-segment alignment in tokens: ``pad_to_multiple_of`` if given, else ``topology.pad_multiple``.

        Example: ``RowLayout(seq_length=8192, topology=ParallelTopology(tp=4, sp=True))``
        -> ``pad_multiple == 4``.
        """
        return self.topology.pad_multiple if self.pad_to_multiple_of is None else self.pad_to_multiple_of

    def fingerprint(self) -> dict[str, Any]:
        """Resume-relevant values, the alignment multiple instead of the topology that derives it
        (``fast_jpeg_decode`` only when set, so that states saved before it existed still resume)."""
        values = {**_fingerprint_fields(self), "pad_multiple": self.pad_multiple}
        if not values["fast_jpeg_decode"]:
            del values["fast_jpeg_decode"]
        return values

    def problems(self) -> Iterator[str | None]:
        """One line per violated rule (None for rules that hold)."""
        topology_ok = isinstance(self.topology, ParallelTopology)
        if not topology_ok:
            yield (
                f"topology={self.topology!r}: must be a ParallelTopology; fix: pass "
                "ParallelTopology(tp=..., cp=...) or use PackingConfig.from_dict for a mapping"
            )
        yield from self._width_problems(topology_ok)
        yield _int_problem("max_segments", self.max_segments, minimum=1, optional=True)
        for name in ("fixed_width", "pad_cu_seqlens"):
            yield _bool_problem(name, getattr(self, name))
        if self.pad_cu_seqlens is True and (self.fixed_width is not True or self.max_segments is None):
            yield (
                f"pad_cu_seqlens=True: needs fixed_width=True and max_segments set (got "
                f"fixed_width={self.fixed_width!r}, max_segments={self.max_segments!r}), since the "
                "cu_seqlens tensors are padded to length max_segments + 1; fix: set fixed_width: "
                "true and max_segments: N (e.g. 64), or pad_cu_seqlens: false"
            )
        yield _choice_problem("pixel_dtype", self.pixel_dtype, PIXEL_DTYPES)
        yield _bool_problem("fast_jpeg_decode", self.fast_jpeg_decode)
        yield _choice_problem("loss_reduction", self.loss_reduction, LOSS_REDUCTIONS)

    def _width_problems(self, topology_ok: bool) -> Iterator[str | None]:
        """Rules on seq_length, pad_to_multiple_of and width_multiple (skipping ones with bad inputs)."""
        seq_problem = _int_problem("seq_length", self.seq_length, minimum=1)
        pad_problem = _int_problem("pad_to_multiple_of", self.pad_to_multiple_of, minimum=1, optional=True)
        width_problem = _int_problem("width_multiple", self.width_multiple, minimum=1, optional=True)
        yield from (seq_problem, pad_problem, width_problem)
        if not topology_ok or pad_problem:
            return
        topo_multiple = self.topology.pad_multiple
        topo_origin = (
            f"the topology's alignment multiple {topo_multiple} "
            f"(tp={self.topology.tp}, cp={self.topology.cp}, sp={self.topology.sp})"
        )
        if self.pad_to_multiple_of is not None and self.pad_to_multiple_of % topo_multiple:
            yield (
                f"pad_to_multiple_of={self.pad_to_multiple_of}: must be a multiple of {topo_origin}; "
                f"fix: set pad_to_multiple_of to {math.lcm(self.pad_to_multiple_of, topo_multiple)} "
                "or remove it to use the topology's multiple"
            )
            return
        if seq_problem:
            return
        multiple = self.pad_multiple
        if self.seq_length % multiple:
            origin = topo_origin if self.pad_to_multiple_of is None else f"pad_to_multiple_of={multiple}"
            yield (
                f"seq_length={self.seq_length}: must be divisible by {origin}; "
                f"fix: set seq_length to e.g. {_next_multiple(self.seq_length, multiple)}"
            )
        elif not width_problem and self.width_multiple is not None and self.seq_length % self.width_multiple:
            both = math.lcm(self.width_multiple, multiple)
            yield (
                f"width_multiple={self.width_multiple}: seq_length={self.seq_length} must be divisible "
                f"by width_multiple; fix: set seq_length to a multiple of {both}, e.g. "
                f"{_next_multiple(self.seq_length, both)}"
            )


#: Samples per round when neither ``buffer_size`` nor ``buffer_tokens`` is given.
DEFAULT_BUFFER_SIZE = 16


@dataclass(frozen=True, kw_only=True)
class PackingPolicy:
    """How the packing stage chooses bins.

    A selection round runs on the samples that arrived since the last round (plus the pending
    groups); exactly one of two settings says when:

    buffer_size: after this many new samples (default 16 when ``buffer_tokens`` is not set).
    buffer_tokens: after the new samples hold at least this many aligned tokens (a multiple of
        ``seq_length``, e.g. ``2 * seq_length``): one setting keeps rounds meaningful across row
        widths and across mixes of short and long samples. Set it with ``buffer_size`` unset.
    max_wait_rounds: most buffer rounds an under-filled bin is held back as a pending group.
    min_fill: fill fraction in (0, 1] at which a bin is emitted without waiting.
    max_row_vision_patches: most ViT input patches per row (sum of t*h*w over the row's image and
        video grids, before the 2x2 merge); None = no limit.
    max_row_media: most images + videos per row; None = no limit.
    on_overlong: a sample that fits no row (longer than ``seq_length`` after alignment, or over a
        per-row vision limit) is skipped (counted), raises, or is shrunk ("shrink": its images'
        pixel budget, then its videos' frame count, lowered to the largest setting that fits;
        skipped when even the processor's minimum does not fit, or when it has more media than
        ``max_row_media``).
    mode: "online" packs rows of W per worker (bin selection with pending groups); "in_batch" packs
        every ``micro_batch_size`` consecutive samples into one variable-width row (needs
        ``fixed_width=False``; ``seq_length`` and the vision limits cap each sample). A pack plan
        (``get_packing_loader(plan=...)``) replaces online selection under the same budgets.
    micro_batch_size: samples per micro-batch: 1 in mode "online" (one packed row per micro-batch);
        k >= 2 in mode "in_batch" (one row of k samples per micro-batch).
    max_consecutive_skips: raise ``TooManyBadSamplesError`` when one worker meets more bad samples
        in a row than this (None, the default: skip and count bad samples without limit). Not in
        the resume fingerprint: a run stopped by the limit resumes under a raised limit.
    """

    buffer_size: int | None = None
    buffer_tokens: int | None = None
    max_wait_rounds: int = 4
    min_fill: float = 0.99
    max_row_vision_patches: int | None = None
    max_row_media: int | None = None
    on_overlong: Literal["skip", "error", "shrink"] = "skip"
    mode: Literal["online", "in_batch"] = "online"
    micro_batch_size: int = 1
    max_consecutive_skips: int | None = field(default=None, metadata=_NOT_FINGERPRINTED)

    def __post_init__(self) -> None:
        if isinstance(self.min_fill, int) and not isinstance(self.min_fill, bool):
            object.__setattr__(self, "min_fill", float(self.min_fill))
        if self.buffer_size is None and self.buffer_tokens is None:
            object.__setattr__(self, "buffer_size", DEFAULT_BUFFER_SIZE)
        _raise_if_problems(type(self).__name__, self.problems())

    def fingerprint(self) -> dict[str, Any]:
        """Resume-relevant values (``buffer_tokens`` only when set, so that states saved before it
        existed still resume)."""
        values = _fingerprint_fields(self)
        if values["buffer_tokens"] is None:
            del values["buffer_tokens"]
        return values

    def problems(self) -> Iterator[str | None]:
        """One line per violated rule (None for rules that hold)."""
        if self.buffer_size is not None and self.buffer_tokens is not None:
            yield (
                f"buffer_size={self.buffer_size!r}, buffer_tokens={self.buffer_tokens!r}: a round runs after "
                "buffer_size new samples or after buffer_tokens new tokens, not both; fix: keep one of them "
                "and set the other to null (None)"
            )
        yield _int_problem("buffer_size", self.buffer_size, minimum=1, optional=True)
        yield _int_problem("buffer_tokens", self.buffer_tokens, minimum=1, optional=True)
        yield _int_problem("max_wait_rounds", self.max_wait_rounds, minimum=0)
        if not isinstance(self.min_fill, float) or not 0.0 < self.min_fill <= 1.0:  # bools are not floats
            yield (
                f"min_fill={self.min_fill!r}: must be a number in (0, 1] (fraction of seq_length); "
                "fix: set min_fill to e.g. 0.99"
            )
        yield _int_problem("max_row_vision_patches", self.max_row_vision_patches, minimum=1, optional=True)
        yield _int_problem("max_row_media", self.max_row_media, minimum=1, optional=True)
        yield _choice_problem("on_overlong", self.on_overlong, OVERLONG_POLICIES)
        yield _choice_problem("mode", self.mode, PACKING_MODES)
        if self.mode == "in_batch":
            problem = _int_problem("micro_batch_size", self.micro_batch_size, minimum=2)
            yield problem and problem.replace("must be", "in mode 'in_batch' (k samples per row) must be")
            for name in ("max_row_vision_patches", "max_row_media"):
                if getattr(self, name) is not None:
                    yield (
                        f"{name}={getattr(self, name)}: mode 'in_batch' puts every micro_batch_size consecutive "
                        f"samples in one row whatever their media, so it cannot keep a per-row limit; fix: remove "
                        f"{name}, or use mode: online (or a pack plan) to pack within it"
                    )
        else:
            yield _micro_batch_problem("micro_batch_size", self.micro_batch_size)
        yield _int_problem("max_consecutive_skips", self.max_consecutive_skips, minimum=1, optional=True)


def _switched_buffer_unit(values: Mapping[str, Any]) -> dict[str, Any]:
    """Setting one of buffer_size / buffer_tokens over an existing policy unsets the other.

    Example: ``{"buffer_tokens": 16384}`` -> ``{"buffer_size": None}``; ``{"min_fill": 0.9}`` -> ``{}``.
    """
    pair = {"buffer_size": "buffer_tokens", "buffer_tokens": "buffer_size"}
    return {other: None for key, other in pair.items() if key in values and other not in values}


def _buffer_tokens_problem(row: RowLayout | None, policy: PackingPolicy | None) -> str | None:
    """``buffer_tokens`` (when set) must be a multiple of the row width, so a round holds whole rows.

    Example: seq_length 8192, buffer_tokens 12000 -> an error suggesting 16384.
    """
    if row is None or policy is None or policy.buffer_tokens is None or policy.buffer_tokens % row.seq_length == 0:
        return None
    return (
        f"buffer_tokens={policy.buffer_tokens}: must be a multiple of seq_length={row.seq_length} (a round "
        f"buffers whole rows of tokens); fix: set buffer_tokens to e.g. "
        f"{_next_multiple(policy.buffer_tokens, row.seq_length)}"
    )


@dataclass(frozen=True, kw_only=True)
class LoaderOptions:
    """How Energon reads the data.

    num_workers: Energon DataLoader worker processes per rank (0 = in the main process).
    repeat: loop over the dataset forever (training) or one finite epoch.
    shuffle_buffer_size / max_samples_per_sequence: Energon shuffling knobs (None = Energon default).
    seed: shuffle seed.
    allow_inexact_resume: restore a loader state saved under a different fingerprint anyway.
    prefetch_factor: rows each worker builds ahead of the consumer (Energon's / torch's
        ``prefetch_factor``). Each row in flight holds its whole pixel payload, so a worker's
        memory grows with it; 1 is enough when a row is consumed slower than a worker builds one.
    timeout: seconds to wait for a worker's next row before raising ``RuntimeError`` (torch's
        ``DataLoader`` timeout: a hung worker becomes an error); 0 (the default) waits forever.
        Needs ``num_workers >= 1``.
    """

    num_workers: int = 2
    repeat: bool = True
    shuffle_buffer_size: int | None = None
    max_samples_per_sequence: int | None = None
    seed: int = 42
    allow_inexact_resume: bool = field(default=False, metadata=_NOT_FINGERPRINTED)
    prefetch_factor: int = field(default=2, metadata=_NOT_FINGERPRINTED)
    timeout: float = field(default=0, metadata=_NOT_FINGERPRINTED)

    def __post_init__(self) -> None:
        _raise_if_problems(type(self).__name__, self.problems())

    def fingerprint(self) -> dict[str, Any]:
        """Resume-relevant values."""
        return _fingerprint_fields(self)

    def problems(self) -> Iterator[str | None]:
        """One line per violated rule (None for rules that hold)."""
        yield _int_problem("num_workers", self.num_workers, minimum=0)
        for name in ("repeat", "allow_inexact_resume"):
            yield _bool_problem(name, getattr(self, name))
        yield _int_problem("shuffle_buffer_size", self.shuffle_buffer_size, minimum=1, optional=True)
        yield _int_problem("max_samples_per_sequence", self.max_samples_per_sequence, minimum=1, optional=True)
        yield _int_problem("seed", self.seed, minimum=0)
        yield _int_problem("prefetch_factor", self.prefetch_factor, minimum=1)
        yield _timeout_problem(self.timeout, self.num_workers)


def _timeout_problem(timeout: Any, num_workers: Any) -> str | None:
    """``timeout`` must be a number of seconds >= 0, and > 0 only with worker processes.

    Example: ``_timeout_problem(60, 0)`` -> an error suggesting num_workers >= 1.
    """
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout < 0:
        return f"timeout={timeout!r}: must be a number of seconds >= 0 (0 waits forever); fix: set e.g. timeout: 600"
    if timeout > 0 and num_workers == 0:
        return (
            f"timeout={timeout!r}: without worker processes (num_workers=0) the main process cannot time "
            "itself out; fix: set num_workers >= 1, or timeout: 0"
        )
    return None


@dataclass(frozen=True, kw_only=True)
class TrainerSettings:
    """The trainer's settings as a config file declares them; packing never reads them.

    They are checked, on ``PackingConfig`` construction, by the trainer-side rules of
    ``check_training_compat`` (``global_batch_size`` vs ``topology.dp``, no MTP, CUDA graphs
    need fixed shapes). The micro-batch size is a packing setting (``PackingPolicy``).
    """

    global_batch_size: int | None = None
    mtp_num_layers: int = 0
    cuda_graphs: bool = False


# --------------------------------------------------------------------------- packing config

#: The parts of a PackingConfig, by attribute name, in serialisation order.
CONFIG_PARTS: dict[str, type] = {
    "row": RowLayout,
    "policy": PackingPolicy,
    "loader": LoaderOptions,
    "trainer": TrainerSettings,
}
#: Flat key (as in YAML files and keyword arguments) -> the part that holds it.
_PART_OF_KEY: dict[str, str] = {f.name: part for part, cls in CONFIG_PARTS.items() for f in dataclasses.fields(cls)}


@dataclass(frozen=True, init=False)
class PackingConfig:
    """Every packing and loader knob, in parts, validated on construction (one ValueError listing
    every problem).

    Parts: ``row`` (:class:`RowLayout`: what a row looks like), ``policy``
    (:class:`PackingPolicy`: how bins are chosen), ``loader`` (:class:`LoaderOptions`: how Energon
    reads), ``trainer`` (:class:`TrainerSettings`: declared trainer settings, checked only).
    The row builder and the packing stage receive their parts whole; the resume fingerprint is
    derived from the parts.

    Build it from flat keys, each routed to its part (the YAML form):
    ``PackingConfig(seq_length=8192, buffer_size=16, topology=ParallelTopology(tp=1, cp=1),
    num_workers=2, repeat=False)``, or from parts: ``PackingConfig(row=RowLayout(seq_length=8192))``
    (flat keys given with a part override that part's fields). Every flat key is also readable
    as an attribute: ``config.buffer_size == config.policy.buffer_size``.
    """

    row: RowLayout
    policy: PackingPolicy
    loader: LoaderOptions
    trainer: TrainerSettings

    def __init__(
        self,
        *,
        row: RowLayout | None = None,
        policy: PackingPolicy | None = None,
        loader: LoaderOptions | None = None,
        trainer: TrainerSettings | None = None,
        **flat: Any,
    ) -> None:
        unknown = _unknown_key_problem("PackingConfig", flat.keys(), _PART_OF_KEY)
        if unknown:
            raise TypeError(f"{unknown}; fix: remove or rename the unknown key(s)")
        given = {"row": row, "policy": policy, "loader": loader, "trainer": trainer}
        problems: list[str] = []
        for name, cls in CONFIG_PARTS.items():
            values = {key: value for key, value in flat.items() if _PART_OF_KEY[key] == name}
            if given[name] is not None:
                values = {**_switched_buffer_unit(values), **values}
            try:
                part = cls(**values) if given[name] is None else dataclasses.replace(given[name], **values)
            except ConfigError as err:
                problems += err.problems
                part = None
            object.__setattr__(self, name, part)
        problems += filter(None, [_buffer_tokens_problem(self.row, self.policy)])
        if self.row is not None and self.policy is not None and self.policy.mode == "in_batch":
            problems += filter(None, _in_batch_problems(self.row, self.policy.micro_batch_size))
        problems += filter(None, _trainer_problems(
            self.row,
            micro_batch_size=None,
            global_batch_size=self.trainer.global_batch_size,
            data_parallel_size=None,
            mtp_num_layers=self.trainer.mtp_num_layers,
            cuda_graphs=self.trainer.cuda_graphs,
        ))
        _raise_if_problems("PackingConfig", problems)

    @property
    def pad_multiple(self) -> int:
        """Per-segment alignment in tokens (:attr:`RowLayout.pad_multiple`)."""
        return self.row.pad_multiple

    # ----------------------------------------------------------------------- (de)serialisation

    def to_dict(self) -> dict[str, Any]:
        """Flat mapping of every field, part after part; ``topology`` is a nested mapping."""
        return {key: value for name in CONFIG_PARTS for key, value in dataclasses.asdict(getattr(self, name)).items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PackingConfig:
        """Build from a flat mapping (as loaded from YAML); unknown or missing keys raise ValueError.

        Example: ``PackingConfig.from_dict({"seq_length": 4096, "topology": {"cp": 2}}).pad_multiple`` -> 4.
        """
        if not isinstance(data, Mapping):
            raise ValueError(
                f"packing config must be a mapping of field names to values, got {type(data).__name__}; "
                "fix: write the config as a YAML mapping such as 'seq_length: 8192'"
            )
        topology = data.get("topology")
        _raise_if_unknown_keys([
            _unknown_key_problem("PackingConfig", data.keys(), _PART_OF_KEY),
            _unknown_key_problem("topology", topology.keys(), _field_names(ParallelTopology))
            if isinstance(topology, Mapping) else None,
        ])
        required = [
            f.name for part in CONFIG_PARTS.values() for f in dataclasses.fields(part)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
        missing = [name for name in required if name not in data]
        if missing:
            raise ValueError(
                f"missing required PackingConfig key(s): {', '.join(missing)}; "
                "fix: add them, e.g. 'seq_length: 8192'"
            )
        values = dict(data)
        if "topology" in values and not isinstance(values["topology"], ParallelTopology):
            values["topology"] = ParallelTopology.from_dict(values["topology"])
        return cls(**values)

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str]) -> PackingConfig:
        """Load and validate a YAML config file; errors are prefixed with the file path."""
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(
                f"{os.fspath(path)}: not valid YAML ({exc}); fix: correct the YAML syntax"
            ) from exc
        if data is None:
            raise ValueError(
                f"{os.fspath(path)}: the config file is empty; fix: add at least 'seq_length: N'"
            )
        try:
            return cls.from_dict(data)
        except ValueError as exc:
            raise ValueError(f"{os.fspath(path)}: {exc}") from exc

    def to_yaml(self, path: str | os.PathLike[str] | None = None) -> str:
        """YAML text of ``to_dict()`` (field order kept); also written to ``path`` when given."""
        text = yaml.safe_dump(self.to_dict(), sort_keys=False)
        if path is not None:
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(text)
        return text

    # ----------------------------------------------------------------------- resume fingerprint

    def fingerprint(self) -> dict[str, Any]:
        """The values exact resume depends on, as plain JSON-able values: those of the row layout,
        the packing policy and the loader options (not the declared trainer settings).

        The loader extends this dict (world size, processor identity, pixel limits, ...)
        before storing it in the loader state; ``check_resume_fingerprint`` compares two.
        """
        return {**self.row.fingerprint(), **self.policy.fingerprint(), **self.loader.fingerprint()}


def _part_field(part: str, name: str) -> property:
    return property(lambda self: getattr(getattr(self, part), name), doc=f"``{part}.{name}``")


for _key, _part in _PART_OF_KEY.items():
    setattr(PackingConfig, _key, _part_field(_part, _key))


# --------------------------------------------------------------------------- resume check


class ResumeMismatchError(ValueError):
    """A loader state was saved under a different fingerprint; ``fields`` names the differences."""

    def __init__(self, message: str, fields: list[str]) -> None:
        super().__init__(message)
        self.fields = fields


def fingerprint_mismatches(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Sorted keys whose values differ, including keys present in only one mapping.

    Example: ``fingerprint_mismatches({"a": 1, "b": 2}, {"a": 1, "b": 3, "c": 0})`` -> ``["b", "c"]``.
    """
    keys = set(saved) | set(current)
    return sorted(k for k in keys if saved.get(k, _ABSENT) != current.get(k, _ABSENT))


def check_resume_fingerprint(
    saved: Mapping[str, Any], current: Mapping[str, Any], *, allow_inexact: bool = False
) -> None:
    """Raise ResumeMismatchError naming every differing field (saved vs current) unless ``allow_inexact``.

    With ``allow_inexact=True`` a mismatch is only logged as a warning.
    Example: saved ``{"buffer_size": 16}``, current ``{"buffer_size": 32}`` -> error naming buffer_size.
    """
    fields = fingerprint_mismatches(saved, current)
    if not fields:
        return

    def show(mapping: Mapping[str, Any], key: str) -> str:
        return repr(mapping[key]) if key in mapping else "<absent>"

    lines = [f"  - {key}: saved {show(saved, key)}, current {show(current, key)}" for key in fields]
    body = "\n".join(lines)
    if allow_inexact:
        _LOG.warning("inexact resume: the loader state was saved under a different configuration:\n%s", body)
        return
    raise ResumeMismatchError(
        "cannot resume exactly: the loader state was saved under a different configuration "
        f"({', '.join(fields)} differ):\n{body}\n"
        "fix: rebuild the loader with the saved configuration (same values as 'saved' above), "
        "or pass allow_inexact_resume=True to accept a non-exact continuation",
        fields,
    )


# --------------------------------------------------------------------------- trainer-side rules


def _trainer_problems(
    row: RowLayout | None,
    *,
    micro_batch_size: Any,
    global_batch_size: Any,
    data_parallel_size: Any,
    mtp_num_layers: Any,
    cuda_graphs: Any,
    pipeline_model_parallel_size: Any = 1,
    in_batch: int = 0,
) -> Iterator[str | None]:
    """The trainer-side rules for packed rows: one line per violated rule (None for rules that hold).

    ``micro_batch_size`` None skips its rule (a config's own, checked by ``PackingPolicy``);
    ``in_batch`` is k in mode "in_batch" (the trainer's micro-batch is then k samples in one
    row), else 0. ``data_parallel_size`` None means ``row.topology.dp``. Rules that need the row layout are
    skipped when ``row`` is None (an invalid layout, reported on its own).
    """
    topology = None if row is None else row.topology
    dp = topology.dp if data_parallel_size is None and topology is not None else data_parallel_size
    dp_problem = None if dp is None else _int_problem("data_parallel_size", dp, minimum=1)
    yield dp_problem
    if micro_batch_size is not None:
        yield (
            _in_batch_micro_batch_problem("micro_batch_size", micro_batch_size, in_batch)
            if in_batch
            else _micro_batch_problem("micro_batch_size", micro_batch_size)
        )
    if dp is not None and not dp_problem:
        yield _global_batch_problem("global_batch_size", global_batch_size, dp)
    yield _pipeline_problem("pipeline_model_parallel_size", pipeline_model_parallel_size)
    yield _mtp_problem("mtp_num_layers", mtp_num_layers)
    yield _bool_problem("cuda_graphs", cuda_graphs)
    if cuda_graphs is True and row is not None:
        yield _cuda_graph_problem("cuda_graphs", fixed_width=row.fixed_width, pad_cu_seqlens=row.pad_cu_seqlens)


def _per_token_loss_problems(
    row: RowLayout, *, finetune: bool, calculate_per_token_loss: Any, average_in_collective: Any
) -> Iterator[str]:
    """Per-token loss (loss and weight sums added over micro-batches and ranks, then divided) is
    needed by packed finetuning with CP > 1 and by the "sample" / "square" loss reductions."""
    cp = row.topology.cp
    reasons = []
    if finetune and cp > 1:
        reasons.append(
            f"packed finetuning with context parallel cp={cp} (CP ranks hold different numbers of loss tokens)"
        )
    if row.loss_reduction != "token":
        reasons.append(
            f"loss_reduction={row.loss_reduction!r} (its loss_mask weights give the intended mean only "
            "when sum(loss * loss_mask) and sum(loss_mask) are added over micro-batches and ranks before dividing)"
        )
    if not reasons:
        return
    why = " and ".join(reasons)
    if calculate_per_token_loss is not True:
        yield (
            f"calculate_per_token_loss={calculate_per_token_loss!r}: {why} needs per-token loss; "
            "fix: pass calculate_per_token_loss=True"
        )
    if average_in_collective is not False:
        yield (
            f"average_in_collective={average_in_collective!r}: {why} uses per-token loss, which the gradient "
            "averaging inside the collective would rescale; fix: pass average_in_collective=False"
        )


def check_training_compat(
    config: PackingConfig,
    *,
    finetune: bool = True,
    calculate_per_token_loss: bool,
    average_in_collective: bool,
    micro_batch_size: int = 1,
    global_batch_size: int | None = None,
    data_parallel_size: int | None = None,
    pipeline_model_parallel_size: int = 1,
    mtp_num_layers: int = 0,
    cuda_graphs: bool = False,
) -> None:
    """Check the trainer's settings against packed-row training; raise one ValueError listing all violations.

    ``global_batch_size`` / ``data_parallel_size`` default to the config's ``global_batch_size`` /
    ``topology.dp``. Per-token loss (``calculate_per_token_loss=True``,
    ``average_in_collective=False``) is needed with context parallel > 1 for packed finetuning
    (each CP rank sees a different number of loss tokens, so only summing losses and token counts
    before dividing weighs every token equally) and with ``loss_reduction`` "sample" or "square"
    (their ``loss_mask`` weights only average correctly that way). The same rules, less the
    loss flags a config cannot declare, check a config's declared trainer settings when it is built.
    Example: cp=2, finetune, calculate_per_token_loss=False -> ValueError naming calculate_per_token_loss.
    """
    problems = [
        *_trainer_problems(
            config.row,
            micro_batch_size=micro_batch_size,
            global_batch_size=config.global_batch_size if global_batch_size is None else global_batch_size,
            data_parallel_size=data_parallel_size,
            pipeline_model_parallel_size=pipeline_model_parallel_size,
            mtp_num_layers=mtp_num_layers,
            cuda_graphs=cuda_graphs,
            in_batch=config.micro_batch_size if config.mode == "in_batch" else 0,
        ),
        *_per_token_loss_problems(
            config.row,
            finetune=finetune,
            calculate_per_token_loss=calculate_per_token_loss,
            average_in_collective=average_in_collective,
        ),
    ]
    _raise_if_problems("training setup for packed rows", problems)
