"""Recording the facts sidecar while ``energon-pack prepare`` writes a dataset (format:
``energon_pack.plan.facts``, docs/on_disk_format.md).

Each written sample is read back exactly as the loader will read it
(``formats.qwen_chat.chat_fields_from_parts`` on the same parts), its media probed with the same
header probes as preencode (``qwen.media.probe_image`` / ``probe_video``) plus their
orientation, and, with a processor, its chat tokenized once to record its text tokens. The
rows are put in the dataset's index order (``.nv-meta/index.sqlite``) when the dataset is done.

A sample's facts (:meth:`FactsRecorder.sample_facts`) are plain JSON data, so worker processes
and ``prepare --part`` runs can compute them and the parent or ``energon-pack merge`` record them.
"""

from __future__ import annotations

from io import BytesIO
from pathlib import Path
from typing import Any

import numpy as np

from energon_pack.core.token_rules import TOKEN_RULES_VERSION
from energon_pack.formats.qwen_chat import chat_fields_from_parts
from energon_pack.errors import BadSampleError
from energon_pack.identity import processor_fingerprint
from energon_pack.plan.facts import FACTS_FORMAT, TOKENS_FORMAT, Facts, TextTokens, shard_table
from energon_pack.qwen.audio import AudioSpec, probe_audio
from energon_pack.qwen.media import BadMediaError, probe_image, probe_video

__all__ = ["FactsRecorder", "SampleFacts", "image_orientation", "video_orientation"]

#: One sample's facts: ``[skip reason, media rows, text tokens, text skip reason, [images, videos,
#: media bytes, audios, use_audio_in_video]]``; a media row is ``[kind (0 image, 1 video, 2 audio),
#: width, height, orientation, frames, codec, format, mode, fps, sound samples, sound from header]``
#: ("" for a string that does not apply; sound samples: an audio's, or a heard video's sound
#: track's, model-rate samples as ``qwen.audio.probe_audio`` counts them, else -1; facts of an
#: older prepare lack the sound fields). JSON round-trips it exactly.
SampleFacts = list[Any]
#: The rate and the most samples sound lengths are counted at (``qwen.audio.AudioSpec``'s defaults:
#: the released Qwen-Omni processors' 16 kHz and 300 s; a longer sound is only known to be longer).
_SOUND_SPEC = AudioSpec()

_ROTATION_TO_EXIF = {0: 1, 90: 6, 180: 3, 270: 8}


def image_orientation(data: bytes) -> int:
    """EXIF orientation 1-8 of an encoded image, from its header (1 when absent or unreadable).

    Example: a PNG without EXIF -> 1; a JPEG whose EXIF says "rotate 90 CW" -> 6.
    """
    from PIL import Image

    try:
        with Image.open(BytesIO(data)) as image:
            value = image.getexif().get(0x0112, 1)
    except Exception:  # PIL raises assorted types for odd EXIF blocks; the probe decides good or bad
        return 1
    return int(value) if value in range(1, 9) else 1


def video_orientation(data: bytes) -> int:
    """The display rotation of the first video stream as an EXIF orientation (1, 6, 3 or 8 for
    0, 90, 180, 270 degrees); decodes one frame. Example: a video without a display matrix -> 1."""
    import av

    try:
        with av.open(BytesIO(data)) as container:
            for frame in container.decode(video=0):
                return _ROTATION_TO_EXIF.get(int(round(frame.rotation)) % 360, 1)
    except (av.FFmpegError, OSError):
        return 1
    return 1


def _sound(data: bytes) -> tuple[str, int, int]:
    """``(codec, model-rate samples, 1 when the header gave them, else 0: counted by decoding)`` of
    one audio file or video sound track (``probe_audio``, counted up to ``_SOUND_SPEC.max_samples``);
    ``("", -1, 0)`` when it cannot be probed (the processor's text tokens then record the sample's
    skip reason). Example: a 1 s 16 kHz WAV -> ``("pcm_s16le", 16000, 1)``."""
    try:
        info = probe_audio(data, _SOUND_SPEC, count_up_to=_SOUND_SPEC.max_samples)
    except BadMediaError:
        return "", -1, 0
    return info.codec, info.samples, int(info.exact_from_header)


