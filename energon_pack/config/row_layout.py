"""``RowLayout``: how a packed row is laid out (width, alignment, segments, pixel dtype, loss weights).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from energon_pack.config.topology import ParallelTopology
from energon_pack.core.conversation import template_options_problem
from energon_pack.config.values import (
    NOT_FINGERPRINTED,
    bool_problem,
    choice_problem,
    fingerprint_fields,
    int_problem,
    next_multiple,
    raise_if_problems,
)

#: Accepted values of ``RowLayout.loss_reduction`` (weights: ``energon_pack.rows.loss_reduction``).
LOSS_REDUCTIONS: tuple[str, ...] = ("token", "sample", "square")

PIXEL_DTYPES: tuple[str, ...] = ("float32", "uint8")
#: What happens to a Qwen-Omni audio longer than ``max_audio_seconds``: keep its start, or skip the sample.
OVERLONG_AUDIO_POLICIES: tuple[str, ...] = ("trim", "skip")

#: Default ``max_image_pixels``: 2 * PIL's default ``Image.MAX_IMAGE_PIXELS`` (89,478,485), the
#: largest image Pillow opens at all (about 179 MP).
DEFAULT_MAX_IMAGE_PIXELS = 178_956_970
#: The image limit before ``max_image_pixels`` existed (PIL's ``Image.MAX_IMAGE_PIXELS``): at this
#: value the key stays out of the fingerprint, like the orientation when it is off.
LEGACY_MAX_IMAGE_PIXELS = 89_478_485


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
    apply_exif_orientation: turn images upright by their EXIF orientation (token counts from the
        header, orientations 5-8 swap the sides), exactly as ``transformers.image_utils.load_image``
        does; False: the stored pixels (sideways phone photos; how rows were built before this knob).
    max_image_pixels: images with more stored pixels (width * height) are skipped as
        ``pixel_bomb``; default 178,956,970 (2 * PIL's ``Image.MAX_IMAGE_PIXELS``, the most Pillow
        opens at all). Worker memory for the largest: docs/worker_memory.md.
    chat_template_kwargs: the dataset's chat template options, passed to every conversation's
        ``apply_chat_template`` (a record's own ``chat_template_kwargs`` win key by key), e.g.
        ``{"add_vision_id": True}`` (Qwen2.5-VL's official template, Qwen3-VL: "Picture 1: " before
        each image) or ``{"preserve_thinking": True}`` (Qwen3.6: earlier turns keep their thinking).
        An option the processor's template never reads is refused when the loader is built.
    max_audio_seconds: Qwen-Omni: seconds of an audio the model hears at most (None: the feature
        extractor's 300 s, what the Hugging Face processor keeps); must not exceed that.
    on_overlong_audio: Qwen-Omni: an audio over ``max_audio_seconds`` keeps its first
        ``max_audio_seconds`` ("trim", as the Hugging Face processor does at 300 s) or its sample
        is skipped as ``audio_too_long`` ("skip").
    """

    seq_length: int
    #: Enters the fingerprint through ``pad_multiple``.
    topology: ParallelTopology = field(default_factory=ParallelTopology, metadata=NOT_FINGERPRINTED)
    pad_to_multiple_of: int | None = field(default=None, metadata=NOT_FINGERPRINTED)
    width_multiple: int | None = None
    fixed_width: bool = True
    pad_cu_seqlens: bool = False
    max_segments: int | None = None
    pixel_dtype: Literal["float32", "uint8"] = "uint8"
    fast_jpeg_decode: bool = False
    loss_reduction: Literal["token", "sample", "square"] = "token"
    apply_exif_orientation: bool = True
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict, hash=False)  # a dict: RowLayout stays hashable
    max_audio_seconds: float | None = None
    on_overlong_audio: Literal["trim", "skip"] = "trim"

    def __post_init__(self) -> None:
        raise_if_problems(type(self).__name__, self.problems())

    @property
    def pad_multiple(self) -> int:
        """Per-segment alignment in tokens: ``pad_to_multiple_of`` if given, else ``topology.pad_multiple``.

        Example: ``RowLayout(seq_length=8192, topology=ParallelTopology(tp=4, sp=True))``
        -> ``pad_multiple == 4``.
        """
        return self.topology.pad_multiple if self.pad_to_multiple_of is None else self.pad_to_multiple_of

    def fingerprint(self) -> dict[str, Any]:
        """Resume-relevant values, the alignment multiple instead of the topology that derives it.

        Knobs added later enter only away from the behaviour before they existed, so an absent key
        in a saved state means that behaviour: ``fast_jpeg_decode`` only when set;
        ``apply_exif_orientation`` only when on (rows were built from the stored pixels before, so
        a state saved then resumes exactly only with ``apply_exif_orientation=False``);
        ``max_image_pixels`` unless it is 89,478,485 (the limit then); ``chat_template_kwargs``
        only when set; the Qwen-Omni audio knobs only away from their defaults. See `media_fingerprint`.
        """
        values = {**fingerprint_fields(self), "pad_multiple": self.pad_multiple}
        for name in ("fast_jpeg_decode", "apply_exif_orientation", "max_image_pixels", "chat_template_kwargs",
                     "max_audio_seconds", "on_overlong_audio"):
            del values[name]
        if self.fast_jpeg_decode:
            values["fast_jpeg_decode"] = True
        return {**values, **self.media_fingerprint()}

    def media_fingerprint(self) -> dict[str, Any]:
        """The media knobs and template options that change which samples a row holds (token counts,
        skips), each only when it differs from the behaviour before it existed (resume and plan
        fingerprints take them; ``chat_template_kwargs`` only when set).

        Example: ``RowLayout(seq_length=8192).media_fingerprint()`` -> ``{"apply_exif_orientation":
        True, "max_image_pixels": 178956970}``; with ``apply_exif_orientation=False,
        max_image_pixels=89478485`` -> ``{}``.
        """
        values: dict[str, Any] = {}
        if self.apply_exif_orientation:
            values["apply_exif_orientation"] = True
        if self.max_image_pixels != LEGACY_MAX_IMAGE_PIXELS:
            values["max_image_pixels"] = self.max_image_pixels
        if self.chat_template_kwargs:
            values["chat_template_kwargs"] = dict(sorted(self.chat_template_kwargs.items()))
        if self.max_audio_seconds is not None:
            values["max_audio_seconds"] = self.max_audio_seconds
        if self.on_overlong_audio != "trim":
            values["on_overlong_audio"] = self.on_overlong_audio
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
        yield int_problem("max_segments", self.max_segments, minimum=1, optional=True)
        for name in ("fixed_width", "pad_cu_seqlens"):
            yield bool_problem(name, getattr(self, name))
        if self.pad_cu_seqlens is True and (self.fixed_width is not True or self.max_segments is None):
            yield (
                f"pad_cu_seqlens=True: needs fixed_width=True and max_segments set (got "
                f"fixed_width={self.fixed_width!r}, max_segments={self.max_segments!r}), since the "
                "cu_seqlens tensors are padded to length max_segments + 1; fix: set fixed_width: "
                "true and max_segments: N (e.g. 64), or pad_cu_seqlens: false"
            )
        yield choice_problem("pixel_dtype", self.pixel_dtype, PIXEL_DTYPES)
        yield bool_problem("fast_jpeg_decode", self.fast_jpeg_decode)
        yield bool_problem("apply_exif_orientation", self.apply_exif_orientation)
        yield int_problem("max_image_pixels", self.max_image_pixels, minimum=1)
        yield template_options_problem(self.chat_template_kwargs)
        if self.max_audio_seconds is not None and (
            isinstance(self.max_audio_seconds, bool) or not isinstance(self.max_audio_seconds, (int, float))
            or not self.max_audio_seconds > 0
        ):
            yield f"max_audio_seconds={self.max_audio_seconds!r}: must be a positive number of seconds or null (the model's 300 s)"
        yield choice_problem("on_overlong_audio", self.on_overlong_audio, OVERLONG_AUDIO_POLICIES)
        yield choice_problem("loss_reduction", self.loss_reduction, LOSS_REDUCTIONS)

    def _width_problems(self, topology_ok: bool) -> Iterator[str | None]:
        """Rules on seq_length, pad_to_multiple_of and width_multiple (skipping ones with bad inputs)."""
        seq_problem = int_problem("seq_length", self.seq_length, minimum=1)
        pad_problem = int_problem("pad_to_multiple_of", self.pad_to_multiple_of, minimum=1, optional=True)
        width_problem = int_problem("width_multiple", self.width_multiple, minimum=1, optional=True)
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
                f"fix: set seq_length to e.g. {next_multiple(self.seq_length, multiple)}"
            )
        elif not width_problem and self.width_multiple is not None and self.seq_length % self.width_multiple:
            both = math.lcm(self.width_multiple, multiple)
            yield (
                f"width_multiple={self.width_multiple}: seq_length={self.seq_length} must be divisible "
                f"by width_multiple; fix: set seq_length to a multiple of {both}, e.g. "
                f"{next_multiple(self.seq_length, both)}"
            )
