"""prepare's facts sidecar: a plan built from facts equals the measured one (rows, digest), and
stale or missing facts make plan measure and say so."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from energon_pack.config import PackingConfig
from energon_pack.core.token_rules import TOKEN_RULES_VERSION
from energon_pack.data.prepare import prepare_dataset
from energon_pack.data.synthetic import SyntheticSpec, make_records
from energon_pack.identity import encoder_fingerprint, processor_fingerprint
from energon_pack.plan.accounting import TokenAccounting
from energon_pack.plan.build import measure_dataset, measure_from_facts, measure_split, plan_split
from energon_pack.plan.facts import Facts, TextTokens, fresh_facts, local_split
from energon_pack.plan.file import open_plan
from energon_pack.qwen.card import CARD_FORMAT, ProcessorCard, file_card, file_processor_card, processor_key
from energon_pack.runtime.task_encoder import QwenVLPackingTaskEncoder


@pytest.fixture(scope="module")
def facts_dataset(tmp_path_factory, processor):
    """40 synthetic samples (images, videos, a tenth corrupt) prepared with the offline processor's text tokens."""
    root = tmp_path_factory.mktemp("facts")
    spec = SyntheticSpec(max_image_side=640, max_video_seconds=3.0, max_video_side=128, corrupt_fraction=0.1)
    records = make_records(root / "raw", 40, seed=5, spec=spec)
    prepare_dataset(records, root / "raw", root / "ds", split_ratio="3,1,0", samples_per_shard=8, progress=False, processor=processor)
    return root / "ds"


@pytest.mark.slow  # more than ~3 s: make test runs it, make test-fast leaves it out
@pytest.mark.parametrize(
    "overrides",
    [dict(seq_length=2048), dict(seq_length=1024, on_overlong="shrink"),
     dict(seq_length=2048, max_row_vision_patches=4000, max_row_media=3),
     dict(seq_length=2048, cost_model="qwen2.5-vl-7b", balance_steps=True)],
)
def test_plan_from_facts_is_the_measured_plan(facts_dataset, processor, overrides):
    config = PackingConfig(num_workers=0, **overrides)
    encoder = QwenVLPackingTaskEncoder(config, processor)
    for split in ("train", "val"):
        measured = measure_split(facts_dataset, encoder, split=split, num_workers=0, progress=False)
        from_facts, source = measure_dataset(facts_dataset, encoder, split=split, num_workers=0, progress=False)
        assert source.startswith("measured from facts"), source
        for name in ("tokens", "vision", "media", "flops"):
            assert np.array_equal(getattr(measured, name), getattr(from_facts, name)), name
        assert measured.skipped == from_facts.skipped
        planned = plan_split(measured, facts_dataset, split, encoder, config)
        assert planned.num_rows > 0
        assert planned.digest == plan_split(from_facts, facts_dataset, split, encoder, config).digest


def test_facts_record_media_and_skips(facts_dataset):
    facts = Facts.load(facts_dataset)
    columns = facts.columns
    assert len(columns["skip"]) == sum(row[1] for row in facts.meta["shards"]) == 40
    assert len(columns["media_offsets"]) == 41 and columns["media_offsets"][-1] == len(columns["kind"])
    assert set(columns["orientation"].tolist()) <= set(range(1, 9))
    assert (columns["frames"][columns["kind"] == 1] > 0).all()
    # no sound: the facts hold the columns and meta they always held, and read as no sound
    assert not facts.has_sound and "sound" not in facts.meta
    assert set(columns) == {"skip", "images", "videos", "media_bytes", "media_offsets", "fps", "kind", "width", "height",
                            "orientation", "frames", "codec", "format", "mode"}
    good = [row for row in range(40) if columns["skip"][row] == 0]
    assert [facts.sample_sounds(row) for row in good] == [([], [None] * int(columns["videos"][row])) for row in good]


def test_stale_or_other_processor_facts_measure(facts_dataset, processor, processor_qwen3, tmp_path):
    config = PackingConfig(num_workers=0, seq_length=2048)
    assert "no text tokens for this processor" in fresh_facts(facts_dataset, processor_fingerprint(processor_qwen3))
    copy = tmp_path / "ds"
    shutil.copytree(facts_dataset, copy)
    first = Facts.load(copy).meta["shards"][0][0]
    with open(copy / first, "ab") as shard:
        shard.write(b"\0" * 512)
    why = fresh_facts(copy, processor_fingerprint(processor))
    assert why.startswith("facts stale for 1 shard(s), first " + first), why
    encoder = QwenVLPackingTaskEncoder(config, processor)
    _, source = measure_dataset(copy, encoder, num_workers=0, progress=False)
    assert source.startswith("measured by preencoding every sample (facts stale"), source
    _, source = measure_dataset(facts_dataset, encoder, num_workers=0, progress=False, facts=False)
    assert source == "measured by preencoding every sample (--measure)"