def _probe(fields: dict[str, Any]) -> tuple[str | None, list[list[Any]]]:
    """``(skip reason, media rows)`` of one sample's loader fields (rows as in ``SampleFacts``)."""
    if fields["invalid_reason"] is not None:
        return fields["invalid_reason"], []
    heard = bool(fields.get("use_audio_in_video"))
    try:
        media = []
        for data in fields["images"]:
            info = probe_image(data)
            media.append([0, info.width, info.height, image_orientation(data), 0, "", info.format, info.mode, 0.0, -1, 0])
        for data in fields["videos"]:
            info = probe_video(data)
            _, samples, from_header = _sound(data) if heard and info.has_audio else ("", -1, 0)
            media.append([1, info.width, info.height, video_orientation(data), info.num_frames, info.codec, "", "",
                          float(info.fps), samples, from_header])
    except BadSampleError as err:
        return err.reason, []
    for data in fields.get("audios", []):
        codec, samples, from_header = _sound(data)
        media.append([2, 0, 0, 1, 0, codec, "", "", 0.0, samples, from_header])
    return None, media


class FactsRecorder:
    """Measures one sample at a time (:meth:`sample_facts`), records it (:meth:`add`), then writes
    the sidecar (:meth:`write`).

    ``processor``: also measure and record the text tokens of this processor (None: facts only).
    ``fingerprint``: without a processor, the ``identity.processor_fingerprint`` of the processor
    the recorded facts' text tokens were measured with (``energon-pack merge``; None: facts only).
    Both files record this ``energon_pack``'s token-rules version (``core.token_rules``; ``merge``
    refuses parts of another).
    """

    def __init__(self, processor: Any = None, *, fingerprint: dict[str, Any] | None = None) -> None:
        self.processor = processor
        self.fingerprint = processor_fingerprint(processor) if processor is not None else fingerprint
        self._chat = None
        if processor is not None:
            from energon_pack.qwen.encode import QwenChatEncoder

            self._chat = QwenChatEncoder(processor)
        #: key -> its ``SampleFacts``.
        self.by_key: dict[str, SampleFacts] = {}

    def sample_facts(self, sample: dict[str, Any]) -> SampleFacts:
        """The facts of the WebDataset sample dict ``sample`` (``__key__`` plus its parts as bytes)."""
        fields = chat_fields_from_parts({name: value for name, value in sample.items() if name != "__key__"})
        reason, media = _probe(fields)
        text, text_reason = 0, None
        if self._chat is not None and reason is None:
            text, text_reason = self._text_tokens(fields)
        sizes = [len(fields["images"]), len(fields["videos"]), sum(map(len, fields["images"] + fields["videos"])),
                 len(fields.get("audios", [])), int(bool(fields.get("use_audio_in_video")))]
        return [reason, media, text, text_reason, sizes]

    def check_renders(self, record: Any) -> None:
        """Raise ``BadSampleError`` when this recorder's processor cannot render the chat record
        ``record`` (a ``core.conversation.ChatRecord``) as it is: tools on a template without tools
        (``template_cannot_render_tools``), an option the template never reads, a template error.
        Without a processor nothing is checked."""
        if self.processor is None:
            return
        from energon_pack.qwen.template import render_conversation

        render_conversation(self.processor, record.messages, tools=record.tools, options=record.chat_template_kwargs)

    def add(self, key: str, facts: SampleFacts) -> None:
        """Record the facts of the sample ``key``."""
        self.by_key[key] = facts

    def _text_tokens(self, fields: dict[str, Any]) -> tuple[int, str | None]:
        from energon_pack.qwen.template import MediaExpansion, placeholder_token_count

        try:
            prepared = self._chat.prepare(
                fields["conversation"], fields["images"], fields["videos"],
                tools=fields.get("tools"), chat_template_kwargs=fields.get("chat_template_kwargs"),
                audios=fields.get("audios", ()), use_audio_in_video=bool(fields.get("use_audio_in_video")),
            )
        except BadSampleError as err:
            return 0, err.reason
        expansion = placeholder_token_count(self.processor, MediaExpansion(
            image_grid_thw=None if prepared.image_grid_thw is None else prepared.image_grid_thw.numpy(),
            video_grid_thw=None if prepared.video_grid_thw is None else prepared.video_grid_thw.numpy(),
            videos=prepared.video_timings or [],
            sound=self._chat.sound_tokens(prepared),
        ))
        return len(prepared.input_ids) - expansion, None

    def write(self, folder: Path) -> Facts:
        """Write the facts (and text tokens) of the dataset at ``folder`` (its index written), in index order."""
        import sqlite3

        shards = shard_table(folder)
        with sqlite3.connect(f"file:{folder / '.nv-meta' / 'index.sqlite'}?mode=ro&immutable=1", uri=True) as db:
            keys = [key for (key,) in db.execute("SELECT sample_key FROM samples ORDER BY tar_file_id, sample_index")]
        per_sample = [self.by_key[key] for key in keys]
        reasons = sorted({r for r, *_ in per_sample if r is not None})
        text_reasons = sorted({r for _, _, _, r, _ in per_sample if r is not None})
        tables: dict[str, list[str]] = {"codecs": [], "formats": [], "modes": []}

        def code(table: str, value: str) -> int:
            values = tables[table]
            if value not in values:
                values.append(value)
            return values.index(value)

        offsets, media_rows, fps, sound_rows = [0], [], [], []
        for _, media, *_ in per_sample:
            for kind, width, height, orientation, frames, codec, image_format, mode, rate, *sound in media:
                if kind == 0:
                    media_rows.append((0, width, height, orientation, 0, 0, code("formats", image_format), code("modes", mode)))
                else:
                    media_rows.append((kind, width, height, orientation, frames, code("codecs", codec), 0, 0))
                fps.append(rate)
                sound_rows.append(sound or [-1, 0])
            offsets.append(len(media_rows))
        rows = np.array(media_rows, dtype=np.int64).reshape(-1, 8)
        columns = {
            "skip": np.array([0 if r is None else 1 + reasons.index(r) for r, *_ in per_sample], dtype=np.int16),
            "images": np.array([sizes[0] for *_, sizes in per_sample], dtype=np.int16),
            "videos": np.array([sizes[1] for *_, sizes in per_sample], dtype=np.int16),
            "media_bytes": np.array([sizes[2] for *_, sizes in per_sample], dtype=np.int64),
            "media_offsets": np.array(offsets, dtype=np.int64),
            "fps": np.array(fps, dtype=np.float64),
        }
        for position, (name, dtype) in enumerate(
            (("kind", np.uint8), ("width", np.int32), ("height", np.int32), ("orientation", np.uint8),
             ("frames", np.int32), ("codec", np.int16), ("format", np.int16), ("mode", np.int16))
        ):
            columns[name] = rows[:, position].astype(dtype)
        sound_meta = {}
        hearing = [sizes[3:5] if len(sizes) > 3 else [0, 0] for *_, sizes in per_sample]
        if any(audios or heard for audios, heard in hearing):  # facts without sound keep the columns they always had
            sounds = np.array(sound_rows, dtype=np.int64).reshape(-1, 2)
            columns.update(
                audios=np.array([audios for audios, _ in hearing], dtype=np.int16),
                use_audio_in_video=np.array([heard for _, heard in hearing], dtype=np.uint8),
                sound_samples=sounds[:, 0], sound_from_header=sounds[:, 1].astype(np.uint8),
            )
            sound_meta = {"sound": {"sampling_rate": _SOUND_SPEC.sampling_rate, "counted_up_to": _SOUND_SPEC.max_samples}}
        facts = Facts(meta={"format": FACTS_FORMAT, "shards": shards, "skip_reasons": reasons, **tables, **sound_meta,
                            "token_rules": TOKEN_RULES_VERSION}, columns=columns)
        facts.save(folder)
        if self.fingerprint is not None:
            TextTokens(
                meta={"format": TOKENS_FORMAT, "processor": self.fingerprint, "token_rules": TOKEN_RULES_VERSION,
                      "facts_digest": facts.digest, "skip_reasons": text_reasons},
                columns={
                    "text_tokens": np.array([t for _, _, t, *_ in per_sample], dtype=np.int32),
                    "skip": np.array([0 if r is None else 1 + text_reasons.index(r) for _, _, _, r, _ in per_sample], dtype=np.int16),
                },
            ).save(folder)
        return facts
