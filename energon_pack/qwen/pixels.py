"""Pixel path (postencode): decode media and run the processor's own image/video processors.

Only the samples of a bin being emitted come here. Outputs are exactly the Hugging Face
processor's ``pixel_values`` / ``pixel_values_videos`` and grids, because the processor's own
image and video processors do the resizing, rescaling, normalising and patchifying. With
``uint8=True`` the rescale/normalise step is left to the device (``energon_pack.core.visual``):
the payload is the resized, patchified uint8 pixels, 4x smaller than float32.

Memory: media are decoded and patchified one image / one video at a time (each decoded
image or frame stack is freed before the next is decoded), and the patches are written
straight into the row's preallocated payload (:func:`allocate_row_pixels`: one tensor per
row and media kind, in shared memory inside a loader worker so that handing the row to the
main process copies nothing), instead of one tensor per sample concatenated afterwards.
"""

from __future__ import annotations

import abc
import io
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from energon_pack.errors import BadSampleError
from energon_pack.core.stage_times import timed
from energon_pack.qwen.template import VideoTiming


def decode_image(
    data: bytes, *, draft_size: tuple[int, int] | None = None, apply_exif_orientation: bool = True
) -> Any:
    """Open and fully decode one image (PIL, first frame, original mode), turned upright by its EXIF
    orientation as ``transformers.image_utils.load_image`` does (``ImageOps.exif_transpose``; TIFFs
    Pillow orients itself); corrupt or truncated data is a bad sample. The mode is kept, so the
    processor's ``convert_to_rgb`` composites transparency on white.

    With ``draft_size`` (upright width, height), a JPEG at least twice that size on each side is
    decoded at the largest of 1/2, 1/4, 1/8 scale that stays at least ``draft_size`` (DCT-domain
    downscale, PIL ``Image.draft``, in the stored orientation), then resized to exactly
    ``draft_size`` (bicubic). Other images decode as is.
    Example: a 4000x3000 JPEG with ``draft_size=(980, 728)`` decodes at 1000x750, then 980x728; a
    64x22 JPEG with EXIF orientation 6 decodes to a 22x64 image (64x22 with
    ``apply_exif_orientation=False``).
    """
    from PIL import Image, ImageOps

    from energon_pack.qwen.media import SWAPPING_ORIENTATIONS, header_orientation

    try:
        image = Image.open(io.BytesIO(data))
        drafted = False
        if draft_size is not None and image.format == "JPEG":
            stored = draft_size
            if apply_exif_orientation and header_orientation(image, data) in SWAPPING_ORIENTATIONS:
                stored = (draft_size[1], draft_size[0])
            drafted = 2 * stored[0] <= image.width and 2 * stored[1] <= image.height
            if drafted:
                image.draft(image.mode, stored)
        image.load()
        if apply_exif_orientation:
            ImageOps.exif_transpose(image, in_place=True)
        if drafted and image.size != draft_size:
            image = image.resize(draft_size, Image.BICUBIC)
    except Image.DecompressionBombError as err:
        raise BadSampleError("pixel_bomb", str(err)) from None
    except Exception as err:  # PIL raises OSError, SyntaxError, ValueError... on bad data
        raise BadSampleError("corrupt_image", f"cannot decode image: {err}") from None
    return image


def decode_video_frames(
    data: bytes, frame_indices: Sequence[int], total_frames: int, *, seek: bool = True, threads: int = 1
) -> np.ndarray:
    """Decode the frames at ``frame_indices`` (increasing) of the first video stream as RGB uint8 [n, H, W, 3].

    The frames of :func:`qwen.frames.sampled_frames` (``seek``: past stretches no sampled frame
    needs, when that is exact; ``threads``: FFmpeg decoder threads). The stream must hold
    ``total_frames`` frames (what preencode counted); otherwise the sample is a bad sample
    (``media_mismatch``, or ``corrupt_video`` when decoding fails); ``seek=False`` decodes and
    counts every frame (``prepare --verify-media``).
    Example: ``decode_video_frames(<30-frame clip>, [0, 29], 30)`` -> uint8 [2, H, W, 3].
    """
    from energon_pack.qwen.frames import sampled_frames

    # Filled in place (allocated at the first sampled frame): no list of frames, then a stacked copy.
    frames: np.ndarray | None = None
    for position, frame in sampled_frames(data, frame_indices, total_frames, threads=threads, seek=seek):
        rgb = frame.to_ndarray(format="rgb24")
        if frames is None:
            frames = np.empty((len(frame_indices), *rgb.shape), dtype=np.uint8)
        frames[position] = rgb
    assert frames is not None  # total_frames >= 1 frames decoded, frame_indices within them
    return frames