@pytest.mark.parametrize("recorded", [None, TOKEN_RULES_VERSION + 1], ids=["previous-release", "other-version"])
def test_facts_of_other_token_rules_are_measured_again(facts_dataset, processor, tmp_path, recorded):
    fingerprint = processor_fingerprint(processor)
    tokens = TextTokens.load(facts_dataset, fingerprint)
    assert Facts.load(facts_dataset).meta["token_rules"] == tokens.meta["token_rules"] == TOKEN_RULES_VERSION
    assert not isinstance(fresh_facts(facts_dataset, fingerprint), str)
    copy = tmp_path / "ds"
    shutil.copytree(facts_dataset, copy)
    meta = {name: value for name, value in tokens.meta.items() if name != "token_rules"}
    TextTokens(meta=meta if recorded is None else {**meta, "token_rules": recorded}, columns=tokens.columns).save(copy)
    found = "unversioned" if recorded is None else f"v{recorded}"
    assert fresh_facts(copy, fingerprint) == (
        f"the facts counted tokens under token rules {found}, this energon_pack counts with v{TOKEN_RULES_VERSION}; "
        "fix: prepare the dataset again with this energon_pack (--processor), or keep measuring"
    )


@pytest.mark.slow
def test_cli_plan_says_facts_or_measure(facts_dataset, tmp_path):
    """First plan: facts, processor loaded (its card filed); second: facts, processor not
    loaded; --measure: preencoding. All three write the same plan."""
    (tmp_path / "p.yaml").write_text("seq_length: 2048\nnum_workers: 0\n")
    env = {**os.environ, "ENERGON_PACK_CACHE": str(tmp_path / "cache")}
    lines = []
    for run, extra in enumerate(([], [], ["--measure"])):
        done = subprocess.run(
            [sys.executable, "-m", "energon_pack.cli", "plan", str(facts_dataset), "--config", str(tmp_path / "p.yaml"),
             "--out", str(tmp_path / f"plan{run}"), *extra],
            capture_output=True, text=True, check=True, env=env,
        )
        lines.append(done.stdout)
    assert "measured from facts (.nv-meta/energon_pack.facts.npz, fresh); processor loaded, its card filed" in lines[0]
    assert "fresh; processor card " in lines[1] and "processor not loaded" in lines[1], lines[1]
    assert "measured by preencoding every sample (--measure)" in lines[2]
    assert len({text.split("digest ")[1] for text in lines}) == 1


