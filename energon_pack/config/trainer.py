"""``TrainerSettings``: the trainer's settings as a config file declares them (checked, never used for packing).
"""

from __future__ import annotations

from dataclasses import dataclass

@dataclass(frozen=True, kw_only=True)
class TrainerSettings:
    """The trainer's settings as a config file declares them; packing never reads them.

    They are checked, on ``PackingConfig`` construction, by the trainer-side rules of
    ``check_training_compat`` (``global_batch_size`` vs ``topology.dp``, no MTP, CUDA graphs
    need fixed shapes). The micro-batch size is a packing setting (``PackingPolicy``).
    """

    global_batch_size: int | None = None
    mtp_num_layers: int = 0
    cuda_graphs: bool = False
