"""One Qwen-VL chat -> model inputs, in the two steps the packing pipeline needs.

``QwenChatEncoder.prepare`` (preencode): token ids, labels, loss mask, patch grids and video
frame sampling from the media *headers* only (no pixels), so a buffered sample stays cheap.
``QwenChatEncoder.encode`` (postencode, only for samples of a row being emitted): decoded and
patchified pixels, 3-D rope positions and the visual payload.

Both equal what the Hugging Face processor gives for the same chat (docs/batch_contract.md).
Bad media raise ``BadSampleError`` with a skip reason. No Energon here: the task encoder wraps
the results into its sample types.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from energon_pack.qwen.audio import AudioSpec, audio_features, decode_audio, probe_audio
from energon_pack.qwen.family import OMNI_FAMILIES, processor_family
from energon_pack.qwen.fit import MediaGeometry, MediaLimits, media_geometry, shrink_limits
from energon_pack.qwen.geometry import VisionSpec
from energon_pack.qwen.media import ImageInfo, VideoInfo, probe_frame_list, probe_image, probe_video
from energon_pack.qwen.omni_rope import OmniMedia, OmniRopeSpec, omni_position_ids
from energon_pack.qwen.pixels import ImagePatcher, PixelSlots, VideoPatcher, image_pixels, video_pixels
from energon_pack.qwen.rope import RopeSpec, mrope_position_ids
from energon_pack.qwen.sound_count import OMNI_VIDEO_FPS, SoundCount
from energon_pack.qwen.template import (
    ChatMarkers,
    MediaExpansion,
    SoundTokens,
    SplitTokenizer,
    TokenizedConversation,
    VideoTiming,
    placeholder_token_count,
    template_name,
    template_variables,
    tokenize_conversation,
)
from energon_pack.core.stage_times import timed
from energon_pack.errors import BadSampleError
from energon_pack.core.audio_inputs import AudioInputs
from energon_pack.core.visual import VisualInputs

__all__ = ["EncodedChat", "PreparedChat", "QwenChatEncoder"]


@dataclass(frozen=True)
class _Chat:
    """What a chat renders from: typed messages, the record's tools and the template options."""

    messages: Sequence[dict[str, Any]]
    tools: Sequence[dict[str, Any]] | None
    options: Mapping[str, Any]


@dataclass(frozen=True, kw_only=True)
class PreparedChat:
    """Tokens and media geometry of one chat (L tokens, n_img images, n_vid videos).

    input_ids / labels int64 [L], loss_mask float32 [L]; image_grid_thw / video_grid_thw int64
    [n, 3] patch grids (None without such media); video_timings: frame sampling per video;
    second_per_grid_ts: seconds per temporal grid step per video (None without videos).
    """

    input_ids: torch.Tensor
    labels: torch.Tensor
    loss_mask: torch.Tensor
    image_grid_thw: torch.Tensor | None
    video_grid_thw: torch.Tensor | None
    video_timings: list[VideoTiming] | None
    second_per_grid_ts: list[float] | None
    #: Per-sample limits a shrink set: pixels per image, frames sampled per video (None: the processor's).
    image_max_pixels: int | None = None
    video_max_frames: int | None = None
    #: Token count before a shrink lowered those limits, else None.
    tokens_before_shrink: int | None = None
    #: Qwen-Omni: where each heard sound comes from, in token order (i >= 0: ``audios[i]``;
    #: -1 - j: the sound track of ``videos[j]``), and its length in model-rate samples (uncapped).
    audio_sources: list[int] | None = None
    audio_samples: list[int] | None = None
    #: Qwen-Omni: log-mel feature frames of all its sounds (capped; what the audio encoder reads, 0 without sound).
    audio_frames: int = 0
    #: Qwen-Omni: whether the videos are heard with their sound (the record's ``use_audio_in_video``).
    use_audio_in_video: bool = False


@dataclass(frozen=True, kw_only=True)
class EncodedChat:
    """The pixel side of one chat: rope positions int64 [3, L], the visual payload and (Qwen-Omni
    samples that hear audio) the audio payload."""

    mrope_position_ids: torch.Tensor
    visual: VisualInputs
    audio: AudioInputs | None = None


