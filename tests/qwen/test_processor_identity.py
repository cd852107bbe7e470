"""``identity.processor_fingerprint`` of a processor that hears (Qwen-Omni): its feature extractor's
settings are part of it, so a changed extractor is a resume mismatch; a Qwen-VL processor's is unchanged."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from transformers import WhisperFeatureExtractor

from energon_pack.identity import fingerprint_mismatches, processor_fingerprint

#: Qwen2.5-Omni's released ``preprocessor_config.json`` audio settings.
OMNI_AUDIO = dict(feature_size=128, sampling_rate=16000, hop_length=160, chunk_length=300, n_fft=400)


class _Tokenizer:
    name_or_path = "qwen"

    def __len__(self) -> int:
        return 151669


def _processor(**extractor: int) -> SimpleNamespace:
    return SimpleNamespace(
        tokenizer=_Tokenizer(), chat_template="{{ messages }}",
        feature_extractor=WhisperFeatureExtractor(**{**OMNI_AUDIO, **extractor}),
    )


def test_the_feature_extractor_settings_are_in_the_fingerprint() -> None:
    fingerprint = processor_fingerprint(_processor())
    assert {key: fingerprint[f"feature_extractor.{key}"] for key in OMNI_AUDIO} == OMNI_AUDIO
    assert fingerprint["feature_extractor.n_samples"] == 4_800_000
    assert fingerprint["feature_extractor.feature_extractor_type"] == "WhisperFeatureExtractor"


@pytest.mark.filterwarnings("ignore:At least one mel filter has all zero values")
@pytest.mark.parametrize(
    "change, fields",
    [
        ({"feature_size": 80}, ["feature_extractor.feature_size"]),
        ({"hop_length": 320}, ["feature_extractor.hop_length", "feature_extractor.nb_max_frames"]),
        ({"chunk_length": 30}, ["feature_extractor.chunk_length", "feature_extractor.n_samples", "feature_extractor.nb_max_frames"]),
        ({"sampling_rate": 8000}, ["feature_extractor.n_samples", "feature_extractor.nb_max_frames", "feature_extractor.sampling_rate"]),
        ({"n_fft": 512}, ["feature_extractor.n_fft"]),
    ],
)
def test_a_changed_extractor_changes_the_fingerprint(change: dict, fields: list[str]) -> None:
    assert fingerprint_mismatches(processor_fingerprint(_processor()), processor_fingerprint(_processor(**change))) == fields


def test_a_processor_without_an_extractor_keeps_its_fingerprint() -> None:
    vision_only = SimpleNamespace(tokenizer=_Tokenizer(), chat_template="{{ messages }}")
    assert sorted(processor_fingerprint(vision_only)) == ["chat_template_sha", "processor_class", "processor_path", "vocab_size"]