def frame_list_frames(frames: Sequence[bytes], frame_indices: Sequence[int]) -> Iterator[tuple[int, np.ndarray]]:
    """Decode the frames at ``frame_indices`` of a frame-list video (encoded images) one at a time:
    ``(position in frame_indices, RGB uint8 [H, W, 3])`` (no EXIF orientation: frames are used as
    stored); a frame that does not decode, or has another size than the first, is a bad sample
    (``corrupt_image`` / ``media_mismatch``).

    Example: three 4x2 PNG frames, ``frame_indices=[0, 2]`` -> ``(0, [2, 4, 3])``, ``(1, [2, 4, 3])``.
    """
    from PIL import Image

    first_shape = None
    for position, index in enumerate(frame_indices):
        try:
            with Image.open(io.BytesIO(frames[index])) as image:
                rgb = np.array(image.convert("RGB"))  # writable: the resize reads it as a tensor
        except Exception as err:  # PIL raises OSError, SyntaxError, ValueError... on bad data
            raise BadSampleError("corrupt_image", f"cannot decode frame {index}: {err}") from None
        first_shape = first_shape or rgb.shape
        if rgb.shape != first_shape:
            raise BadSampleError("media_mismatch", f"frame {index} decodes to {rgb.shape[:2]}, frame 0 to {first_shape[:2]}")
        yield position, rgb


def decode_frame_list(frames: Sequence[bytes], frame_indices: Sequence[int]) -> np.ndarray:
    """The frames of :func:`frame_list_frames` stacked as RGB uint8 [n, H, W, 3]."""
    return np.stack([rgb for _, rgb in frame_list_frames(frames, frame_indices)])


def _sampled_rgb_frames(
    data: bytes | Sequence[bytes], timing: VideoTiming, decode_threads: int
) -> Iterator[tuple[int, np.ndarray]]:
    """``(position, RGB uint8 [H, W, 3])`` of each sampled frame of a video file or a frame list,
    one at a time (a video file is decoded by :func:`qwen.frames.sampled_frames`)."""
    if not isinstance(data, (bytes, bytearray)):
        yield from frame_list_frames(data, timing.frame_indices)
        return
    from energon_pack.qwen.frames import sampled_frames

    for position, frame in sampled_frames(data, timing.frame_indices, timing.total_frames, threads=decode_threads):
        rgb = frame.to_ndarray(format="rgb24")
        del frame  # the decoded source frame goes before the resize
        yield position, rgb


def _check_grid(kind: str, got: torch.Tensor, expected: np.ndarray) -> None:
    if got.shape != expected.shape or not np.array_equal(got.numpy(), expected):
        raise BadSampleError(
            "media_mismatch",
            f"decoded {kind} grids {got.tolist()} differ from the header-based grids {expected.tolist()}",
        )


def _payload_kwargs(uint8: bool) -> dict[str, Any]:
    return {"do_rescale": False, "do_normalize": False} if uint8 else {}


@dataclass(frozen=True)
class PixelSlots:
    """Where one sample's patches go: views [P_img, D] / [P_vid, D] into its row's payload
    (None when the sample has no image / no video)."""

    images: torch.Tensor | None = None
    videos: torch.Tensor | None = None


def patch_rows(grid_thw: torch.Tensor | np.ndarray | None) -> int:
    """Patches (rows of the pixel payload) of some grids: sum of t*h*w.

    Example: ``patch_rows(np.array([[1, 4, 6], [2, 2, 2]]))`` -> 32; ``patch_rows(None)`` -> 0.
    """
    if grid_thw is None or len(grid_thw) == 0:
        return 0
    return int(np.asarray(grid_thw, dtype=np.int64).prod(axis=1).sum())


def in_loader_worker() -> bool:
    """Whether this process is a torch DataLoader (Energon) worker."""
    return torch.utils.data.get_worker_info() is not None