@dataclass(frozen=True)
class OmniHearing:
    """What a Qwen-Omni processor hears with: its feature extractor, its sound accounting
    (``qwen.sound_count.SoundCount``: the audio spec capped at ``max_audio_seconds``, trim or skip
    a longer audio, the token rule) and the rope constants."""

    extractor: Any
    counting: SoundCount
    rope: OmniRopeSpec

    @classmethod
    def of(cls, processor: Any, *, max_audio_seconds: float | None, trim: bool) -> OmniHearing | None:
        """None for a processor of a family that hears nothing (Qwen-VL)."""
        if processor_family(processor) not in OMNI_FAMILIES:
            return None
        return cls(
            extractor=processor.feature_extractor, counting=sound_count_of(processor, max_audio_seconds=max_audio_seconds, trim=trim),
            rope=OmniRopeSpec.from_processor(processor),
        )

    @property
    def spec(self) -> AudioSpec:
        """The audio spec (capped at ``max_audio_seconds``)."""
        return self.counting.spec

    def samples(self, data: bytes) -> int:
        """Model-rate samples of one audio file or video sound track; over the cap: skipped
        (``audio_too_long``) unless trimmed."""
        return self.counting.check_length(probe_audio(data, self.spec, count_up_to=self.spec.max_samples).samples)

    def tokens(self, samples: Sequence[int]) -> list[int]:
        """LLM tokens of each sound of one sample (``SoundCount.tokens``)."""
        return self.counting.tokens(samples)

    def frames(self, samples: Sequence[int]) -> int:
        """Log-mel frames of one sample's sounds together (``SoundCount.frames``): what its
        ``AudioInputs`` holds, ``row_cost["audio_frames"]`` of the sample alone."""
        return self.counting.frames(samples)


def sound_count_of(processor: Any, *, max_audio_seconds: float | None = None, trim: bool = True) -> SoundCount:
    """The ``SoundCount`` of a Qwen-Omni processor (its ``AudioSpec``, token rule and videos'
    seconds per grid step: ``temporal_patch_size / OMNI_VIDEO_FPS[family]``), capped at
    ``max_audio_seconds``. Example: the offline Qwen3-Omni processor -> ``n_window=50``,
    ``video_second_per_grid=2.0``."""
    rope = OmniRopeSpec.from_processor(processor)
    seconds = VisionSpec.from_processor(processor).temporal_patch_size / OMNI_VIDEO_FPS[rope.family]
    return SoundCount.of(
        AudioSpec.from_processor(processor), rope.n_window, seconds, max_audio_seconds=max_audio_seconds, trim=trim
    )


@dataclass(frozen=True)
class _Hearing:
    """The sounds of one Omni sample in token order: sources (see ``PreparedChat.audio_sources``),
    model-rate samples of each, LLM tokens of each, and the sample's number of videos."""

    sources: list[int]
    samples: list[int]
    tokens: list[int]
    videos: int


