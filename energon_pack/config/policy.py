"""``PackingPolicy``: how the packing stage chooses bins (rounds, waiting, fill, per-row vision limits, mode).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from energon_pack.config.blend import BLEND_SCHEDULE_MODES, BLEND_UNITS, BlendPoint, blend_point, schedule_problems
from energon_pack.config.values import NOT_FINGERPRINTED, choice_problem, fingerprint_fields, int_problem, raise_if_problems

OVERLONG_POLICIES: tuple[str, ...] = ("skip", "error", "shrink")


#: ``online``: per-worker bin selection into rows of W; ``in_batch``: one row of every k samples.
PACKING_MODES: tuple[str, ...] = ("online", "in_batch")


def micro_batch_problem(name: str, value: Any) -> str | None:
    """Packing emits one packed row per micro-batch, so the micro-batch size must be exactly 1."""
    if isinstance(value, int) and not isinstance(value, bool) and value == 1:
        return None
    return (
        f"{name}={value!r}: packing emits one packed THD row per micro-batch, so the micro-batch "
        f"size must be 1; fix: set {name}=1 and raise the global batch size "
        "(gradient accumulation) instead, or set mode: in_batch to pack every k samples into one row"
    )


#: Rows of tokens per round when neither ``buffer_size`` nor ``buffer_tokens`` is given: a round runs
#: once the new samples hold ``DEFAULT_ROUND_ROWS * seq_length`` aligned tokens (>= 99 % fill at every
#: width from 4096 to 32768 on the reference mix; 16 samples, the default before, fell to 96.5 % at 32768).
DEFAULT_ROUND_ROWS = 2

#: Rows of tokens per default round under a share blend of tokens or supervised tokens: the samples
#: the packing stage holds between a draw and its row swing with the round, and a 25-row window's
#: share swings with them (docs/configuration.md, "Windows of rows"); one row halves that at no
#: fill cost measured (0.9998-1.0000 on the test blend).
TOKEN_BLEND_ROUND_ROWS = 1

#: What states saved before the default round changed hold: 16 samples per round.
OLD_DEFAULT_BUFFER_SIZE = 16

#: Rows per worker of online balanced steps' pool (``balance_window_rows``). The pool holds restore
#: keys, not samples, so its size costs no memory; 1024 rows leave DP4 x 2 real loaders 0.0024-0.0027
#: over their rank floor (windows of 256: 0.0037-0.0040) and simulate's DP64 x 1 at 1.007 (windows
#: of 256: 1.017); what it costs is N rows' headers read while the pool fills (docs/balanced_steps.md).
DEFAULT_BALANCE_WINDOW_ROWS = 1024

#: What online balanced states saved before the window default changed hold: 256 rows a window.
OLD_DEFAULT_BALANCE_WINDOW_ROWS = 256

#: The blend settings at their defaults (left out of the fingerprint, as they change no row).
BLEND_DEFAULTS: dict[str, Any] = {"blend_unit": "samples", "blend_schedule": None, "blend_schedule_mode": "step"}


@dataclass(frozen=True, kw_only=True)
class PackingPolicy:
    """How the packing stage chooses bins.

    A selection round runs on the samples that arrived since the last round (plus the pending
    groups); exactly one of two settings says when:

    buffer_size: after this many new samples.
    buffer_tokens: after the new samples hold at least this many aligned tokens (a multiple of
        ``seq_length``, e.g. ``2 * seq_length``): one setting keeps rounds meaningful across row
        widths and across mixes of short and long samples. Set it with ``buffer_size`` unset.
        Neither set (the default): ``DEFAULT_ROUND_ROWS * seq_length`` = 2 * seq_length tokens
        (:meth:`resolved_round`).
    max_wait_rounds: most buffer rounds an under-filled bin is held back as a pending group.
    min_fill: fill fraction in (0, 1] at which a bin is emitted without waiting.
    max_row_vision_patches: most ViT input patches per row (sum of t*h*w over the row's image and
        video grids, before the 2x2 merge); None = no limit.
    max_row_media: most images + videos per row; None = no limit.
    max_row_audio_frames: Qwen-Omni: most log-mel feature frames per row (what the audio encoder
        reads: ``row_cost["audio_frames"]``, 100 a second at hop 160, 16 kHz); None = no limit.
        In the resume fingerprint only when set.
    on_overlong: a sample that fits no row (longer than ``seq_length`` after alignment, or over a
        per-row vision limit) is skipped (counted), raises, or is shrunk ("shrink": its images'
        pixel budget, then its videos' frame count, lowered to the largest setting that fits;
        skipped when even the processor's minimum does not fit, or when it has more media than
        ``max_row_media``; Qwen-Omni sounds are never cut, and videos heard with their sound keep
        their frames: docs/omni.md).
    mode: "online" packs rows of W per worker (bin selection with pending groups); "in_batch" packs
        every ``micro_batch_size`` consecutive samples into one variable-width row (needs
        ``fixed_width=False``; ``seq_length`` and the vision limits cap each sample). A pack plan
        (``get_packing_loader(plan=...)``) replaces online selection under the same budgets.
    micro_batch_size: samples per micro-batch: 1 in mode "online" (one packed row per micro-batch);
        k >= 2 in mode "in_batch" (one row of k samples per micro-batch).
    max_consecutive_skips: raise ``TooManyBadSamplesError`` when one worker meets more bad samples
        in a row than this (None, the default: skip and count bad samples without limit). Not in
        the resume fingerprint: a run stopped by the limit resumes under a raised limit.
    cost_model: the model whose FLOPs rows are costed with (``energon_pack.rows.flops``): a preset
        name (``qwen2.5-vl-7b``, ``qwen3-vl-30b-a3b``, ...) or the path of the model's
        ``config.json`` (or its folder); rows then report ``row_cost["flops"]`` (None: no cost model).
    frozen_vision: the vision tower is frozen (no backward through it) in the cost model.
    balance_steps: ``energon-pack plan`` balances rows toward equal modelled cost and the plan
        loader deals each step's rows to ranks by cost (needs ``cost_model``; see
        ``docs/balanced_steps.md``).
    balance_window_steps: steps per cost window of a balanced plan's stream: inside a window the
        rows are sorted by cost and cut into steps, so a step holds rows of similar cost (1: no
        windows, dealing only).
    balance_window_rows: rows per worker window of the online loader's balanced steps
        (``balance_steps`` without a plan): a worker plans this many rows, ranks them by cost and
        emits them in a layout every rank shares (rounded up to whole steps; more rows: steadier
        steps, and more samples' headers read before a worker's second window starts; a window
        holds restore keys, not samples; see ``docs/balanced_steps.md``).
    The last five are not in the online resume fingerprint (they change no online row); a plan
    built with ``balance_steps`` records them in its fingerprint.
    blend_unit: what the weights of a metadataset's blend are shares of: ``samples`` (Energon's
        meaning, the default), ``tokens`` (real row tokens) or ``supervised_tokens`` (tokens with
        loss); see docs/configuration.md, "Blends". A plain dataset ignores it.
    blend_schedule: blend weights that change over training: points ``{step: S, weights: [...]}``
        (one weight per blend entry, metadataset order), the first at step 0, steps increasing; a
        step is a global training step of ``micro_batches_per_step`` rows per data-parallel rank.
        None: the metadataset's weights throughout.
    blend_schedule_mode: ``step`` holds each point's weights until the next point; ``linear``
        interpolates between points.
    The blend settings enter the resume fingerprint only when they differ from their defaults.
    """

    buffer_size: int | None = None
    buffer_tokens: int | None = None
    max_wait_rounds: int = 4
    min_fill: float = 0.99
    max_row_vision_patches: int | None = None
    max_row_media: int | None = None
    max_row_audio_frames: int | None = None
    on_overlong: Literal["skip", "error", "shrink"] = "skip"
    mode: Literal["online", "in_batch"] = "online"
    micro_batch_size: int = 1
    max_consecutive_skips: int | None = field(default=None, metadata=NOT_FINGERPRINTED)
    cost_model: str | None = field(default=None, metadata=NOT_FINGERPRINTED)
    frozen_vision: bool = field(default=False, metadata=NOT_FINGERPRINTED)
    balance_steps: bool = field(default=False, metadata=NOT_FINGERPRINTED)
    balance_window_steps: int = field(default=16, metadata=NOT_FINGERPRINTED)
    balance_window_rows: int = field(default=DEFAULT_BALANCE_WINDOW_ROWS, metadata=NOT_FINGERPRINTED)
    blend_unit: Literal["samples", "tokens", "supervised_tokens"] = "samples"
    blend_schedule: tuple[BlendPoint, ...] | None = None
    blend_schedule_mode: Literal["step", "linear"] = "step"

    def __post_init__(self) -> None:
        if isinstance(self.min_fill, int) and not isinstance(self.min_fill, bool):
            object.__setattr__(self, "min_fill", float(self.min_fill))
        if isinstance(self.blend_schedule, (list, tuple)):  # the YAML form: a list of mappings
            object.__setattr__(self, "blend_schedule", tuple(blend_point(p) for p in self.blend_schedule))
        raise_if_problems(type(self).__name__, self.problems())

    def resolved_round(self, seq_length: int, *, token_blend: bool = False) -> dict[str, int | None]:
        """When a round runs at row width ``seq_length``: ``buffer_size`` / ``buffer_tokens`` as set,
        or by default ``DEFAULT_ROUND_ROWS * seq_length`` tokens (``TOKEN_BLEND_ROUND_ROWS *
        seq_length`` when ``token_blend``: the rows come from a share blend of tokens or supervised tokens).

        Example: ``PackingPolicy().resolved_round(8192)`` -> ``{"buffer_size": None, "buffer_tokens": 16384}``;
        with ``token_blend=True`` -> ``{"buffer_size": None, "buffer_tokens": 8192}``;
        ``PackingPolicy(buffer_size=16).resolved_round(8192)`` -> ``{"buffer_size": 16, "buffer_tokens": None}``.
        """
        if self.buffer_size is None and self.buffer_tokens is None:
            rows = TOKEN_BLEND_ROUND_ROWS if token_blend else DEFAULT_ROUND_ROWS
            return {"buffer_size": None, "buffer_tokens": rows * seq_length}
        return {"buffer_size": self.buffer_size, "buffer_tokens": self.buffer_tokens}

    def fingerprint(self) -> dict[str, Any]:
        """Resume-relevant values (``buffer_tokens`` only when set, so that states saved before it
        existed still resume; ``PackingConfig.fingerprint`` adds the resolved default round)."""
        values = fingerprint_fields(self)
        for name in ("buffer_tokens", "max_row_audio_frames"):  # states saved before they existed still resume
            if values[name] is None:
                del values[name]
        for name, default in BLEND_DEFAULTS.items():  # states saved before blends existed still resume
            if values[name] == default:
                del values[name]
        if self.blend_schedule is not None:
            values["blend_schedule"] = [point.to_dict() for point in self.blend_schedule]
        return values

    def blend_problems(self) -> Iterator[str | None]:
        """The blend settings' rules (one line per violated rule)."""
        yield choice_problem("blend_unit", self.blend_unit, BLEND_UNITS)
        yield from schedule_problems(self.blend_schedule)
        yield choice_problem("blend_schedule_mode", self.blend_schedule_mode, BLEND_SCHEDULE_MODES)

    def problems(self) -> Iterator[str | None]:
        """One line per violated rule (None for rules that hold)."""
        if self.buffer_size is not None and self.buffer_tokens is not None:
            yield (
                f"buffer_size={self.buffer_size!r}, buffer_tokens={self.buffer_tokens!r}: a round runs after "
                "buffer_size new samples or after buffer_tokens new tokens, not both; fix: keep one of them "
                "and set the other to null (None)"
            )
        yield int_problem("buffer_size", self.buffer_size, minimum=1, optional=True)
        yield int_problem("buffer_tokens", self.buffer_tokens, minimum=1, optional=True)
        yield int_problem("max_wait_rounds", self.max_wait_rounds, minimum=0)
        if not isinstance(self.min_fill, float) or not 0.0 < self.min_fill <= 1.0:  # bools are not floats
            yield (
                f"min_fill={self.min_fill!r}: must be a number in (0, 1] (fraction of seq_length); "
                "fix: set min_fill to e.g. 0.99"
            )
        yield int_problem("max_row_vision_patches", self.max_row_vision_patches, minimum=1, optional=True)
        yield int_problem("max_row_media", self.max_row_media, minimum=1, optional=True)
        yield int_problem("max_row_audio_frames", self.max_row_audio_frames, minimum=1, optional=True)
        yield choice_problem("on_overlong", self.on_overlong, OVERLONG_POLICIES)
        yield choice_problem("mode", self.mode, PACKING_MODES)
        if self.mode == "in_batch":
            problem = int_problem("micro_batch_size", self.micro_batch_size, minimum=2)
            yield problem and problem.replace("must be", "in mode 'in_batch' (k samples per row) must be")
            for name in ("max_row_vision_patches", "max_row_media", "max_row_audio_frames"):
                if getattr(self, name) is not None:
                    yield (
                        f"{name}={getattr(self, name)}: mode 'in_batch' puts every micro_batch_size consecutive "
                        f"samples in one row whatever their media, so it cannot keep a per-row limit; fix: remove "
                        f"{name}, or use mode: online (or a pack plan) to pack within it"
                    )
        else:
            yield micro_batch_problem("micro_batch_size", self.micro_batch_size)
        yield int_problem("max_consecutive_skips", self.max_consecutive_skips, minimum=1, optional=True)
        if self.cost_model is not None and (not isinstance(self.cost_model, str) or not self.cost_model):
            yield (
                f"cost_model={self.cost_model!r}: must be a preset name or the path of a model's config.json; "
                "fix: e.g. cost_model: qwen2.5-vl-7b"
            )
        for name in ("frozen_vision", "balance_steps"):
            if not isinstance(getattr(self, name), bool):
                yield f"{name}={getattr(self, name)!r}: must be true or false; fix: set {name}: true or false"
        yield int_problem("balance_window_steps", self.balance_window_steps, minimum=1)
        yield int_problem("balance_window_rows", self.balance_window_rows, minimum=1)
        yield from self.blend_problems()
        if self.balance_steps is True and self.cost_model is None:
            yield (
                "balance_steps=True needs cost_model: rows are balanced by modelled FLOPs; fix: set cost_model "
                "to a preset (e.g. qwen2.5-vl-7b) or the path of the model's config.json"
            )
