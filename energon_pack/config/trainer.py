"""``TrainerSettings``: the trainer's settings as a config file declares them (checked; only the plan loader reads one).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from energon_pack.config.values import int_problem, raise_if_problems

@dataclass(frozen=True, kw_only=True)
class TrainerSettings:
    """The trainer's settings as a config file declares them; packing never reads them.

    They are checked, on ``PackingConfig`` construction, by the trainer-side rules of
    ``check_training_compat`` (``global_batch_size`` vs ``topology.dp``, no MTP, CUDA graphs
    need fixed shapes). The micro-batch size is a packing setting (``PackingPolicy``).

    micro_batches_per_step: micro-batches each data-parallel rank runs per optimizer step
        (``global_batch_size / (micro_batch_size * dp)``); the plan loader of a balanced plan
        deals each step's ``dp * micro_batches_per_step`` rows to ranks by cost (None: rank r
        reads positions r, r + dp, ...). ``energon_pack.bridge`` sets it from Bridge's sizes.
        The one trainer setting a loader reads.
    """

    global_batch_size: int | None = None
    mtp_num_layers: int = 0
    cuda_graphs: bool = False
    micro_batches_per_step: int | None = None

    def __post_init__(self) -> None:
        raise_if_problems(type(self).__name__, self.problems())

    def problems(self) -> Iterator[str | None]:
        """One line per violated rule (None for rules that hold)."""
        yield int_problem("micro_batches_per_step", self.micro_batches_per_step, minimum=1, optional=True)