def allocate_row_pixels(
    image_grids: Sequence[torch.Tensor | np.ndarray | None],
    video_grids: Sequence[torch.Tensor | np.ndarray | None],
    *,
    patch_dim: int,
    dtype: torch.dtype,
    shared: bool,
) -> list[PixelSlots]:
    """One payload tensor per media kind for a whole row, cut into consecutive per-sample slots.

    ``image_grids[i]`` / ``video_grids[i]`` are sample i's grids [n, 3] (None: no such media);
    ``patch_dim`` = C*T*p*p (1176 for Qwen2/2.5-VL). ``shared`` puts the payload in shared
    memory (inside a loader worker: the row then reaches the main process without a copy).
    ``VisualInputs.concat`` of the filled slots returns the payload itself.
    Example: image grids ``[[[1, 2, 2]], None, [[1, 2, 4]]]``, no videos -> one [12, D] tensor,
    slots of 4, 0 and 8 rows (images None for the second sample).
    """

    def slots(grids: Sequence[Any]) -> list[torch.Tensor | None]:
        rows = [patch_rows(grid) for grid in grids]
        if not sum(rows):
            return [None] * len(grids)
        payload = torch.empty((sum(rows), patch_dim), dtype=dtype)
        if shared:
            payload.share_memory_()
        starts = np.concatenate([[0], np.cumsum(rows)[:-1]])
        return [
            payload.narrow(0, int(start), count) if grid is not None and count else None
            for grid, start, count in zip(grids, starts, rows)
        ]

    return [PixelSlots(images=i, videos=v) for i, v in zip(slots(image_grids), slots(video_grids))]


def _fill(
    out: torch.Tensor | None,
    expected_grid_thw: np.ndarray,
    parts: Sequence[Callable[[torch.Tensor | None], Any]],
    *,
    kind: str,
    grid_key: str,
    pixel_key: str,
) -> torch.Tensor:
    """Run each of ``parts`` (one processor call per image / video) on its slot of ``out`` (None
    without ``out``) and put its patches there one after the other (or concatenate them when
    ``out`` is None); a part that wrote its patches into the slot itself returns the slot, which
    is then not copied. Each part's output is freed before the next part runs. Checks every grid
    against ``expected_grid_thw``."""
    chunks: list[torch.Tensor] = []
    start = 0
    for position, part in enumerate(parts):
        rows = int(np.prod(expected_grid_thw[position]))
        slot = out.narrow(0, start, rows) if out is not None and start + rows <= out.shape[0] else None
        processed = part(slot)
        _check_grid(kind, processed[grid_key], expected_grid_thw[position : position + 1])
        pixels = processed[pixel_key]
        del processed
        if out is None:
            chunks.append(pixels)
        elif pixels is not slot:
            with timed("row assembly"):
                out.narrow(0, start, pixels.shape[0]).copy_(pixels)
        start += pixels.shape[0]
        del pixels
    if out is not None:
        if start != out.shape[0]:
            raise BadSampleError(
                "media_mismatch", f"{kind}s decode to {start} patches but the header-based grids give {out.shape[0]}"
            )
        return out
    return chunks[0] if len(chunks) == 1 else torch.cat(chunks)


