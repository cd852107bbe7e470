"""``PackingConfig``: every packing and loader knob in parts, validated on construction, and
``check_training_compat`` (the trainer's settings against packed-row training).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from energon_pack.config.cross_part import (
    buffer_tokens_problem,
    in_batch_problems,
    per_token_loss_problems,
    switched_buffer_unit,
    trainer_problems,
)
from energon_pack.config.loader_options import LoaderOptions
from energon_pack.config.policy import PackingPolicy
from energon_pack.config.row_layout import RowLayout
from energon_pack.config.topology import ParallelTopology
from energon_pack.config.trainer import TrainerSettings
from energon_pack.config.values import ConfigError, field_names, raise_if_problems, raise_if_unknown_keys, unknown_key_problem
from energon_pack.config.yaml_io import read_yaml_mapping, write_yaml

#: The parts of a PackingConfig, by attribute name, in serialisation order.
CONFIG_PARTS: dict[str, type] = {
    "row": RowLayout,
    "policy": PackingPolicy,
    "loader": LoaderOptions,
    "trainer": TrainerSettings,
}


#: Flat key (as in YAML files and keyword arguments) -> the part that holds it.
PART_OF_KEY: dict[str, str] = {f.name: part for part, cls in CONFIG_PARTS.items() for f in dataclasses.fields(cls)}


@dataclass(frozen=True, init=False)
class PackingConfig:
    """Every packing and loader knob, in parts, validated on construction (one ValueError listing
    every problem).

    Parts: ``row`` (:class:`RowLayout`: what a row looks like), ``policy``
    (:class:`PackingPolicy`: how bins are chosen), ``loader`` (:class:`LoaderOptions`: how Energon
    reads), ``trainer`` (:class:`TrainerSettings`: declared trainer settings, checked only).
    The row builder and the packing stage receive their parts whole; the resume fingerprint is
    derived from the parts.

    Build it from flat keys, each routed to its part (the YAML form):
    ``PackingConfig(seq_length=8192, buffer_size=16, topology=ParallelTopology(tp=1, cp=1),
    num_workers=2, repeat=False)``, or from parts: ``PackingConfig(row=RowLayout(seq_length=8192))``
    (flat keys given with a part override that part's fields). Every flat key is also readable
    as an attribute: ``config.buffer_size == config.policy.buffer_size``.
    """

    row: RowLayout
    policy: PackingPolicy
    loader: LoaderOptions
    trainer: TrainerSettings

    def __init__(
        self,
        *,
        row: RowLayout | None = None,
        policy: PackingPolicy | None = None,
        loader: LoaderOptions | None = None,
        trainer: TrainerSettings | None = None,
        **flat: Any,
    ) -> None:
        unknown = unknown_key_problem("PackingConfig", flat.keys(), PART_OF_KEY)
        if unknown:
            raise TypeError(f"{unknown}; fix: remove or rename the unknown key(s)")
        given = {"row": row, "policy": policy, "loader": loader, "trainer": trainer}
        problems: list[str] = []
        for name, cls in CONFIG_PARTS.items():
            values = {key: value for key, value in flat.items() if PART_OF_KEY[key] == name}
            if given[name] is not None:
                values = {**switched_buffer_unit(values), **values}
            try:
                part = cls(**values) if given[name] is None else dataclasses.replace(given[name], **values)
            except ConfigError as err:
                problems += err.problems
                part = None
            object.__setattr__(self, name, part)
        problems += filter(None, [buffer_tokens_problem(self.row, self.policy)])
        if self.row is not None and self.policy is not None and self.policy.mode == "in_batch":
            problems += filter(None, in_batch_problems(self.row, self.policy.micro_batch_size))
        problems += [] if self.trainer is None else filter(None, trainer_problems(
            self.row,
            micro_batch_size=None,
            global_batch_size=self.trainer.global_batch_size,
            data_parallel_size=None,
            mtp_num_layers=self.trainer.mtp_num_layers,
            cuda_graphs=self.trainer.cuda_graphs,
        ))
        raise_if_problems("PackingConfig", problems)

    @property
    def pad_multiple(self) -> int:
        """Per-segment alignment in tokens (:attr:`RowLayout.pad_multiple`)."""
        return self.row.pad_multiple

    # ----------------------------------------------------------------------- (de)serialisation

    def to_dict(self) -> dict[str, Any]:
        """Flat mapping of every field, part after part; ``topology`` is a nested mapping."""
        return {
            key: _yaml_lists(value)  # YAML lists (``exclude``, ``blend_schedule``)
            for name in CONFIG_PARTS
            for key, value in dataclasses.asdict(getattr(self, name)).items()
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PackingConfig:
        """Build from a flat mapping (as loaded from YAML); unknown or missing keys raise ValueError.

        Example: ``PackingConfig.from_dict({"seq_length": 4096, "topology": {"cp": 2}}).pad_multiple`` -> 4.
        """
        if not isinstance(data, Mapping):
            raise ValueError(
                f"packing config must be a mapping of field names to values, got {type(data).__name__}; "
                "fix: write the config as a YAML mapping such as 'seq_length: 8192'"
            )
        topology = data.get("topology")
        raise_if_unknown_keys([
            unknown_key_problem("PackingConfig", data.keys(), PART_OF_KEY),
            unknown_key_problem("topology", topology.keys(), field_names(ParallelTopology))
            if isinstance(topology, Mapping) else None,
        ])
        required = [
            f.name for part in CONFIG_PARTS.values() for f in dataclasses.fields(part)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
        missing = [name for name in required if name not in data]
        if missing:
            raise ValueError(
                f"missing required PackingConfig key(s): {', '.join(missing)}; "
                "fix: add them, e.g. 'seq_length: 8192'"
            )
        values = dict(data)
        if "topology" in values and not isinstance(values["topology"], ParallelTopology):
            values["topology"] = ParallelTopology.from_dict(values["topology"])
        return cls(**values)

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str]) -> PackingConfig:
        """Load and validate a YAML config file; errors are prefixed with the file path."""
        data = read_yaml_mapping(path)
        try:
            return cls.from_dict(data)
        except ValueError as exc:
            raise ValueError(f"{os.fspath(path)}: {exc}") from exc

    def to_yaml(self, path: str | os.PathLike[str] | None = None) -> str:
        """YAML text of ``to_dict()`` (field order kept); also written to ``path`` when given."""
        return write_yaml(self.to_dict(), path)

    # ----------------------------------------------------------------------- resume fingerprint

    def fingerprint(self, *, token_blend: bool = False) -> dict[str, Any]:
        """The values exact resume depends on, as plain JSON-able values: those of the row layout,
        the packing policy and the loader options (not the declared trainer settings).

        A ``blend_schedule`` brings ``micro_batches_per_step`` (its steps are counted in it). The round rule enters resolved: the default round as ``buffer_tokens`` = 2 * seq_length
        (``buffer_size`` None), an explicit ``buffer_size`` as itself (states of explicit configs
        saved before the default changed still resume). The loader extends this dict (world size,
        processor identity, pixel limits, ...) before storing it in the loader state;
        ``check_resume_fingerprint`` compares two. ``token_blend``: the rows come from a share blend
        of tokens or supervised tokens, whose default round is one row (``TOKEN_BLEND_ROUND_ROWS``).
        """
        policy = self.policy.fingerprint()
        if self.policy.buffer_size is None and self.policy.buffer_tokens is None:
            policy |= self.policy.resolved_round(self.row.seq_length, token_blend=token_blend)
        if self.policy.blend_schedule is not None:  # a schedule's steps are counted in these
            policy["micro_batches_per_step"] = self.trainer.micro_batches_per_step or 1
        return {**self.row.fingerprint(), **policy, **self.loader.fingerprint()}


def _yaml_lists(value: Any) -> Any:
    """``value`` with every tuple, nested ones too, as a list (YAML has no tuples).
    Example: ``({"step": 0, "weights": (1, 2)},)`` -> ``[{"step": 0, "weights": [1, 2]}]``."""
    if isinstance(value, (tuple, list)):
        return [_yaml_lists(item) for item in value]
    if isinstance(value, dict):
        return {key: _yaml_lists(item) for key, item in value.items()}
    return value


def _part_field(part: str, name: str) -> property:
    return property(lambda self: getattr(getattr(self, part), name), doc=f"``{part}.{name}``")


for _key, _part in PART_OF_KEY.items():
    setattr(PackingConfig, _key, _part_field(_part, _key))


def check_training_compat(
    config: PackingConfig,
    *,
    finetune: bool = True,
    calculate_per_token_loss: bool,
    average_in_collective: bool,
    micro_batch_size: int = 1,
    global_batch_size: int | None = None,
    data_parallel_size: int | None = None,
    pipeline_model_parallel_size: int = 1,
    mtp_num_layers: int = 0,
    cuda_graphs: bool = False,
) -> None:
    """Check the trainer's settings against packed-row training; raise one ValueError listing all violations.

    ``global_batch_size`` / ``data_parallel_size`` default to the config's ``global_batch_size`` /
    ``topology.dp``. Per-token loss (``calculate_per_token_loss=True``,
    ``average_in_collective=False``) is needed with context parallel > 1 for packed finetuning
    (each CP rank sees a different number of loss tokens, so only summing losses and token counts
    before dividing weighs every token equally) and with ``loss_reduction`` "sample" or "square"
    (their ``loss_mask`` weights only average correctly that way). The same rules, less the
    loss flags a config cannot declare, check a config's declared trainer settings when it is built.
    Example: cp=2, finetune, calculate_per_token_loss=False -> ValueError naming calculate_per_token_loss.
    """
    problems = [
        *trainer_problems(
            config.row,
            micro_batch_size=micro_batch_size,
            global_batch_size=config.global_batch_size if global_batch_size is None else global_batch_size,
            data_parallel_size=data_parallel_size,
            pipeline_model_parallel_size=pipeline_model_parallel_size,
            mtp_num_layers=mtp_num_layers,
            cuda_graphs=cuda_graphs,
            in_batch=config.micro_batch_size if config.mode == "in_batch" else 0,
        ),
        *per_token_loss_problems(
            config.row,
            finetune=finetune,
            calculate_per_token_loss=calculate_per_token_loss,
            average_in_collective=average_in_collective,
        ),
    ]
    raise_if_problems("training setup for packed rows", problems)
