"""energon_pack.bridge without Megatron-Bridge: the checkpointable iterator on real Energon loaders,
the config check on Bridge-shaped configs, and the error when Bridge is missing.

tests/bridge/test_bridge_step.py runs the same pieces through Bridge's own code (compatibility run).
"""

from __future__ import annotations

import importlib.util
import pickle
import pickletools
import types
from typing import Any

import pytest

from energon_pack.bridge import PackingIterator, check_bridge_config
from energon_pack.bridge.checks import gdn_problems
from energon_pack.config import ConfigError, PackingConfig, ParallelTopology
from energon_pack.identity import ResumeMismatchError
from energon_pack.loader import get_packing_loader
from energon_pack.metrics import RowMetrics
from tests.support.loader_runs import EAGER, row_digest

W = 4096


def make_config(**overrides: Any) -> PackingConfig:
    return PackingConfig(**{"seq_length": W, "buffer_size": 4, "max_wait_rounds": 3, **overrides})


def globals_in_pickle(state: Any) -> set[str]:
    """Every ``module.name`` a pickle of ``state`` refers to (what a restricted unpickler must allow)."""
    names, strings = set(), []
    for opcode, arg, _ in pickletools.genops(pickle.dumps(state)):
        if opcode.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE"):
            strings.append(arg)
        elif opcode.name == "STACK_GLOBAL":
            names.add(".".join(strings[-2:]))
        elif opcode.name == "GLOBAL":
            names.add(arg.replace(" ", "."))
    return names


@pytest.fixture(scope="module")
def dataset(synthetic_dataset):
    return synthetic_dataset.out_dir


@pytest.mark.slow
@pytest.mark.parametrize("num_workers", [0, 2])
def test_restore_state_continues_with_identical_rows(dataset, processor, num_workers):
    """Training loaders repeat forever; the resumed iterator yields exactly the rows that followed."""
    config = make_config(num_workers=num_workers, repeat=True)
    reference = PackingIterator(get_packing_loader(dataset, config, processor, **EAGER))
    rows = [row_digest(next(reference)) for _ in range(12)]
    for save_after in (1, 7):
        iterator = PackingIterator(get_packing_loader(dataset, config, processor, **EAGER))
        for _ in range(save_after):
            next(iterator)
        state = pickle.loads(pickle.dumps(iterator.save_state()))
        del iterator
        resumed = PackingIterator(get_packing_loader(dataset, config, processor, **EAGER))
        resumed.restore_state(state)
        assert [row_digest(next(resumed)) for _ in range(len(rows) - save_after)] == rows[save_after:]


def test_state_holds_no_class_of_ours(dataset, processor):
    """Bridge unpickles dataloader states with Energon's state classes and builtins only."""
    iterator = PackingIterator(get_packing_loader(dataset, make_config(num_workers=0), processor))
    next(iterator)
    names = globals_in_pickle(iterator.save_state())
    assert names and not [name for name in names if name.startswith("energon_pack")], sorted(names)


def test_finite_loader_cycles_epochs_and_resumes_inside_the_second(dataset, processor):
    config = make_config(num_workers=0, repeat=False)
    epoch = [row_digest(row) for row in get_packing_loader(dataset, config, processor)]
    iterator = PackingIterator(get_packing_loader(dataset, config, processor))
    rows = [row_digest(next(iterator)) for _ in range(2 * len(epoch))]
    keys = [sorted(k for row_keys, _ in part for k in row_keys) for part in (rows[: len(epoch)], rows[len(epoch):])]
    assert keys[0] == keys[1] == sorted(k for row_keys, _ in epoch for k in row_keys)

    iterator = PackingIterator(get_packing_loader(dataset, config, processor))
    save_after = len(epoch) + 2
    for _ in range(save_after):
        next(iterator)
    resumed = PackingIterator(get_packing_loader(dataset, config, processor))
    resumed.restore_state(iterator.save_state())
    assert [row_digest(next(resumed)) for _ in range(2 * len(epoch) - save_after)] == rows[save_after:]


def test_restore_refuses_a_state_of_another_config(dataset, processor):
    iterator = PackingIterator(get_packing_loader(dataset, make_config(num_workers=0), processor))
    next(iterator)
    other = PackingIterator(get_packing_loader(dataset, make_config(num_workers=0, buffer_size=8), processor))
    with pytest.raises(ResumeMismatchError, match="buffer_size"):
        other.restore_state(iterator.save_state())
    with pytest.raises(ValueError, match="not a state written by PackingIterator.save_state"):
        other.restore_state({"dataloader_state_dict": {}})