def patchify_into(
    resized: torch.Tensor, out: torch.Tensor, *, patch_size: int, merge_size: int, temporal_patch_size: int
) -> torch.Tensor:
    """Qwen-VL patches of one image [C, H, W] or clip [N, C, H, W] (any strides, any dtype) written into
    ``out`` [G * H/p * W/p, C*T*p*p] (contiguous, same dtype) in the Hugging Face patch order; returns ``out``.

    An image is repeated T times (G = 1); a clip's frames go T at a time (N a multiple of T,
    G = N / T). Row r of ``out`` is temporal group r // (H/p * W/p), then its merged block, then the
    position in the block; each row holds C, T, p, p values. The copy moves whole patch lines of p
    pixels as one numpy ``V{p}`` element (3-4x faster than an element-wise strided copy) from a
    C-order copy of ``resized`` (none when it is one already; p elements of any size); an image's other temporal steps are
    whole p*p blocks duplicated. Example: C=3, H=W=28, p=14, m=2, T=2 -> ``out`` [4, 1176];
    4 frames [4, 3, 28, 28] -> ``out`` [8, 1176].
    """
    frames = resized.unsqueeze(0) if resized.dim() == 3 else resized
    n, c, h, w = frames.shape
    p, m, t = patch_size, merge_size, temporal_patch_size
    gh, gw = h // p, w // p
    steps = 1 if resized.dim() == 3 else t
    if n % steps:
        raise ValueError(f"a clip of {n} frames cannot be patchified {t} frames at a time; pad it to a multiple of {t}")
    groups = n // steps
    if out.shape != (groups * gh * gw, c * t * p * p) or not out.is_contiguous() or out.dtype != frames.dtype:
        raise ValueError(
            f"out has shape {tuple(out.shape)} and dtype {out.dtype}; expected contiguous "
            f"({groups * gh * gw}, {c * t * p * p}) of {frames.dtype}"
        )
    size = frames.element_size()
    line, block = np.dtype(f"V{p * size}"), np.dtype(f"V{p * p * size}")
    source = np.ascontiguousarray(frames.numpy()).view(line)  # [N, C, H, W/p] patch lines
    lines = source.reshape(groups, steps, c, gh // m, m, p, gw // m, m).transpose(0, 3, 6, 4, 7, 2, 1, 5)
    target = out.numpy().view(line).reshape(groups, gh // m, gw // m, m, m, c, t, p)
    target[:, :, :, :, :, :, :steps] = lines
    if steps < t:
        blocks = out.numpy().view(block).reshape(groups * gh * gw * c, t)
        blocks[:, steps:] = blocks[:, :1]
    return out


#: Probe verdicts by image / video processor: (its settings, whether the patcher equals it); entries go with it.
_PROBED: weakref.WeakKeyDictionary[Any, tuple[str, bool]] = weakref.WeakKeyDictionary()

#: Image processor classes whose resize + patchify :class:`ImagePatcher` reproduces (its probe decides).
#: Qwen2/2.5-VL, Qwen3-VL and Qwen3.5/3.6 all use these (patch 14 or 16).
PATCHER_PROCESSORS = ("Qwen2VLImageProcessor", "Qwen2VLImageProcessorFast")
#: Video processor classes whose resize + patchify :class:`VideoPatcher` reproduces (its probe decides):
#: Qwen2/2.5-VL's, and Qwen3-VL's (also Qwen3.5/3.6's).
VIDEO_PATCHER_PROCESSORS = ("Qwen2VLVideoProcessor", "Qwen3VLVideoProcessor")


class _Patcher(abc.ABC):
    """Patches written straight into a row payload slot, byte-identical to one of the processor's
    own image / video processors: the resize reads the channels-last view (torch's uint8 kernel
    gives the same bytes as on the contiguous copy the processor makes) and :func:`patchify_into`
    copies once, into the slot, where the processor patchifies into a fresh tensor that ``_fill``
    then copies. ``dtypes``: the payloads it writes (uint8: ``do_rescale=False, do_normalize=False``;
    float32: the part's own rescale and normalisation). Build one with :meth:`for_processor`,
    which checks it against the processor on probe inputs, for every payload dtype."""

    #: ``"image"`` or ``"video"``: which processor part, and its output keys.
    kind = ""
    #: Processor classes of that part this patcher may reproduce (its probe decides).
    classes: tuple[str, ...] = ()
    #: Further attributes of the part its output depends on (with size, resample, patch, merge, T).
    settings_of: tuple[str, ...] = ()
    #: Payload dtypes it writes (each probed).
    dtypes: tuple[torch.dtype, ...] = (torch.uint8,)

    def __init__(self, processor: Any) -> None:
        self.processor = getattr(processor, f"{self.kind}_processor")
        self.patch_size = int(self.processor.patch_size)
        self.merge_size = int(self.processor.merge_size)
        self.temporal_patch_size = int(self.processor.temporal_patch_size)

    @classmethod
    def for_processor(cls, processor: Any) -> _Patcher | None:
        """A patcher when it reproduces the processor's part byte for byte on the probe inputs,
        else None (use the part itself). Probed once per part and settings (cached beside the part,
        not on it: its ``to_json_string`` stays as it was)."""
        part = getattr(processor, f"{cls.kind}_processor")
        settings = repr((
            type(part).__name__, dict(part.size), part.resample, part.patch_size, part.merge_size,
            part.temporal_patch_size, *(getattr(part, name, None) for name in cls.settings_of),
        ))
        verdict = _PROBED.get(part)
        if verdict is None or verdict[0] != settings:
            verdict = (settings, cls._probe(processor))
            _PROBED[part] = verdict
        return cls(processor) if verdict[1] else None

    @classmethod
    def _probe(cls, processor: Any) -> bool:
        """Whether a patcher gives the part's bytes and grids on every probe input, for every payload dtype."""
        part = getattr(processor, f"{cls.kind}_processor")
        if type(part).__name__ not in cls.classes:
            return False
        if not getattr(part, "do_resize", True) or getattr(part, "do_pad", False):
            return False
        pixel_key, grid_key = ("pixel_values", "image_grid_thw") if cls.kind == "image" else (
            "pixel_values_videos", "video_grid_thw")
        try:
            patcher = cls(processor)
            for media, inputs in cls._probe_inputs():
                for dtype in cls.dtypes:
                    expected = part(**inputs, return_tensors="pt", **_payload_kwargs(dtype == torch.uint8))
                    out = torch.empty_like(expected[pixel_key])
                    grid = patcher(media, out)
                    if list(grid) != expected[grid_key][0].tolist() or not torch.equal(out, expected[pixel_key]):
                        return False
        except Exception:  # any disagreement in the probe: the processor path stays
            return False
        return True

    @staticmethod
    @abc.abstractmethod
    def _probe_inputs() -> list[tuple[Any, dict[str, Any]]]:
        """(medium for the patcher, keyword arguments for the part) of each probe input."""

    def _resize(self, pixels: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        """uint8 ``pixels`` ([C, H, W] or [N, C, H, W], any strides) resized to ``size`` (h, w) with the
        part's own base resize (torchvision bicubic, antialiased)."""
        from transformers.image_utils import SizeDict

        resize = super(type(self.processor), self.processor).resize  # the base resize: ``size`` is the exact target
        return resize(image=pixels, size=SizeDict(height=size[0], width=size[1]), resample=self.processor.resample)

    def _patchify(self, resized: torch.Tensor, out: torch.Tensor) -> None:
        """Patches of uint8 ``resized`` into ``out``: as they are (uint8 ``out``), or rescaled and
        normalised by the part's own ``rescale_and_normalize`` first (float32 ``out``)."""
        if out.dtype != torch.uint8:
            part = self.processor
            resized = part.rescale_and_normalize(
                resized, part.do_rescale, part.rescale_factor, part.do_normalize, part.image_mean, part.image_std
            )
        patchify_into(
            resized, out, patch_size=self.patch_size, merge_size=self.merge_size,
            temporal_patch_size=self.temporal_patch_size,
        )


class ImagePatcher(_Patcher):
    """:class:`_Patcher` of a Qwen-VL image processor (every family's: Qwen2VLImageProcessor at
    patch 14 or 16), uint8 payloads. The processor converts to RGB, copies the HWC array to a
    contiguous CHW tensor, resizes (bicubic, antialiased) and patchifies.
    Example: ``ImagePatcher.for_processor(processor)(image, out)`` -> (1, 20, 30), ``out`` [600, 1176] filled.
    """

    kind, classes, settings_of = "image", PATCHER_PROCESSORS, ("do_resize", "do_pad")

    def __call__(self, image: Any, out: torch.Tensor, max_pixels: int | None = None) -> tuple[int, int, int]:
        """Write the patches of PIL ``image`` into ``out`` and return its grid (1, H/p, W/p);
        ``max_pixels`` overrides the processor's pixel limit (a shrunk sample)."""
        from transformers.image_transforms import convert_to_rgb

        from energon_pack.qwen.geometry import smart_resize

        size = self.processor.size
        height, width = smart_resize(
            image.height, image.width, factor=self.patch_size * self.merge_size,
            min_pixels=int(size["shortest_edge"]),
            max_pixels=int(max_pixels if max_pixels is not None else size["longest_edge"]),
        )
        grid = (1, height // self.patch_size, width // self.patch_size)
        _check_slot("image", grid, out)
        rgb = torch.from_numpy(convert_to_rgb(image, return_numpy=True)).permute(2, 0, 1)
        self._patchify(self._resize(rgb, (height, width)), out)
        return grid

    @staticmethod
    def _probe_inputs() -> list[tuple[Any, dict[str, Any]]]:
        """The :func:`_probe_images`, each as the patcher's image and the processor's ``images``."""
        return [(image, {"images": [image]}) for image in _probe_images()]


class VideoPatcher(_Patcher):
    """:class:`_Patcher` of a Qwen-VL video processor (Qwen2/2.5-VL's, Qwen3-VL's and Qwen3.5/3.6's),
    frames already sampled, uint8 and float32 payloads. The processor copies the [N, H, W, 3]
    frames to a contiguous [N, 3, H, W] tensor, resizes them as one batch, rescales and normalises
    (float32), pads the clip to a multiple of T with its last frame and patchifies. Each frame is
    resized on its own here (:meth:`writer`: frame by frame, as they are decoded; the probe checks
    it gives the batch's bytes). The frame size is the package's ``resized_video_size`` (the
    processor's rule, per-frame cap and Qwen3-VL's clip budget included).
    Example: ``VideoPatcher.for_processor(processor)(frames [8, 144, 192, 3], out)`` -> (4, 20, 28).
    """

    kind, classes, dtypes = "video", VIDEO_PATCHER_PROCESSORS, (torch.uint8, torch.float32)
    settings_of = (
        "do_resize", "cap_pixels_per_frame", "max_video_tokens", "do_convert_rgb", "do_rescale", "rescale_factor",
        "do_normalize", "image_mean", "image_std",
    )

    def __init__(self, processor: Any) -> None:
        from energon_pack.qwen.geometry import VisionSpec

        super().__init__(processor)
        self.spec = VisionSpec.from_processor(processor)

    def __call__(self, frames: np.ndarray, out: torch.Tensor) -> tuple[int, int, int]:
        """Write the patches of RGB uint8 ``frames`` [N, H, W, 3] into ``out``; returns the grid (t, H'/p, W'/p)."""
        n, height, width = frames.shape[:3]
        writer = self.writer(n, height, width, out)
        for position, frame in enumerate(frames):
            writer.put(position, frame)
        return writer.finish()

    def writer(self, num_frames: int, height: int, width: int, out: torch.Tensor) -> ClipWriter:
        """A :class:`ClipWriter` of a clip of ``num_frames`` sampled frames of height x width into ``out``."""
        from energon_pack.qwen.geometry import resized_video_size

        size = resized_video_size(num_frames, height, width, self.spec)
        t = self.temporal_patch_size
        grid = (-(-num_frames // t), size[0] // self.patch_size, size[1] // self.patch_size)
        _check_slot("video", grid, out)
        return ClipWriter(self, num_frames=num_frames, source=(height, width), size=size, grid=grid, out=out)

    @staticmethod
    def _probe_inputs() -> list[tuple[Any, dict[str, Any]]]:
        """Five random clips: 4, 6, 2, 8 and 3 frames that resize up, down and to a strip (3: padded to 4)."""
        from energon_pack.qwen.template import VideoTiming

        rng = np.random.default_rng(0)
        inputs = []
        for frames, (height, width) in ((4, (64, 96)), (6, (480, 360)), (2, (33, 700)), (8, (900, 1200)), (3, (72, 40))):
            clip = rng.integers(0, 256, (frames, height, width, 3), dtype=np.uint8)
            timing = VideoTiming(total_frames=frames, fps=10.0, frame_indices=tuple(range(frames)))
            inputs.append((clip, {"videos": [clip], "video_metadata": [timing.metadata()], "do_sample_frames": False}))
        return inputs


class ClipWriter:
    """One clip's sampled frames resized one at a time as they arrive, and each group of T frames
    patchified into its rows of the slot: the clip never holds more than T resized frames
    ([T, 3, h, w] uint8) and the one source frame being resized.

    ``put(position, rgb)`` takes frame ``position`` (0-based, any order within a group; a restart
    from 0 overwrites) as RGB uint8 [H, W, 3]; ``finish()`` pads the last group with the last frame
    (as the processor does) and returns the grid. Example: 3 frames, T=2 -> groups (0, 1) and (2, 2).
    """

    def __init__(
        self, patcher: VideoPatcher, *, num_frames: int, source: tuple[int, int], size: tuple[int, int],
        grid: tuple[int, int, int], out: torch.Tensor,
    ) -> None:
        self.patcher, self.num_frames, self.source, self.size, self.grid, self.out = (
            patcher, num_frames, source, size, grid, out)
        self.group = torch.empty((patcher.temporal_patch_size, 3, *size), dtype=torch.uint8)
        self.rows = grid[1] * grid[2]
        self.written: set[int] = set()

    def put(self, position: int, rgb: np.ndarray) -> None:
        """Resize frame ``position`` (RGB uint8 [H, W, 3]) into its group; a full group goes to the slot."""
        if rgb.shape != (*self.source, 3):
            raise BadSampleError(
                "media_mismatch", f"video frame {position} is {rgb.shape[1]}x{rgb.shape[0]} (w x h), the clip's first "
                f"{self.source[1]}x{self.source[0]}; frames of one clip must share a size",
            )
        t = self.patcher.temporal_patch_size
        self.group[position % t] = self.patcher._resize(torch.from_numpy(rgb).permute(2, 0, 1)[None], self.size)[0]
        if position % t == t - 1:
            self._write(position // t)
        elif position == self.num_frames - 1:  # the processor repeats the last frame
            self.group[position % t + 1 :] = self.group[position % t]
            self._write(position // t)

    def finish(self) -> tuple[int, int, int]:
        """The clip's grid (t, h/p, w/p) once every group is written."""
        if len(self.written) != self.grid[0]:
            raise BadSampleError(
                "media_mismatch", f"video gave {len(self.written)} of its {self.grid[0]} groups of sampled frames"
            )
        return self.grid

    def _write(self, group: int) -> None:
        self.patcher._patchify(self.group, self.out.narrow(0, group * self.rows, self.rows))
        self.written.add(group)


def _check_slot(kind: str, grid: tuple[int, int, int], out: torch.Tensor) -> None:
    """``BadSampleError("media_mismatch")`` unless ``out`` has one row per patch of ``grid``."""
    if out.shape[0] != grid[0] * grid[1] * grid[2]:
        raise BadSampleError(
            "media_mismatch",
            f"decoded {kind} grid {list(grid)} has {grid[0] * grid[1] * grid[2]} patches but its slot holds {out.shape[0]}",
        )


def _probe_images() -> list[Any]:
    """Six PIL images in modes RGB, RGBA, L, P and LA, sizes that resize up, down and to a thin strip."""
    from PIL import Image

    rng = np.random.default_rng(0)
    images = []
    for (height, width), mode in (((97, 131), "RGB"), ((700, 500), "RGBA"), ((56, 84), "L"), ((300, 412), "P"),
                                  ((33, 1201), "LA"), ((1100, 1000), "RGB")):
        image = Image.fromarray(rng.integers(0, 256, (height, width, 4), dtype=np.uint8), "RGBA")
        images.append(image.convert("RGB").quantize(64) if mode == "P" else image.convert(mode))
    return images


def image_pixels(
    processor: Any,
    images: Sequence[bytes],
    expected_grid_thw: np.ndarray,
    *,
    uint8: bool = False,
    max_pixels: int | None = None,
    fast_jpeg: bool = False,
    apply_exif_orientation: bool = True,
    out: torch.Tensor | None = None,
    patcher: ImagePatcher | None = None,
) -> torch.Tensor:
    """``pixel_values`` [P, C*T*p*p] (float32, or uint8 with ``uint8=True``) of a sample's images;
    ``max_pixels`` overrides the processor's pixel limit per image for this call (a shrunk sample).

    Images are decoded and processed one at a time (each freed once patchified), which gives the
    same patches as one processor call on all of them. With ``out`` (a [P, C*T*p*p] slot of the
    row's payload, see :func:`allocate_row_pixels`) the patches are written there and ``out`` is
    returned. ``fast_jpeg`` decodes big JPEGs at reduced scale straight to the size the grid
    gives (:func:`decode_image` with ``draft_size``); ``apply_exif_orientation`` turns images
    upright as :func:`decode_image` says. With ``patcher`` (:meth:`ImagePatcher.for_processor`),
    ``uint8`` and ``out``, each image's patches are written straight into its slot (same bytes)."""
    patch = int(processor.image_processor.patch_size)
    kwargs = _payload_kwargs(uint8)
    if max_pixels is not None:
        kwargs["size"] = {**dict(processor.image_processor.size), "longest_edge": max_pixels}

    def process(data: bytes, grid: np.ndarray) -> Callable[[torch.Tensor | None], Any]:
        draft_size = (int(grid[2]) * patch, int(grid[1]) * patch) if fast_jpeg else None

        def run(slot: torch.Tensor | None) -> Any:
            with timed("decode"):
                image = decode_image(data, draft_size=draft_size, apply_exif_orientation=apply_exif_orientation)
            with timed("resize/patchify"):
                if patcher is not None and uint8 and slot is not None:
                    grid_thw = patcher(image, slot, max_pixels=max_pixels)
                    return {"image_grid_thw": torch.tensor([grid_thw]), "pixel_values": slot}
                return processor.image_processor(images=[image], return_tensors="pt", **kwargs)

        return run

    pixels = _fill(
        out, expected_grid_thw, [process(data, grid) for data, grid in zip(images, expected_grid_thw)],
        kind="image", grid_key="image_grid_thw", pixel_key="pixel_values",
    )
    return pixels.to(torch.uint8) if uint8 else pixels


def video_pixels(
    processor: Any,
    videos: Sequence[bytes],
    timings: Sequence[VideoTiming],
    expected_grid_thw: np.ndarray,
    *,
    uint8: bool = False,
    out: torch.Tensor | None = None,
    patcher: VideoPatcher | None = None,
    decode_threads: int = 1,
) -> torch.Tensor:
    """``pixel_values_videos`` [P, C*T*p*p] of a sample's videos (float32, or uint8 with ``uint8=True``),
    one video at a time: video files decoded with PyAV (:func:`qwen.frames.sampled_frames`: seeking
    past stretches no sampled frame needs, ``decode_threads`` FFmpeg threads), frame lists (tuples of
    encoded images) with Pillow; ``out`` as in :func:`image_pixels`.

    With ``patcher`` (:meth:`VideoPatcher.for_processor`), each sampled frame is resized as it is
    decoded and every T frames go straight into the video's slot (:class:`ClipWriter`): a video
    holds one source frame and T resized frames, whatever its length and resolution. Without it,
    the sampled frames are stacked at source size and go through the video processor."""
    if patcher is not None and out is None:
        out = torch.empty((patch_rows(expected_grid_thw), 3 * patcher.temporal_patch_size * patcher.patch_size**2),
                          dtype=torch.uint8 if uint8 else torch.float32)

    def process(data: bytes | Sequence[bytes], timing: VideoTiming) -> Callable[[torch.Tensor | None], Any]:
        def run(slot: torch.Tensor | None) -> Any:
            if patcher is not None and slot is not None:
                return {"video_grid_thw": torch.tensor([stream_clip(data, timing, slot)]), "pixel_values_videos": slot}
            with timed("decode"):
                if isinstance(data, (bytes, bytearray)):
                    frames = decode_video_frames(data, timing.frame_indices, timing.total_frames, threads=decode_threads)
                else:  # a frame list (encoded images)
                    frames = decode_frame_list(data, timing.frame_indices)
            with timed("resize/patchify"):
                return processor.video_processor(
                    videos=[frames],
                    video_metadata=[timing.metadata()],
                    do_sample_frames=False,
                    return_tensors="pt",
                    **_payload_kwargs(uint8),
                )

        return run

    def stream_clip(data: bytes | Sequence[bytes], timing: VideoTiming, slot: torch.Tensor) -> tuple[int, int, int]:
        assert patcher is not None
        writer = None
        frames = _sampled_rgb_frames(data, timing, decode_threads)
        while True:
            with timed("decode"):
                item = next(frames, None)
                if item is None:
                    break
                position, rgb = item
            with timed("resize/patchify"):
                if writer is None:
                    writer = patcher.writer(len(timing.frame_indices), rgb.shape[0], rgb.shape[1], slot)
                writer.put(position, rgb)
            del rgb
        assert writer is not None  # the frame source yields every sampled frame or raises
        return writer.finish()

    pixels = _fill(
        out, expected_grid_thw, [process(data, timing) for data, timing in zip(videos, timings)],
        kind="video", grid_key="video_grid_thw", pixel_key="pixel_values_videos",
    )
    return pixels.to(torch.uint8) if uint8 else pixels


#: Bytes per source pixel for the frame conversions of one decoded frame (measured, rounded up):
#: its RGB array, swscale's converted frame, and the resize's intermediates (docs/worker_memory.md).
SOURCE_CONVERSION_BYTES = 12
#: Bytes per source pixel of one decoded YUV 4:2:0 8-bit frame the decoder holds.
DECODED_FRAME_BYTES = 1.5
#: Interpreter, PyAV and allocator slack per video build (bytes).
VIDEO_BUILD_SLACK = 32 << 20


def video_memory_bound(
    source: tuple[int, int], target: tuple[int, int], *, temporal_patch_size: int, float32: bool,
    reference_frames: int = 16, decode_threads: int = 1,
) -> int:
    """Most bytes a worker holds for one video beyond the video's own pixel payload, whatever its
    length: one source frame (``source`` = (H, W)) converted and resized, the decoder's frames
    (``reference_frames``: H.264/HEVC keep at most 16, at 4K at most 6 by their level limits; plus
    one per decoder thread and the frame being output), T resized frames (``target`` = (h, w)) and,
    for float32 payloads, their float copies, plus `VIDEO_BUILD_SLACK`.

    H*W*(12 + 1.5*(R + threads + 1)) + T*3*h*w*(1 + 8 if float32) + 32 MiB.
    Example: 1080p, target (560, 1008), T=2, uint8, R=16, 1 thread -> 117,811,712 (112 MiB);
    4K with R=6 -> 236,006,912 (225 MiB).
    """
    height, width = source
    decoder = DECODED_FRAME_BYTES * (reference_frames + decode_threads + 1)
    group = temporal_patch_size * 3 * target[0] * target[1] * (9 if float32 else 1)
    return int(height * width * (SOURCE_CONVERSION_BYTES + decoder) + group + VIDEO_BUILD_SLACK)
