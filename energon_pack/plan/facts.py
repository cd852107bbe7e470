"""Per-sample facts of a prepared dataset (recorded by ``energon-pack prepare``), so that
``plan``, ``simulate --dataset`` and ``inspect`` need no pass over the tars.

Two NumPy ``.npz`` files under ``.nv-meta/`` (read with ``allow_pickle=False``; a JSON ``meta``
member carries the format version), described in docs/on_disk_format.md:

* ``energon_pack.facts.npz`` (``energon_pack.facts/1``), independent of the processor: per
  sample (index order: shard, then position in it) ``skip`` int16 (0 good, else 1 + position
  in ``meta.skip_reasons``), ``images`` / ``videos`` int16 and ``media_bytes`` int64 (the
  sample's media files, skipped samples too), ``media_offsets`` int64 [N+1] (into the media
  columns, which hold the media of good samples only); per medium ``kind`` uint8 (0 image, 1 video), coded ``width`` / ``height`` int32, EXIF
  ``orientation`` uint8 (1-8; videos: display rotation as 1/6/3/8), ``frames`` int32
  (``probe_video``'s count), ``fps`` float64, ``codec`` / ``format`` / ``mode`` int16 (positions
  in ``meta.codecs`` / ``formats`` / ``modes``). ``meta.shards``: ``[[name, samples, bytes,
  keys_crc32], ...]``, checked against the dataset before use (not mtime). Datasets with sound
  (Qwen-Omni: a sample with audios or ``use_audio_in_video``) add, per sample, ``audios`` int16
  and ``use_audio_in_video`` uint8; per medium (audios are ``kind`` 2, after the sample's images
  and videos, in placeholder order, their decoder in ``codec``) ``sound_samples`` int64 (an
  audio's model-rate samples, a heard video's sound track's; -1: none or not probed) and
  ``sound_from_header`` uint8 (1: the header's exact count, 0: counted by decoding); and
  ``meta.sound``: ``{"sampling_rate": 16000, "counted_up_to": 4800000}`` (a longer sound is only
  known to be longer). Facts without these (no sound, or an older prepare) read as no sound.
* ``energon_pack.tokens-<16 hex>.npz`` (``energon_pack.text_tokens/1``), one per processor
  (hex: SHA-256 of ``identity.processor_fingerprint``): per sample ``text_tokens`` int32 (the
  chat's tokens less its media placeholders' expansion) and ``skip`` int16 (reasons this
  processor raises); ``meta.facts_digest`` ties it to the facts file.

Both metas hold ``token_rules``, the version of the token-counting rules they were measured under
(``core.token_rules``; absent in files of releases before it: ``"unversioned"``). Facts of
another version are not fresh: ``plan``, ``simulate`` and ``inspect`` measure again by
preencoding, saying why in one line.

Both are read from local datasets and from remote ones (``msc://``, through Energon's ``EPath``).
A sample's tokens from facts are ``text_tokens + placeholder_token_count(grids)``, the
additivity ``on_overlong="shrink"`` relies on too (``QwenChatEncoder._shrink_limits``).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from energon_pack.core.token_rules import recorded_rules, stale_rules
from energon_pack.qwen.media import ImageInfo, VideoInfo

__all__ = [
    "FACTS_FORMAT",
    "FACTS_NAME",
    "TOKENS_FORMAT",
    "Facts",
    "TextTokens",
    "fresh_facts",
    "local_split",
    "shard_table",
    "tokens_name",
]

FACTS_FORMAT = "energon_pack.facts/1"
TOKENS_FORMAT = "energon_pack.text_tokens/1"
FACTS_NAME = "energon_pack.facts.npz"


def tokens_name(fingerprint: dict[str, Any]) -> str:
    """File name of the text tokens of one processor fingerprint.

    Example: ``tokens_name({"vocab_size": 3})`` -> ``"energon_pack.tokens-<16 hex>.npz"``.
    """
    return f"energon_pack.tokens-{hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:16]}.npz"


def _meta_file(dataset: str | Path, name: str) -> Any:
    """``dataset/.nv-meta/name``: a ``Path`` for a local dataset, Energon's ``EPath`` for a remote
    one (``msc://profile/prefix``); both have ``is_file`` and ``read_bytes``."""
    if "://" in str(dataset):
        from megatron.energon.epathlib import EPath

        return EPath(str(dataset)) / ".nv-meta" / name
    return Path(dataset) / ".nv-meta" / name


def _shard_size(dataset: str | Path, name: str) -> int:
    if "://" in str(dataset):
        from megatron.energon.epathlib import EPath

        return (EPath(str(dataset)) / name).size()
    return (Path(dataset) / name).stat().st_size


def shard_table(dataset: str | Path) -> list[list[Any]]:
    """``[[name, samples, bytes, keys_crc32], ...]`` of every shard of a prepared dataset (local,
    or remote: ``msc://...``, its index copied to a temporary file), in its index order
    (``tar_file_id``); ``keys_crc32`` is the CRC-32 of the shard's sample keys joined by newlines.
    Example: ``[["shards/train-000000.tar", 16, 1050624, 3735928559]]``.
    """
    import sqlite3
    import tempfile

    info = json.loads(_meta_file(dataset, ".info.json").read_bytes())
    names = list(info["shard_counts"])
    keys: dict[int, list[str]] = {}
    with tempfile.TemporaryDirectory() as folder:
        index = _meta_file(dataset, "index.sqlite")
        if "://" in str(dataset):
            copy = Path(folder) / "index.sqlite"
            copy.write_bytes(index.read_bytes())
            index = copy
        with contextlib.closing(sqlite3.connect(f"file:{index}?mode=ro&immutable=1", uri=True)) as db:
            for shard, key in db.execute("SELECT tar_file_id, sample_key FROM samples ORDER BY tar_file_id, sample_index"):
                keys.setdefault(shard, []).append(key)
    return [
        [name, int(info["shard_counts"][name]), _shard_size(dataset, name), zlib.crc32("\n".join(keys.get(i, [])).encode())]
        for i, name in enumerate(names)
    ]


#: dataset.yaml of a dataset ``energon-pack prepare`` wrote (``local_split`` reads only such datasets).
_PREPARED_DATASET_YAML = {"__module__": "energon_pack", "__class__": "QwenVLChatWebdataset"}


def local_split(dataset: str | Path, split: str) -> dict[str, Any] | None:
    """``identity.split_fingerprint`` of ``split`` of a local dataset written by ``energon-pack
    prepare``, read from ``.nv-meta`` the way Energon reads it (``WebdatasetMeta.from_config``:
    split.yaml's shard patterns brace-expanded in order, less its excludes; counts from
    .info.json) without importing Energon; None for anything else (a remote or other dataset, a
    dataset.yaml with more keys, a split file Energon would refuse): then ask Energon.

    Example: ``local_split(ds, "train")`` -> ``{"split": "train", "shards": [["shards/train-000000.tar",
    100, 1050624], ...], "excluded_samples": 0}``.
    """
    import braceexpand
    import yaml

    root = Path(str(dataset))
    meta = root / ".nv-meta"
    if "://" in str(dataset) or not (meta / "split.yaml").is_file():
        return None
    try:
        config = yaml.safe_load((meta / "dataset.yaml").read_text())
        parts = yaml.safe_load((meta / "split.yaml").read_text())
        counts = json.loads((meta / ".info.json").read_text())["shard_counts"]
        if not isinstance(config, dict) or {k: v for k, v in config.items() if k != "sample_type"} != _PREPARED_DATASET_YAML:
            return None
        excludes = {name for pattern in parts.get("exclude") or [] for name in braceexpand.braceexpand(pattern)}
        names = [name for pattern in parts["split_parts"][split] for name in braceexpand.braceexpand(pattern)]
        shards = [[name, int(counts[name]), (root / name).stat().st_size] for name in names if name not in excludes]
    except (OSError, ValueError, KeyError, TypeError, AttributeError, yaml.YAMLError):
        return None
    if not shards:
        return None
    return {"split": split, "shards": shards, "excluded_samples": sum("/" in name for name in excludes)}


def _digest(meta: dict[str, Any], columns: dict[str, np.ndarray]) -> str:
    hasher = hashlib.sha256(json.dumps(meta, sort_keys=True).encode())
    for name in sorted(columns):
        array = np.ascontiguousarray(columns[name])
        hasher.update(f"{name}:{array.dtype.str}:{array.shape}".encode())
        hasher.update(array.tobytes())
    return hasher.hexdigest()


def _save(path: Path, meta: dict[str, Any], columns: dict[str, np.ndarray]) -> None:
    text = json.dumps({**meta, "digest": _digest(meta, columns)}, sort_keys=True).encode()
    with open(path, "wb") as out:
        np.savez(out, meta=np.frombuffer(text, dtype=np.uint8), **columns)


def _load(path: Any, expected: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Meta and columns of a facts or tokens file (``_meta_file``); ValueError naming the file
    when the format or the digest does not match."""
    with np.load(io.BytesIO(path.read_bytes()), allow_pickle=False) as archive:
        meta = json.loads(archive["meta"].tobytes())
        columns = {name: archive[name] for name in archive.files if name != "meta"}
    if meta.get("format") != expected:
        raise ValueError(f"{path}: format {meta.get('format')!r}, expected {expected!r}; fix: prepare the dataset again")
    digest = meta.pop("digest", None)
    if _digest(meta, columns) != digest:
        raise ValueError(f"{path}: digest mismatch (edited or truncated); fix: prepare the dataset again")
    return meta, columns


@dataclass(frozen=True, kw_only=True, eq=False)
class Facts:
    """The processor-independent facts file in memory (see the module docstring)."""

    meta: dict[str, Any]
    columns: dict[str, np.ndarray]

    @property
    def digest(self) -> str:
        """SHA-256 over meta and columns (a tokens file names the facts it belongs to)."""
        return _digest(self.meta, self.columns)

    def save(self, folder: Path) -> None:
        """Write ``folder/.nv-meta/energon_pack.facts.npz``."""
        _save(Path(folder) / ".nv-meta" / FACTS_NAME, self.meta, self.columns)

    @classmethod
    def load(cls, folder: str | Path) -> Facts:
        meta, columns = _load(_meta_file(folder, FACTS_NAME), FACTS_FORMAT)
        return cls(meta=meta, columns=columns)

    def stale_shards(self, dataset: str | Path) -> list[str]:
        """Shards whose (name, samples, bytes, keys CRC) differ from the dataset's now, new ones included."""
        recorded = {row[0]: row for row in self.meta["shards"]}
        return [row[0] for row in shard_table(dataset) if recorded.get(row[0]) != row]

    @property
    def has_sound(self) -> bool:
        """Whether these facts record sounds (a dataset with audio, prepared by this release)."""
        return "sound_samples" in self.columns

    def sample_sounds(self, row: int) -> tuple[list[int], list[int | None]]:
        """``(samples of each audio, per video its sound track's samples when the sample hears its
        videos, else None)`` of good fact row ``row``, model-rate samples as ``meta.sound`` counts
        them; -1 where no count was recorded. Facts without sound: ``([], [None] * videos)``.

        Example: one 1 s clip and one video not heard -> ``([16000], [None])``.
        """
        c = self.columns
        kinds = c["kind"][int(c["media_offsets"][row]) : int(c["media_offsets"][row + 1])]
        if not self.has_sound:
            return [], [None] * int((kinds == 1).sum())
        samples = c["sound_samples"][int(c["media_offsets"][row]) : int(c["media_offsets"][row + 1])].tolist()
        heard = bool(c["use_audio_in_video"][row])
        audios = [n for kind, n in zip(kinds.tolist(), samples) if kind == 2]
        return audios, [n if heard else None for kind, n in zip(kinds.tolist(), samples) if kind == 1]

    def sample_infos(self, row: int) -> tuple[str | None, list[ImageInfo], list[VideoInfo]]:
        """``(skip reason or None, image infos, video infos)`` of fact row ``row`` (its audios: `sample_sounds`)."""
        c, meta = self.columns, self.meta
        skip = int(c["skip"][row])
        if skip:
            return meta["skip_reasons"][skip - 1], [], []
        images, videos = [], []
        for m in range(int(c["media_offsets"][row]), int(c["media_offsets"][row + 1])):
            width, height = int(c["width"][m]), int(c["height"][m])
            if c["kind"][m] == 0:
                images.append(ImageInfo(width=width, height=height, format=meta["formats"][c["format"][m]], mode=meta["modes"][c["mode"][m]]))
            elif c["kind"][m] == 1:
                videos.append(VideoInfo(num_frames=int(c["frames"][m]), fps=float(c["fps"][m]), width=width, height=height,
                                        codec=meta["codecs"][c["codec"][m]]))
        return None, images, videos


@dataclass(frozen=True, kw_only=True, eq=False)
class TextTokens:
    """One processor's text-token file in memory: ``text_tokens`` / ``skip`` per fact row."""

    meta: dict[str, Any]
    columns: dict[str, np.ndarray]

    def save(self, folder: Path) -> None:
        """Write ``folder/.nv-meta/energon_pack.tokens-<hex>.npz``."""
        _save(Path(folder) / ".nv-meta" / tokens_name(self.meta["processor"]), self.meta, self.columns)

    @classmethod
    def load(cls, folder: str | Path, fingerprint: dict[str, Any]) -> TextTokens | None:
        """The file of processor ``fingerprint``, None when there is none."""
        path = _meta_file(folder, tokens_name(fingerprint))
        if not path.is_file():
            return None
        meta, columns = _load(path, TOKENS_FORMAT)
        return cls(meta=meta, columns=columns)

    def skip_reason(self, row: int) -> str | None:
        code = int(self.columns["skip"][row])
        return None if code == 0 else self.meta["skip_reasons"][code - 1]


def fresh_facts(dataset: str | Path, fingerprint: dict[str, Any]) -> tuple[Facts, TextTokens] | str:
    """The dataset's facts and the text tokens of the processor of ``fingerprint``
    (``identity.processor_fingerprint``) when both are present and fresh, else why not (one
    phrase for the report).

    Example: a dataset prepared without ``--processor`` -> ``"no text tokens for this processor
    (prepare --processor)"``.
    """
    text = str(dataset)
    if not _meta_file(text, FACTS_NAME).is_file():
        return "no facts file (dataset not prepared by energon-pack prepare)"
    try:
        facts = Facts.load(text)
        stale = facts.stale_shards(text)
        if stale:
            return f"facts stale for {len(stale)} shard(s), first {stale[0]} (name, size, count or keys changed)"
        tokens = TextTokens.load(text, fingerprint)
    except (ValueError, OSError, KeyError) as err:
        return f"facts unreadable ({err})"
    if tokens is None or tokens.meta.get("processor") != fingerprint:
        return "no text tokens for this processor (prepare --processor)"
    if tokens.meta.get("facts_digest") != facts.digest:
        return "text tokens belong to other facts (prepare again)"
    stale = stale_rules(recorded_rules(tokens.meta), "the facts")
    if stale is not None:
        return f"{stale}; fix: prepare the dataset again with this energon_pack (--processor), or keep measuring"
    return facts, tokens
