"""Visual payload of a packed row (Qwen-VL pixel patches and grids) and patch normalisation.

A row may carry its pixels as ``uint8`` patches (4x smaller to buffer, pin and copy than
float32); they are normalised to float32 on the training device with
:func:`normalize_patches`, which reproduces the Hugging Face Qwen image/video processors
bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace

import torch

__all__ = ["MODEL_INPUT_FIELDS", "VisualInputs", "normalize_patches"]

#: Field names handed to the model, in this order, by ``VisualInputs.normalized_for_model``.
MODEL_INPUT_FIELDS = (
    "pixel_values",
    "image_grid_thw",
    "pixel_values_videos",
    "video_grid_thw",
    "second_per_grid_ts",
)
_PIXEL_FIELDS = ("pixel_values", "pixel_values_videos")
_CONSTANT_FIELDS = ("image_mean", "image_std", "rescale_factor")


def normalize_patches(
    patches: torch.Tensor,
    mean: Sequence[float] | torch.Tensor,
    std: Sequence[float] | torch.Tensor,
    rescale_factor: float | torch.Tensor,
    channels: int = 3,
) -> torch.Tensor:
    """Rescale and normalise uint8 patches [P, C*T*p*p] to float32 [P, C*T*p*p], on their device.

    Same arithmetic as the Hugging Face fast (torchvision) image processors, which fuse
    rescale + normalise as ``(x - mean/rescale_factor) / (std/rescale_factor)`` per channel,
    in float32. A patchified row is laid out [C, T, p, p], so column j belongs to channel
    ``j // (D // C)``. The constants may be Python numbers or tensors on any device (moved to
    the patches' device, no host sync); keep ``rescale_factor`` in float64 to stay exact.

    Example: one patch of D=6 (C=3, 2 values per channel), mean=(0.5,)*3, std=(0.5,)*3,
    rescale_factor=1/255: ``[[0, 255, 0, 255, 0, 255]] -> [[-1., 1., -1., 1., -1., 1.]]``.
    """
    if patches.dim() != 2:
        raise ValueError(
            f"patches has shape {tuple(patches.shape)}: patches must be 2-D [P, C*T*p*p]; "
            "fix: pass patchified pixels as produced by the Qwen processor"
        )
    device = patches.device
    mean_t = torch.as_tensor(mean, dtype=torch.float32).to(device, non_blocking=True).reshape(-1)
    std_t = torch.as_tensor(std, dtype=torch.float32).to(device, non_blocking=True).reshape(-1)
    if mean_t.numel() != channels or std_t.numel() != channels:
        raise ValueError(
            f"mean has {mean_t.numel()} values and std {std_t.numel()}: both need one value per channel "
            f"(channels={channels}); fix: pass the processor's image_mean and image_std"
        )
    width = patches.shape[1]
    if width % channels != 0:
        raise ValueError(
            f"patch width {width} is not divisible by channels={channels}: the layout must be [C, T, p, p]; "
            "fix: pass channels matching the patchified payload"
        )
    per_channel = width // channels
    # 1 / rescale_factor in float64, as the HF processors compute it from a Python float.
    scale = 1.0 / torch.as_tensor(rescale_factor, dtype=torch.float64).to(device, non_blocking=True)
    mean_cols = (mean_t * scale).repeat_interleave(per_channel)
    std_cols = (std_t * scale).repeat_interleave(per_channel)
    # In place on one float32 copy: the same two roundings as ``(x - m) / s``, one [P, D] buffer.
    return patches.to(torch.float32, copy=True).sub_(mean_cols).div_(std_cols)


@dataclass(frozen=True, kw_only=True)
class VisualInputs:
    """Qwen-VL visual payload of one packed row; every field is a tensor or None (None when absent).

    pixel_values: [P_img, C*T*p*p] float32 (model-ready) or uint8 (needs normalisation);
    image_grid_thw: int64 [n_img, 3]; pixel_values_videos: [P_vid, C*T*p*p] float32 or uint8;
    video_grid_thw: int64 [n_vid, 3]; second_per_grid_ts: float32 [n_vid] (seconds per temporal
    grid step, Qwen2.5-VL). image_mean / image_std (float32 [C], as the HF processors hold them)
    and rescale_factor (float64, 0-dim, e.g. 1/255: float32 would round 1/rescale_factor to
    254.99998 instead of 255) describe a uint8 payload and are None for float payloads;
    sequences and numbers given for them are stored as such tensors. Images and videos share one set of
    constants (true for the released Qwen-VL processors).

    Because every value is a tensor or None, Megatron-Bridge's ``vlm_step`` (which moves each
    ``__dict__`` value with ``.cuda()``) carries a uint8 row to the GPU as is, and
    :meth:`normalized_for_model` then normalises it there, equal to the float32 payload.
    """

    pixel_values: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None
    pixel_values_videos: torch.Tensor | None = None
    video_grid_thw: torch.Tensor | None = None
    second_per_grid_ts: torch.Tensor | None = None
    image_mean: torch.Tensor | None = None
    image_std: torch.Tensor | None = None
    rescale_factor: torch.Tensor | None = None

    def __post_init__(self) -> None:
        for pixels, grid in (("pixel_values", "image_grid_thw"), ("pixel_values_videos", "video_grid_thw")):
            if (getattr(self, pixels) is None) != (getattr(self, grid) is None):
                raise ValueError(
                    f"{pixels} and {grid} must be given together (got {pixels} "
                    f"{'None' if getattr(self, pixels) is None else 'set'}, {grid} "
                    f"{'None' if getattr(self, grid) is None else 'set'}); fix: pass both or neither"
                )
        if self.second_per_grid_ts is not None and self.video_grid_thw is None:
            raise ValueError(
                "second_per_grid_ts is set but there is no video: it has one entry per video; "
                "fix: leave second_per_grid_ts None for rows without videos"
            )
        constants = (self.image_mean, self.image_std, self.rescale_factor)
        if any(c is None for c in constants) and any(c is not None for c in constants):
            raise ValueError(
                f"image_mean={self.image_mean}, image_std={self.image_std}, rescale_factor={self.rescale_factor}: "
                "the normalisation constants go together; fix: set all three (uint8 payload) or none (float payload)"
            )
        if self.is_uint8 and self.rescale_factor is None:
            raise ValueError(
                "uint8 pixel payload without normalisation constants; "
                "fix: pass image_mean, image_std and rescale_factor from the processor"
            )
        if self.image_mean is not None:
            mean = torch.as_tensor(self.image_mean, dtype=torch.float32).reshape(-1)
            std = torch.as_tensor(self.image_std, dtype=torch.float32).reshape(-1)
            rescale = torch.as_tensor(self.rescale_factor, dtype=torch.float64)
            if mean.shape != std.shape or rescale.numel() != 1:
                raise ValueError(
                    f"image_mean has {mean.numel()} values, image_std {std.numel()}, rescale_factor "
                    f"{rescale.numel()}: mean and std need one value per channel and rescale_factor one value; "
                    "fix: pass the processor's image_mean, image_std and rescale_factor"
                )
            object.__setattr__(self, "image_mean", mean)
            object.__setattr__(self, "image_std", std)
            object.__setattr__(self, "rescale_factor", rescale.reshape(()))

    @property
    def is_uint8(self) -> bool:
        """True when any pixel field holds uint8 patches that still need normalisation."""
        pixels = (getattr(self, name) for name in _PIXEL_FIELDS)
        return any(t is not None and t.dtype == torch.uint8 for t in pixels)

    def normalized_for_model(self) -> dict[str, torch.Tensor]:
        """Model forward kwargs: the non-None fields of MODEL_INPUT_FIELDS, pixels as float32.

        uint8 pixels are normalised with :func:`normalize_patches` on the device they live on,
        so call this after ``to(device)``. Example: a text-only row -> ``{}``.
        """
        out: dict[str, torch.Tensor] = {}
        for name in MODEL_INPUT_FIELDS:
            value = getattr(self, name)
            if value is None:
                continue
            if name in _PIXEL_FIELDS and value.dtype == torch.uint8:
                value = normalize_patches(
                    value, self.image_mean, self.image_std, self.rescale_factor, channels=self.image_mean.numel()
                )
            out[name] = value
        return out

    def pin_memory(self) -> VisualInputs:
        """Copy with every tensor in page-locked host memory (needs an accelerator)."""
        return self._map_tensors(lambda t: t.pin_memory())

    def to(self, device: torch.device | str, non_blocking: bool = False) -> VisualInputs:
        """Copy with every tensor on ``device`` (dtypes unchanged)."""
        return self._map_tensors(lambda t: t.to(device, non_blocking=non_blocking))

    @classmethod
    def concat(cls, parts: Sequence[VisualInputs]) -> VisualInputs:
        """Concatenate payloads in row order (patches and grids along dim 0).

        A field is None when it is None in every part. Parts that are consecutive slices filling one
        tensor (a row payload from ``allocate_row_pixels``) join into that tensor without a copy. Parts must agree on pixel dtypes and on
        the normalisation constants (text-only parts carry none and match anything).
        Example: concat([1 image of 4 patches, text only, 1 image of 8 patches]) -> 12 patches, grid [2, 3].
        """
        tensors: dict[str, torch.Tensor | None] = {}
        for name in MODEL_INPUT_FIELDS:
            present = [getattr(p, name) for p in parts if getattr(p, name) is not None]
            dtypes = sorted({str(t.dtype) for t in present})
            if len(dtypes) > 1:
                raise ValueError(
                    f"{name} mixes dtypes {dtypes} across samples of one row; "
                    "fix: produce every sample's pixels with the same payload dtype"
                )
            tensors[name] = _joined(present) if present else None
        carrying = [p for p in parts if p.rescale_factor is not None]
        first = carrying[0] if carrying else cls()
        for part in carrying[1:]:
            if not all(torch.equal(getattr(part, name), getattr(first, name)) for name in _CONSTANT_FIELDS):
                raise ValueError(
                    "samples of one row carry different normalisation constants "
                    f"({[getattr(first, name).tolist() for name in _CONSTANT_FIELDS]} vs "
                    f"{[getattr(part, name).tolist() for name in _CONSTANT_FIELDS]}); "
                    "fix: pack samples produced by one processor only"
                )
        return cls(**tensors, **{name: getattr(first, name) for name in _CONSTANT_FIELDS})

    def _map_tensors(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> VisualInputs:
        changes = {
            f.name: fn(getattr(self, f.name))
            for f in fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return replace(self, **changes)


def _joined(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """``torch.cat(parts)``, or, when the parts are consecutive row slices that exactly fill one
    contiguous tensor, that tensor itself (same values, no copy).

    Example: ``payload = torch.zeros(6, 2)``; ``_joined([payload[:2], payload[2:]]) is payload``.
    """
    base = parts[0]._base
    if base is not None and base.is_contiguous() and all(part._base is base for part in parts):
        row_bytes = base.stride(0) * base.element_size()
        position = base.data_ptr()
        for part in parts:
            if not part.is_contiguous() or part.data_ptr() != position or part.shape[1:] != base.shape[1:]:
                break
            position += part.shape[0] * row_bytes
        else:
            if position == base.data_ptr() + base.shape[0] * row_bytes:
                return base
    return torch.cat(parts, dim=0)
