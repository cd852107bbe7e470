"""Plans of Qwen-Omni datasets from prepare's facts, for both Omni families: every sample's tokens
and skip reason from facts (through the task encoder and through the processor card) equal
preencoding it online, `energon-pack plan` reads the facts with the card without loading the
processor, and the plan loader delivers the planned rows, audio features included."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from energon_pack.config import PackingConfig
from energon_pack.plan.accounting import TokenAccounting
from energon_pack.plan.build import measure_dataset, measure_from_facts, measure_split, plan_split
from energon_pack.plan.facts import Facts, fresh_facts
from energon_pack.qwen.card import ProcessorCard, processor_key
from energon_pack.qwen.processor import load_processor
from energon_pack.runtime.task_encoder import QwenVLPackingTaskEncoder
from tests.support.omni_dataset import write_omni_records

# Slow: each family's processor is built and saved, the dataset prepared with it, rows decoded.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("omni_records")
    write_omni_records(root, clips=6)
    return root


@pytest.fixture(scope="module", params=["qwen2.5-omni", "qwen3-omni"])
def prepared(request, records, tmp_path_factory):
    """(dataset, processor folder, processor): the records prepared by ``energon-pack prepare
    --processor <folder>`` (the offline processor saved there), its card filed in a fresh cache."""
    from energon_pack.cli import main

    root = tmp_path_factory.mktemp(request.param)
    folder = root / "processor"
    load_processor(family=request.param, min_pixels=56 * 56, max_pixels=112 * 112).save_pretrained(folder)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ENERGON_PACK_CACHE", str(root / "cache"))
        code = main(["prepare", str(records / "records.jsonl"), "--media-root", str(records / "media"), "--out",
                     str(root / "ds"), "--processor", str(folder), "--samples-per-shard", "4"])
    assert code == 0
    return root / "ds", folder, load_processor(folder)


@pytest.mark.parametrize(
    "overrides",
    [dict(seq_length=4096), dict(seq_length=4096, max_audio_seconds=1.0, on_overlong_audio="skip"),
     dict(seq_length=4096, max_audio_seconds=1.0), dict(seq_length=64), dict(seq_length=40, on_overlong="shrink")],
)
def test_omni_counts_from_facts_are_the_online_counts(prepared, overrides):
    dataset, _, processor = prepared
    config = PackingConfig(num_workers=0, **overrides)
    encoder = QwenVLPackingTaskEncoder(config, processor)
    card = ProcessorCard.of_processor(processor, "k")

    def load():
        raise AssertionError("an Omni card counts images, videos and sounds itself")

    accounting = TokenAccounting.of_card(card, config, load)
    assert accounting.fingerprint["rope"] == repr(encoder.rope_spec)
    measured = measure_split(dataset, encoder, num_workers=0, progress=False)
    from_facts, source = measure_dataset(dataset, encoder, num_workers=0, progress=False)
    assert source.startswith("measured from facts"), source
    with_card = measure_from_facts(dataset, accounting, *fresh_facts(dataset, card.fingerprint))
    for found in (from_facts, with_card):
        for name in ("tokens", "vision", "media", "flops"):
            assert np.array_equal(getattr(measured, name), getattr(found, name)), name
        assert measured.skipped == found.skipped
    assert (measured.tokens > 0).sum() + sum(measured.skipped.values()) == 9
    if overrides.get("on_overlong_audio") == "skip":
        assert measured.skipped["audio_too_long"] == 5  # clips over 1 s and the 3-s sound track
    planned = plan_split(measured, dataset, "train", encoder, config)
    assert planned.digest == plan_split(from_facts, dataset, "train", encoder, config).digest


def test_facts_record_each_sound(prepared):
    facts = Facts.load(prepared[0])
    assert facts.meta["sound"] == {"sampling_rate": 16000, "counted_up_to": 4_800_000}
    sounds = [facts.sample_sounds(row) for row in range(len(facts.columns["skip"]))]
    # 16 kHz WAV and FLAC from the header, MP3 / Opus / the MP4's AAC track counted by decoding
    assert [audios for audios, _ in sounds][:6] == [[8000], [12800], [17600], [22400], [27200], [32000]]
    assert facts.columns["sound_from_header"][facts.columns["kind"] == 2].tolist() == [1, 0, 1, 0, 1, 0, 1]
    assert sounds[7][1][0] > 3 * 16000 - 1600 and sounds[8] == ([], [])


def test_cli_plan_of_omni_facts_loads_no_processor_and_the_plan_loader_delivers_it(prepared, tmp_path, monkeypatch, capsys):
    import energon_pack.qwen.processor as processor_module
    from energon_pack.cli import main
    from energon_pack.loader import get_packing_loader
    from energon_pack.plan.file import open_plan

    dataset, folder, processor = prepared
    monkeypatch.setenv("ENERGON_PACK_CACHE", str(dataset.parent / "cache"))
    (tmp_path / "p.yaml").write_text("seq_length: 256\nnum_workers: 0\n")

    def refuse(*args, **kwargs):
        raise AssertionError("plan constructed the processor although its card is filed")

    monkeypatch.setattr(processor_module, "load_processor", refuse)
    assert main(["plan", str(dataset), "--config", str(tmp_path / "p.yaml"), "--processor", str(folder),
                 "--out", str(tmp_path / "plan")]) == 0
    printed = capsys.readouterr().out
    assert f"processor card {processor_key(folder)[:16]}, processor not loaded" in printed, printed
    plan = open_plan(tmp_path / "plan")
    config = PackingConfig(seq_length=256, num_workers=0, repeat=False)
    encoder = QwenVLPackingTaskEncoder(config, processor)
    measured = plan_split(measure_split(dataset, encoder, num_workers=0, progress=False), dataset, "train", encoder, config)
    assert plan.fingerprint == measured.fingerprint and printed.split("digest ")[1].startswith(measured.digest[:16])
    rows = list(get_packing_loader(dataset, config, processor, plan=plan))
    assert len(rows) == plan.num_rows and sum(len(row["__keys__"]) for row in rows) == plan.num_samples
    assert plan.num_samples + sum(plan.skipped.values()) == 9 and plan.num_samples >= 8  # the video may be overlong
    frames = 0
    for row in rows:  # each segment as long as the plan counted it
        lengths = np.diff(row["cu_seqlens_q"].numpy()).tolist()[: len(row["__keys__"])]
        assert sorted(lengths) == sorted(plan.row_tokens(row["__plan__"]["row"]))
        if "audio_inputs" in row:
            audio = row["audio_inputs"]
            frames += int(audio.audio_feature_lengths.sum())
            assert audio.input_features.shape[1] == int(audio.audio_feature_lengths.sum())
    assert frames > 0