def bridge_like_config(**changes: Any) -> types.SimpleNamespace:
    """An object shaped like Megatron-Bridge's ConfigContainer, set up as packed rows need."""
    model = dict(
        calculate_per_token_loss=True, cuda_graph_impl="none", pipeline_model_parallel_size=1,
        tensor_model_parallel_size=2, context_parallel_size=2, sequence_parallel=True,
        expert_model_parallel_size=1, seq_length=W, mtp_num_layers=None,
    )
    sections = {
        "train": dict(micro_batch_size=1, global_batch_size=16),
        "validation": dict(eval_micro_batch_size=None),
        "model": model,
        "ddp": dict(average_in_collective=False),
    }
    for path, value in changes.items():
        section, name = path.split(".")
        sections[section][name] = value
    cfg = types.SimpleNamespace(**{name: types.SimpleNamespace(**values) for name, values in sections.items()})
    cfg.data_parallel_size = 4
    return cfg


PACKING = make_config(topology=ParallelTopology(tp=2, cp=2, sp=True, dp=4))


def test_bridge_config_that_fits_passes():
    assert check_bridge_config(bridge_like_config(), PACKING) is None
    provider_like = types.SimpleNamespace(packing=PACKING)
    cfg = bridge_like_config()
    cfg.dataset = provider_like
    assert check_bridge_config(cfg) is None


