"""``ParallelTopology``: the model-parallel layout and the per-segment alignment it implies.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from energon_pack.config.values import (
    bool_problem,
    field_names,
    int_problem,
    raise_if_problems,
    raise_if_unknown_keys,
    unknown_key_problem,
    unsupported_problem,
)

def pipeline_problem(name: str, value: Any) -> str | None:
    """Pipeline parallel (> 1) is rejected by name."""
    return unsupported_problem(
        name, value, supported=1, rule="pipeline parallel is not supported by packed THD rows in energon_pack",
        fix=f"set {name}=1 and shard the model with tp/cp/ep instead",
    )


@dataclass(frozen=True, kw_only=True)
class ParallelTopology:
    """Model-parallel layout of the training job; only its alignment consequences matter here.

    tp: tensor parallel size; cp: context parallel size; sp: sequence parallel (shards the
    sequence over the tp ranks; no effect when tp == 1); ep: expert parallel size;
    pp: pipeline parallel size (must be 1); dp: data-parallel size (informational: the
    loader takes the real rank and world size from torch.distributed).
    """

    tp: int = 1
    cp: int = 1
    sp: bool = False
    ep: int = 1
    pp: int = 1
    dp: int = 1

    def __post_init__(self) -> None:
        raise_if_problems(
            "ParallelTopology",
            [
                *(int_problem(name, getattr(self, name), minimum=1) for name in ("tp", "cp", "ep", "dp")),
                bool_problem("sp", self.sp),
                pipeline_problem("pp", self.pp),
            ],
        )

    @property
    def pad_multiple(self) -> int:
        """Alignment multiple (tokens) every packed segment is padded to.

        lcm(2*cp if cp > 1 else 1, cp*tp if sp and tp > 1 else 1): CP load balancing splits
        each segment into 2*cp chunks; sequence parallel splits the row over cp*tp ranks.
        Examples: TP1/CP1 -> 1; TP4/SP -> 4; CP2/TP4/SP -> lcm(4, 8) = 8.
        """
        cp_multiple = 2 * self.cp if self.cp > 1 else 1
        sp_multiple = self.cp * self.tp if self.sp and self.tp > 1 else 1
        return math.lcm(cp_multiple, sp_multiple)

    def to_dict(self) -> dict[str, Any]:
        """Plain mapping, e.g. ``{"tp": 1, "cp": 1, "sp": False, "ep": 1, "pp": 1, "dp": 1}``."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ParallelTopology:
        """Build from a mapping such as ``{"tp": 2, "cp": 2, "sp": True}``; unknown keys raise ValueError."""
        if not isinstance(data, Mapping):
            raise ValueError(
                f"topology={data!r}: must be a mapping such as {{tp: 2, cp: 2, sp: true}}; "
                "fix: write topology as a nested mapping"
            )
        raise_if_unknown_keys([unknown_key_problem("topology", data.keys(), field_names(cls))])
        return cls(**data)