@pytest.fixture
def card_cache(tmp_path, monkeypatch):
    """An empty user cache (processor cards are filed there)."""
    monkeypatch.setenv("ENERGON_PACK_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_plan_with_a_card_constructs_no_processor(facts_dataset, processor, card_cache, tmp_path, monkeypatch, capsys):
    import energon_pack.qwen.processor as processor_module
    from energon_pack.cli import main

    config = PackingConfig(num_workers=0, seq_length=2048)
    (tmp_path / "p.yaml").write_text("seq_length: 2048\nnum_workers: 0\n")
    assert file_processor_card(None, processor) is not None
    assert file_processor_card(None, processor) is None  # the same card is filed already

    def refuse(*args, **kwargs):
        raise AssertionError("plan constructed the processor although its card is filed")

    monkeypatch.setattr(processor_module, "load_processor", refuse)
    assert main(["plan", str(facts_dataset), "--config", str(tmp_path / "p.yaml"), "--out", str(tmp_path / "plan")]) == 0
    printed = capsys.readouterr().out
    assert f"processor card {processor_key(None)[:16]}, processor not loaded" in printed, printed
    encoder = QwenVLPackingTaskEncoder(config, processor)
    measured = plan_split(measure_split(facts_dataset, encoder, num_workers=0, progress=False), facts_dataset, "train", encoder, config)
    assert printed.split("digest ")[1].startswith(measured.digest[:16])
    assert open_plan(tmp_path / "plan").fingerprint == measured.fingerprint


@pytest.mark.parametrize(
    "overrides",
    [dict(seq_length=2048), dict(seq_length=1024, on_overlong="shrink"),
     dict(seq_length=2048, cost_model="qwen2.5-vl-7b", balance_steps=True)],
)
def test_card_accounting_measures_as_the_processor(facts_dataset, processor, overrides):
    config = PackingConfig(num_workers=0, **overrides)
    encoder = QwenVLPackingTaskEncoder(config, processor)
    card = ProcessorCard.of_processor(processor, "k")
    assert card.video_step_tokens is not None

    def load():
        raise AssertionError("a Qwen2.5-VL card counts videos itself")

    accounting = TokenAccounting.of_card(card, config, load)
    assert accounting.fingerprint == encoder_fingerprint(encoder)
    for split in ("train", "val"):
        found = fresh_facts(facts_dataset, card.fingerprint)
        with_card, with_processor = (measure_from_facts(facts_dataset, e, *found, split=split) for e in (accounting, encoder))
        for name in ("tokens", "vision", "media", "flops"):
            assert np.array_equal(getattr(with_card, name), getattr(with_processor, name)), name
        assert with_card.skipped == with_processor.skipped
    assert not accounting.loaded


def test_qwen3_card_loads_the_processor_for_videos(facts_dataset, processor_qwen3):
    from energon_pack.plan.accounting import expansion_counter
    from energon_pack.plan.build import iter_fact_samples

    card = ProcessorCard.of_processor(processor_qwen3, "k")
    assert card.video_step_tokens is None  # each step's timestamp text: only the tokenizer counts it
    accounting = TokenAccounting.of_card(card, PackingConfig(seq_length=4096), lambda: processor_qwen3)
    counter = expansion_counter(processor_qwen3)
    facts = Facts.load(facts_dataset)
    geometries = [s.geometry for s in iter_fact_samples(facts_dataset, QwenVLPackingTaskEncoder(PackingConfig(seq_length=4096), processor_qwen3),
                                                        facts, _tokens_like(facts)) if s.reason is None]
    images_only = [g for g in geometries if g.video_grid_thw is None and g.image_grid_thw is not None]
    with_video = [g for g in geometries if g.video_grid_thw is not None]
    assert images_only and with_video
    assert [card.expansion(g) for g in images_only] == [counter(g) for g in images_only]
    assert card.expansion(with_video[0]) is None
    assert [accounting.expansion(g) for g in images_only] == [counter(g) for g in images_only] and not accounting.loaded
    assert accounting.expansion(with_video[0]) == counter(with_video[0]) and accounting.loaded


def _tokens_like(facts):
    """Text tokens of zero for every fact row (geometry only)."""
    rows = len(facts.columns["skip"])
    return TextTokens(meta={"skip_reasons": []}, columns={"text_tokens": np.zeros(rows, np.int32), "skip": np.zeros(rows, np.int16)})


def test_card_round_trip_and_stale_facts(facts_dataset, processor, card_cache, tmp_path):
    key = processor_key(None)
    assert key == processor_key(None) and len(key) == 32
    assert ProcessorCard.load(key) is None
    path = file_processor_card(None, processor)
    assert path == file_card(key) and path.is_relative_to(card_cache)
    assert ProcessorCard.load(key) == ProcessorCard.of_processor(processor, key)
    path.write_text(path.read_text().replace(CARD_FORMAT, "energon_pack.processor_card/0"))
    assert ProcessorCard.load(key) is None  # another format is not read
    path.write_text("{")
    assert ProcessorCard.load(key) is None
    copy = tmp_path / "ds"
    shutil.copytree(facts_dataset, copy)
    with open(copy / Facts.load(copy).meta["shards"][0][0], "ab") as shard:
        shard.write(b"\0" * 512)
    assert fresh_facts(copy, ProcessorCard.of_processor(processor, key).fingerprint).startswith("facts stale")


def test_processor_key_follows_the_processor_files(processor, tmp_path):
    """A changed tokenizer file, chat template or image-processor setting gives another key
    (so a filed card is not found); so does the same processor at another path (the fingerprint
    names the path); a path that is neither a folder nor cached gives None."""
    folder = tmp_path / "proc"
    processor.save_pretrained(folder)
    key = processor_key(folder)
    assert key == processor_key(str(folder)) and key != processor_key(None)
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    assert processor_key(copy) != key
    files = {path.name for path in folder.iterdir()}
    assert {"tokenizer.json", "processor_config.json"} <= files, files  # transformers 5: sub-processors in processor_config
    keys = {key}
    for name, edit in (
        ("tokenizer.json", lambda text: text.replace('"<|im_end|>"', '"<|im_end|>" ', 1)),
        ("processor_config.json", lambda text: text.replace("1003520", "802816")),  # image max_pixels
        (next(n for n in sorted(files) if "chat_template" in n), lambda text: text.replace("assistant", "assistant ", 1)),
    ):
        shutil.rmtree(copy)
        shutil.copytree(folder, copy)
        before = (copy / name).read_text()
        (copy / name).write_text(edit(before))
        assert (copy / name).read_text() != before, name
        keys.add(processor_key(copy))
    assert len(keys) == 4
    assert processor_key(tmp_path / "missing") is None
    assert processor_key("NoSuchOrg/no-such-model") is None


@pytest.mark.slow  # more than ~3 s: make test runs it, make test-fast leaves it out
def test_folder_processor_card_matches_its_fingerprint(processor, tmp_path, card_cache):
    from energon_pack.qwen.processor import load_processor

    folder = tmp_path / "proc"
    processor.save_pretrained(folder)
    loaded = load_processor(folder)
    file_processor_card(folder, loaded)
    card = ProcessorCard.load(processor_key(folder))
    assert card.fingerprint == processor_fingerprint(loaded) and card.fingerprint["processor_path"] == str(folder)
    encoder = QwenVLPackingTaskEncoder(PackingConfig(seq_length=2048), loaded)
    assert card.vision == encoder.vision and card.rope == repr(encoder.rope_spec)


def test_local_split_is_energons(facts_dataset, tmp_path):
    from megatron.energon import WorkerConfig

    from energon_pack.identity import split_fingerprint
    from energon_pack.plan.build import open_split

    def energon(path, split):
        return split_fingerprint(open_split(path, split, WorkerConfig(rank=0, world_size=1, num_workers=0)), split)

    for split in ("train", "val"):
        assert local_split(facts_dataset, split) == energon(facts_dataset, split)
    copy = tmp_path / "ds"
    shutil.copytree(facts_dataset, copy)
    split_file = copy / ".nv-meta" / "split.yaml"
    shards = local_split(copy, "train")["shards"]
    split_file.write_text(split_file.read_text().replace("exclude: []", f"exclude:\n- {shards[1][0]}\n- {shards[0][0]}/somekey"))
    excluded = local_split(copy, "train")
    assert excluded == energon(copy, "train")
    assert [row[0] for row in excluded["shards"]] == [row[0] for row in shards if row[0] != shards[1][0]]
    assert excluded["excluded_samples"] == 2  # as Energon: every exclude holding a "/", shard paths too
    assert local_split(copy, "test") is None  # no shards: Energon's error, not ours
    (copy / ".nv-meta" / "dataset.yaml").write_text((copy / ".nv-meta" / "dataset.yaml").read_text() + "split_config: other.yaml\n")
    assert local_split(copy, "train") is None
    assert local_split("msc://profile/ds", "train") is None


@pytest.mark.slow  # more than ~3 s: make test runs it, make test-fast leaves it out
def test_inspect_and_simulate_read_facts(facts_dataset, processor):
    from energon_pack.cli.simulate import dataset_mix
    from energon_pack.data.inspect_dataset import prepared_samples, summarize_with_source

    with_facts, source = summarize_with_source(facts_dataset, processor=processor)
    measured, measured_source = summarize_with_source(facts_dataset, processor=processor, facts=False)
    assert source.startswith("measured from facts")
    assert measured_source == "measured by preencoding every sample (--measure)"
    assert with_facts == measured
    assert float(dict((row["metric"], row["value"]) for row in with_facts)["compressed media (MiB)"]) > 0
    samples, source = dataset_mix(str(facts_dataset))
    assert source.startswith("measured from facts")
    reference = [s for s in prepared_samples(facts_dataset, facts=False)[0] if s.reason is None]
    assert [(s.tokens, s.vision_patches, s.images, s.videos) for s in samples] == [
        (s.tokens, s.geometry.vision_patches, s.images, s.videos) for s in reference
    ]


def test_inspect_and_simulate_with_a_card_construct_no_processor(facts_dataset, processor, card_cache, monkeypatch):
    import energon_pack.qwen.processor as processor_module
    from energon_pack.cli.simulate import dataset_mix
    from energon_pack.data.inspect_dataset import prepared_samples, summarize_with_source

    def facts_of(samples):
        return [(s.reason, s.tokens, s.geometry and s.geometry.vision_patches, s.images, s.videos, s.media_bytes) for s in samples]

    reference = prepared_samples(facts_dataset, processor=processor, facts=False)[0]
    summary, _ = summarize_with_source(facts_dataset, processor=processor, facts=False)
    file_processor_card(None, processor)

    def refuse(*args, **kwargs):
        raise AssertionError("the processor was constructed although its card is filed")

    monkeypatch.setattr(processor_module, "load_processor", refuse)
    samples, source = prepared_samples(facts_dataset)
    assert source == f"measured from facts (.nv-meta/energon_pack.facts.npz, fresh; processor card {processor_key(None)[:16]}, processor not loaded)"
    assert facts_of(samples) == facts_of(reference)
    assert summarize_with_source(facts_dataset)[0] == summary
    mix, source = dataset_mix(str(facts_dataset))
    assert source.endswith("processor not loaded)") and len(mix) == sum(s.reason is None for s in reference)