@pytest.mark.parametrize(
    ("changes", "fragments"),
    [
        ({"train.micro_batch_size": 2}, ["cfg.train.micro_batch_size=2", "set cfg.train.micro_batch_size = 1"]),
        ({"validation.eval_micro_batch_size": 4}, ["cfg.validation.eval_micro_batch_size=4"]),
        (
            {"model.calculate_per_token_loss": False},
            ["cfg.model.calculate_per_token_loss=False", "set cfg.model.calculate_per_token_loss = True"],
        ),
        ({"ddp.average_in_collective": True}, ["set cfg.ddp.average_in_collective = False"]),
        ({"model.cuda_graph_impl": "transformer_engine"}, ["cuda_graph_impl='transformer_engine'", "'none'"]),
        ({"model.enable_cuda_graph": True}, ["cfg.model.enable_cuda_graph=True"]),
        ({"model.pipeline_model_parallel_size": 2}, ["set cfg.model.pipeline_model_parallel_size = 1"]),
        ({"model.context_parallel_size": 4}, ["topology.cp=2", "set topology.cp: 4"]),
        ({"model.sequence_parallel": False}, ["topology.sp=True", "set topology.sp: False"]),
        ({"model.seq_length": W // 2}, [f"cfg.model.seq_length={W // 2}", f"seq_length={W}"]),
        ({"train.global_batch_size": 6}, ["global_batch_size=6"]),
        ({"model.mtp_num_layers": 1}, ["cfg.model.mtp_num_layers=1", "set cfg.model.mtp_num_layers = None"]),
    ],
)
def test_bridge_config_violations_are_named_with_their_fix(changes, fragments):
    with pytest.raises(ConfigError) as caught:
        check_bridge_config(bridge_like_config(**changes), PACKING)
    assert len(caught.value.problems) == 1, caught.value.problems
    for fragment in fragments:
        assert fragment in str(caught.value)


#: Fields of Megatron-Bridge 0.6.2's Qwen35VLModelProvider (dense) / Qwen35VLMoEModelProvider at
#: their defaults that the checks read or that mark the model (Bridge is not importable here).
QWEN35_PROVIDER = dict(
    experimental_attention_variant="gated_delta_net", linear_attention_freq=4, deterministic_mode=False,
    attention_output_gate=True, layernorm_zero_centered_gamma=True, mrope_section=[11, 11, 10], rotary_percent=0.25,
    patch_size=16, spatial_merge_size=2, temporal_patch_size=2, image_token_id=248056, video_token_id=248057,
    vision_start_token_id=248053, vision_end_token_id=248054, seq_length=262144, mtp_num_layers=None,
    calculate_per_token_loss=False, cuda_graph_impl="none", pipeline_model_parallel_size=1,
)


def qwen35_config(**model: Any) -> types.SimpleNamespace:
    """A Bridge-shaped config whose cfg.model is a Qwen3.5 provider set up for packed rows (per-token
    loss on, the packing topology), with ``model`` changes on top."""
    cfg = bridge_like_config()
    cfg.model = types.SimpleNamespace(**{
        **QWEN35_PROVIDER, **{k: v for k, v in vars(cfg.model).items() if k not in QWEN35_PROVIDER},
        "calculate_per_token_loss": True, **model,
    })
    return cfg


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_qwen35_provider_passes_and_its_converted_settings_are_named(moe):
    model = {"num_moe_experts": 256, "moe_router_topk": 8} if moe else {}
    assert check_bridge_config(qwen35_config(**model), PACKING) is None
    with pytest.raises(ConfigError) as caught:  # as AutoBridge converts a released checkpoint, plus determinism
        check_bridge_config(qwen35_config(**model, mtp_num_layers=1, deterministic_mode=True), PACKING)
    problems = caught.value.problems
    assert len(problems) == 2, problems
    assert "set cfg.model.mtp_num_layers = None after bridge.to_megatron_provider()" in problems[0]
    assert "Qwen3.5" in problems[0] and "set cfg.model.deterministic_mode = False" in problems[1]


def test_deterministic_mode_is_a_gdn_rule_only():
    assert list(gdn_problems(types.SimpleNamespace(deterministic_mode=True))) == []
    assert check_bridge_config(bridge_like_config(**{"model.deterministic_mode": True}), PACKING) is None


def test_every_violation_is_listed_at_once():
    cfg = bridge_like_config(**{
        "train.micro_batch_size": 2, "model.calculate_per_token_loss": False, "ddp.average_in_collective": True,
    })
    with pytest.raises(ConfigError) as caught:
        check_bridge_config(cfg, PACKING)
    assert len(caught.value.problems) == 3


def test_config_without_a_packing_provider_asks_for_the_packing_config():
    with pytest.raises(ValueError, match="check_bridge_config\\(cfg, packing="):
        check_bridge_config(bridge_like_config())


@pytest.mark.skipif(importlib.util.find_spec("megatron.bridge") is not None, reason="Megatron-Bridge is installed")
@pytest.mark.parametrize("name", ["PackingDatasetProvider", "forward_step"])
def test_names_that_need_bridge_name_the_extra(name):
    import energon_pack.bridge

    fix = r"pip install 'energon-pack\[bridge\]'"
    with pytest.raises(ImportError, match=rf"energon_pack.bridge.{name} needs Megatron-Bridge.*{fix}"):
        getattr(energon_pack.bridge, name)


def test_iterator_puts_the_seconds_next_waited_into_the_row(dataset, processor, monkeypatch):
    """``row["__loader_wait_s__"]``: the clock's advance while ``next()`` waited for the loader."""
    import energon_pack.bridge.iterator as iterator_module

    clock = iter([10.0, 10.25, 11.0, 11.5])  # (start, end) of each next()
    monkeypatch.setattr(iterator_module, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    iterator = PackingIterator(get_packing_loader(dataset, make_config(num_workers=0), processor))
    assert [next(iterator)["__loader_wait_s__"] for _ in range(2)] == [0.25, 0.5]


def test_packing_iterator_of_finds_it_inside_wrappers(dataset, processor):
    """Megatron-Core's ``RerunDataIterator`` keeps what it wraps as ``.iterable``; anything else is refused."""
    from energon_pack.bridge.iterator import packing_iterator_of

    iterator = PackingIterator(get_packing_loader(dataset, make_config(num_workers=0), processor))
    wrapped = types.SimpleNamespace(iterable=types.SimpleNamespace(iterable=iterator))
    assert packing_iterator_of(iterator) is iterator and packing_iterator_of(wrapped) is iterator
    assert iterator.row_metrics.keys() == RowMetrics.from_loader(iterator.loader).keys()
    with pytest.raises(TypeError, match="list_iterator does not yield through a PackingIterator.*fix:"):
        packing_iterator_of(iter([{}]))


def test_bridge_sets_micro_batches_per_step_from_its_sizes():
    from energon_pack.bridge.checks import with_step_size

    packing = with_step_size(PACKING, global_batch_size=64, micro_batch_size=1, data_parallel_size=4)
    assert packing.trainer.micro_batches_per_step == 16
    assert packing.row == PACKING.row and packing.policy == PACKING.policy and packing.loader == PACKING.loader
    with pytest.raises(ValueError, match="global_batch_size=60 is not a multiple .* fix: set the global batch to a multiple of 8"):
        with_step_size(PACKING, global_batch_size=60, micro_batch_size=1, data_parallel_size=8)


def test_provider_global_batch_must_match_bridges():
    cfg = bridge_like_config()
    cfg.dataset = types.SimpleNamespace(packing=PACKING, global_batch_size=cfg.train.global_batch_size * 2)
    with pytest.raises(ConfigError, match="cfg.dataset.global_batch_size = cfg.train.global_batch_size"):
        check_bridge_config(cfg)