class QwenChatEncoder:
    """Preencode and postencode of Qwen-VL chats with one processor.

    ``processor``: a Qwen-VL processor (its pixel limits decide grids and token counts);
    ``rope_spec``: rope constants (``RopeSpec.from_processor(processor)`` when None);
    ``uint8_pixels``: emit resized, patchified uint8 pixels and leave rescale/normalise to the
    device (``VisualInputs.normalized_for_model``).
    ``fast_jpeg``: decode a JPEG at least twice its target size at reduced scale (DCT domain), then
    resize it to the target (``qwen.pixels.decode_image``); pixels close to, not equal to, the exact path.
    ``apply_exif_orientation``: turn images upright by their EXIF orientation, as
    ``transformers.image_utils.load_image`` does (``RowLayout.apply_exif_orientation``).
    ``max_image_pixels``: images with more stored pixels are skipped as ``pixel_bomb``
    (``RowLayout.max_image_pixels``; None: ``qwen.media.default_max_image_pixels()``).
    ``decode_threads``: FFmpeg decoder threads per video (same frames with any count).
    ``chat_template_kwargs``: the dataset's template options (``RowLayout.chat_template_kwargs``),
    under each record's own; an option the processor's template never reads is a ValueError here.
    ``max_audio_seconds`` / ``trim_long_audio`` (Qwen-Omni): audio over the cap (None: the model's
    300 s) keeps its first ``max_audio_seconds`` (trim) or is skipped as ``audio_too_long``.
    """

    def __init__(
        self,
        processor: Any,
        *,
        rope_spec: RopeSpec | None = None,
        uint8_pixels: bool = False,
        fast_jpeg: bool = False,
        apply_exif_orientation: bool = True,
        max_image_pixels: int | None = None,
        decode_threads: int = 1,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        max_audio_seconds: float | None = None,
        trim_long_audio: bool = True,
    ) -> None:
        self.processor = processor
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        unread = sorted(set(self.chat_template_kwargs) - template_variables(processor.chat_template or ""))
        if unread:
            raise ValueError(
                f"chat_template_kwargs {', '.join(map(repr, unread))}: the chat template of {template_name(processor)} "
                "never reads them, so they would change nothing; fix: remove them from the row layout, or use a "
                "processor whose template takes them (e.g. add_vision_id: Qwen2.5-VL's official template, Qwen3-VL; "
                "preserve_thinking: Qwen3.6)"
            )
        self.vision = VisionSpec.from_processor(processor)
        self.rope_spec = rope_spec or RopeSpec.from_processor(processor)
        self.markers = ChatMarkers.from_tokenizer(processor.tokenizer)
        #: Qwen-Omni: the audio side (None for Qwen-VL processors).
        self.hearing = OmniHearing.of(processor, max_audio_seconds=max_audio_seconds, trim=trim_long_audio)
        #: Text between placeholders in one tokenizer call (None: ``tokenize_conversation``).
        splits = self.hearing is None and SplitTokenizer.applies(processor)
        self._split_tokenizer = SplitTokenizer(processor, self.markers) if splits else None
        self.uint8_pixels = uint8_pixels
        #: Image patches straight into the row payload (uint8 only; None: the image processor's own path).
        self._patcher = ImagePatcher.for_processor(processor) if uint8_pixels else None
        #: Video frames resized as decoded, patches straight into the row payload (uint8 and float32;
        #: None: the video processor's own path).
        self._video_patcher = VideoPatcher.for_processor(processor)
        #: FFmpeg decoder threads per video (``LoaderOptions.decode_threads``, resolved).
        self.decode_threads = decode_threads
        #: Decode big JPEGs at reduced scale straight to their target size (``RowLayout.fast_jpeg_decode``).
        self.fast_jpeg = fast_jpeg
        self.apply_exif_orientation = apply_exif_orientation
        self.max_image_pixels = max_image_pixels

    def prepare(
        self,
        conversation: Sequence[dict[str, Any]],
        images: Sequence[bytes],
        videos: Sequence[bytes],
        *,
        tools: Sequence[dict[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        fits: Callable[[int, MediaGeometry], bool] | None = None,
        audios: Sequence[bytes] = (),
        use_audio_in_video: bool = False,
    ) -> PreparedChat:
        """Tokens and grids from media headers: image sizes, video frame count/rate; no pixels decoded.

        ``tools`` and ``chat_template_kwargs`` are the record's (its options over the dataset's):
        the conversation renders as ``apply_chat_template(conversation, tools=tools, **options)``.

        With ``fits`` (token count, media geometry -> whether the sample fits one row), a sample
        that does not fit is shrunk: its image pixel budget, then its video frames, are lowered
        to the largest setting that fits (``qwen.fit.shrink_limits``); left as it is when none does.
        Qwen-Omni: its sounds are never cut (their tokens count whole in every candidate), and the
        frames of videos heard with their sound are never lowered (their positions are aligned to
        the sound at the processor's 2 fps), so only their images shrink (docs/omni.md).

        ``audios`` (Qwen-Omni): the audio files of the ``{"type": "audio"}`` parts; with
        ``use_audio_in_video`` each video with a sound track is heard with it (its tokens
        interleaved by the processor); a video without one is skipped as ``video_without_audio``.
        """
        with timed("probe"):
            image_infos = [
                probe_image(data, max_pixels=self.max_image_pixels, apply_exif_orientation=self.apply_exif_orientation)
                for data in images
            ]
            video_infos = [
                probe_video(data) if isinstance(data, (bytes, bytearray))
                else probe_frame_list(data, fps=self.vision.fps, max_pixels=self.max_image_pixels)
                for data in videos
            ]
        geometry = media_geometry(image_infos, video_infos, self.vision)
        chat = _Chat(conversation, tools, {**self.chat_template_kwargs, **(chat_template_kwargs or {})})
        hearing = self._hearing(conversation, audios, videos, video_infos, use_audio_in_video)
        tokens = self._tokenize(chat, geometry, hearing)
        limits = tokens_before_shrink = None
        if fits is not None and not fits(len(tokens.input_ids), geometry):
            limits = self._shrink_limits(chat, image_infos, video_infos, geometry, len(tokens.input_ids), fits, hearing)
            if limits is not None:
                tokens_before_shrink = len(tokens.input_ids)
                geometry = media_geometry(image_infos, video_infos, limits.apply(self.vision))
                tokens = self._tokenize(chat, geometry, hearing)
        return PreparedChat(
            input_ids=torch.from_numpy(tokens.input_ids),
            labels=torch.from_numpy(tokens.labels),
            loss_mask=torch.from_numpy(tokens.loss_mask),
            image_grid_thw=None if geometry.image_grid_thw is None else torch.from_numpy(geometry.image_grid_thw),
            video_grid_thw=None if geometry.video_grid_thw is None else torch.from_numpy(geometry.video_grid_thw),
            video_timings=list(geometry.timings) or None,
            second_per_grid_ts=list(geometry.second_per_grid_ts) or None,
            image_max_pixels=None if limits is None else limits.image_max_pixels,
            video_max_frames=None if limits is None else limits.max_frames,
            tokens_before_shrink=tokens_before_shrink,
            **({} if hearing is None else {
                "audio_sources": hearing.sources, "audio_samples": hearing.samples,
                "audio_frames": self.hearing.frames(hearing.samples),
                "use_audio_in_video": use_audio_in_video,
            }),
        )

    def _hearing(
        self,
        conversation: Sequence[dict[str, Any]],
        audios: Sequence[bytes],
        videos: Sequence[Any],
        video_infos: Sequence[VideoInfo],
        use_audio_in_video: bool,
    ) -> _Hearing | None:
        """The sounds a Qwen-Omni sample hears, in token order (None for Qwen-VL processors).

        Raises ``BadSampleError``: ``audio_not_supported`` (audio for a processor that hears none),
        ``video_without_audio`` (a video heard with its sound has no sound track), bad audio."""
        if self.hearing is None:
            if audios or use_audio_in_video:
                raise BadSampleError(
                    "audio_not_supported",
                    f"the sample has {len(audios)} audio(s) / use_audio_in_video={use_audio_in_video} but "
                    f"{type(self.processor).__name__} is a vision-only processor; fix: train a Qwen-Omni model "
                    "(load_processor(family='qwen2.5-omni') or 'qwen3-omni'), or drop the audio",
                )
            return None
        kinds = [part["type"] for message in conversation for part in message["content"] if part["type"] in ("audio", "video")]
        if (kinds.count("audio"), kinds.count("video")) != (len(audios), len(videos)):
            raise BadSampleError(
                "placeholder_mismatch",
                f"{kinds.count('audio')} audio and {kinds.count('video')} video placeholder(s) but {len(audios)} audio(s) "
                f"and {len(videos)} video(s) given; put one <audio> / <video> (or typed part) per medium",
            )
        sources: list[int] = []
        audio_index = video_index = 0
        for kind in kinds:
            if kind == "audio":
                sources.append(audio_index)
                audio_index += 1
                continue
            if use_audio_in_video:
                if not video_infos[video_index].has_audio:
                    raise BadSampleError(
                        "video_without_audio",
                        f"video {video_index} has no sound track but use_audio_in_video is set; fix: set "
                        "use_audio_in_video false for this record, or store the video with its sound",
                    )
                sources.append(-1 - video_index)
            video_index += 1
        with timed("probe"):
            samples = [self.hearing.samples(audios[i] if i >= 0 else videos[-1 - i]) for i in sources]
        return _Hearing(sources=sources, samples=samples, tokens=self.hearing.tokens(samples), videos=len(videos))

    def _sound_tokens(self, hearing: _Hearing) -> SoundTokens:
        tokens = dict(zip(hearing.sources, hearing.tokens))
        return SoundTokens(
            audios=tuple(tokens[i] for i in sorted(i for i in hearing.sources if i >= 0)),
            videos=tuple(tokens.get(-1 - j) for j in range(hearing.videos)),
            video_second_per_grid=self._video_second_per_grid(hearing.videos),
        )

    def sound_tokens(self, prepared: PreparedChat) -> SoundTokens | None:
        """The ``SoundTokens`` of a prepared chat (None for a Qwen-VL processor): what its audio
        placeholders and heard videos expand by (``placeholder_token_count(..., sound=...)``)."""
        if self.hearing is None:
            return None
        sources, samples = prepared.audio_sources or [], prepared.audio_samples or []
        videos = 0 if prepared.video_grid_thw is None else len(prepared.video_grid_thw)
        return self._sound_tokens(_Hearing(sources=sources, samples=samples, tokens=self.hearing.tokens(samples), videos=videos))

    def _video_second_per_grid(self, videos: int) -> tuple[float, ...]:
        """Seconds per temporal grid step of each of ``videos`` videos, as the Omni processor sets
        them (``SoundCount.video_second_per_grid``).
        Example: 2 videos -> (1.0, 1.0) (Qwen2.5-Omni), (2.0, 2.0) (Qwen3-Omni)."""
        return (self.hearing.counting.video_second_per_grid,) * videos

    def _tokenize(self, chat: _Chat, geometry: MediaGeometry, hearing: _Hearing | None = None) -> TokenizedConversation:
        grids = dict(image_grid_thw=geometry.image_grid_thw, video_grid_thw=geometry.video_grid_thw, videos=geometry.timings)
        with timed("tokenise"):
            if self._split_tokenizer is not None:
                return self._split_tokenizer(chat.messages, tools=chat.tools, options=chat.options, **grids)
            sound = None if self.hearing is None else self._sound_tokens(hearing)
            return tokenize_conversation(
                self.processor, chat.messages, markers=self.markers, tools=chat.tools, options=chat.options,
                sound=sound, **grids,
            )

    def _shrink_limits(
        self,
        chat: _Chat,
        images: list[ImageInfo],
        videos: list[VideoInfo],
        geometry: MediaGeometry,
        num_tokens: int,
        fits: Callable[[int, MediaGeometry], bool],
        hearing: _Hearing | None,
    ) -> MediaLimits | None:
        """The largest per-sample media limits under which the sample fits (None: none does).

        Only the placeholder expansions change with the limits, so a candidate's token count is
        ``num_tokens`` less the current expansions plus the candidate's (`placeholder_token_count`).
        A Qwen-Omni sample (``hearing`` set) is tokenized whole per candidate, its sounds included
        (a video heard with its sound interleaves with it), and keeps the frames of heard videos.
        """
        if hearing is not None:
            heard_video = any(source < 0 for source in hearing.sources)
            return shrink_limits(
                images, videos, self.vision, lower_frames=not heard_video,
                fits=lambda candidate: fits(len(self._tokenize(chat, candidate, hearing).input_ids), candidate),
            )

        def expansion(candidate: MediaGeometry) -> int:
            return placeholder_token_count(
                self.processor,
                MediaExpansion(
                    image_grid_thw=candidate.image_grid_thw, video_grid_thw=candidate.video_grid_thw,
                    videos=candidate.timings,
                ),
            )

        text_tokens = num_tokens - expansion(geometry)
        return shrink_limits(
            images, videos, self.vision, fits=lambda candidate: fits(text_tokens + expansion(candidate), candidate)
        )

    def encode(
        self,
        prepared: PreparedChat,
        images: Sequence[bytes],
        videos: Sequence[bytes],
        *,
        slots: PixelSlots | None = None,
        audios: Sequence[bytes] = (),
    ) -> EncodedChat:
        """Decode and patchify the media of a prepared chat, into ``slots`` of its row's pixel
        payload when given, and (Qwen-Omni) its sounds into log-mel features; raises
        ``BadSampleError`` on bad media."""
        slots = slots or PixelSlots()
        pixel_values = pixel_values_videos = None
        if images:
            pixel_values = image_pixels(
                self.processor,
                images,
                prepared.image_grid_thw.numpy(),
                uint8=self.uint8_pixels,
                max_pixels=prepared.image_max_pixels,
                fast_jpeg=self.fast_jpeg,
                apply_exif_orientation=self.apply_exif_orientation,
                out=slots.images,
                patcher=self._patcher,
            )
        if videos:
            pixel_values_videos = video_pixels(
                self.processor,
                videos,
                prepared.video_timings,
                prepared.video_grid_thw.numpy(),
                uint8=self.uint8_pixels,
                out=slots.videos,
                patcher=self._video_patcher,
                decode_threads=self.decode_threads,
            )
        seconds = (
            None
            if prepared.second_per_grid_ts is None
            else torch.tensor(prepared.second_per_grid_ts, dtype=torch.float32)
        )
        audio = self._audio_inputs(prepared, audios, videos) if self.hearing is not None else None
        with timed("rope"):
            if self.hearing is not None:
                media = OmniMedia(
                    image_grid_thw=prepared.image_grid_thw,
                    video_grid_thw=prepared.video_grid_thw,
                    audio_feature_lengths=None if audio is None else audio.audio_feature_lengths,
                    video_second_per_grid=self._video_second_per_grid(len(videos)),
                    use_audio_in_video=prepared.use_audio_in_video,
                )
                mrope = omni_position_ids(prepared.input_ids, media, spec=self.hearing.rope)
            else:
                mrope = mrope_position_ids(
                    prepared.input_ids,
                    spec=self.rope_spec,
                    image_grid_thw=prepared.image_grid_thw,
                    video_grid_thw=prepared.video_grid_thw,
                    second_per_grid_ts=seconds,
                )
        visual = VisualInputs(
            pixel_values=pixel_values,
            image_grid_thw=prepared.image_grid_thw,
            pixel_values_videos=pixel_values_videos,
            video_grid_thw=prepared.video_grid_thw,
            second_per_grid_ts=seconds if self.rope_spec.family == "qwen2.5-vl" else None,
            **(self._normalisation_constants() if self.uint8_pixels and (images or videos) else {}),
        )
        return EncodedChat(mrope_position_ids=mrope, visual=visual, audio=audio)

    def _audio_inputs(self, prepared: PreparedChat, audios: Sequence[bytes], videos: Sequence[Any]) -> AudioInputs | None:
        """Log-mel features [n_mels, sum of frames] and frames per sound of a prepared Omni chat (None: no sound)."""
        if not prepared.audio_sources:
            return None
        features = []
        padded = self.hearing.spec.padded_length(prepared.audio_samples)
        with timed("audio"):
            for source, samples in zip(prepared.audio_sources, prepared.audio_samples):
                data = audios[source] if source >= 0 else videos[-1 - source]
                waveform = decode_audio(data, self.hearing.spec, expected_samples=samples)
                features.append(audio_features(waveform, self.hearing.extractor, self.hearing.spec, padded=padded))
        return AudioInputs.of(features)

    def _normalisation_constants(self) -> dict[str, Any]:
        processor = self.processor.image_processor
        return {
            "image_mean": tuple(float(v) for v in processor.image_mean),
            "image_std": tuple(float(v) for v in processor.image_std),
            "rescale_factor": float(processor.rescale_factor),
        }
