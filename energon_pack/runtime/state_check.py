"""Checks of a saved loader state before it is restored.

A damaged (truncated, hand-edited) or foreign state must fail with what is wrong, never restore
into a wrong position or silently start afresh: Energon itself restarts a worker from scratch
when its saved position is missing, and asserts without a message on other damage.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from megatron.energon.savable_loader import (
    SavableDataLoaderState,
    SavableDatasetCheckpoint,
    SavableDatasetState,
)

from energon_pack.core.token_rules import check_token_rules, recorded_rules
from energon_pack.identity import check_resume_fingerprint
from energon_pack.packing.planner import is_count
from energon_pack.runtime.balanced_stage import BalancedPackingDataset, balanced_state_problems
from energon_pack.runtime.packing_stage import PendingGroupPackingDataset, packing_state_problems

_STAGE = PendingGroupPackingDataset.__name__
#: The problems of each packing stage's saved state, by the class name Energon saves it under.
_STAGE_PROBLEMS = {_STAGE: packing_state_problems, BalancedPackingDataset.__name__: balanced_state_problems}


class InvalidLoaderStateError(ValueError):
    """A loader state that cannot be restored as saved; the message lists every problem found."""


def _stage_states(tree: Any) -> Iterator[Mapping[str, Any]]:
    """Every saved packing-stage state inside a worker's nested dataset state."""
    if isinstance(tree, Mapping):
        if tree.get("__class__") in _STAGE_PROBLEMS:
            yield tree
        for value in tree.values():
            yield from _stage_states(value)
    elif isinstance(tree, (list, tuple)):
        for value in tree:
            yield from _stage_states(value)


def _worker_problems(where: str, worker_state: Any, *, in_workers: bool, packing_stage: bool) -> list[str]:
    """Problems of one worker's entry of ``SavableDataLoaderState.worker_states``."""
    if in_workers:
        if not isinstance(worker_state, SavableDatasetCheckpoint):
            return [f"{where} is a {type(worker_state).__name__}, not an Energon worker checkpoint"]
        problems = [] if is_count(worker_state.offset) else [f"{where}.offset={worker_state.offset!r} is not a count"]
        saved = worker_state.state
        if not isinstance(saved, SavableDatasetState):
            return problems + [f"{where}.state is {saved!r}: no saved position (Energon would restart this worker afresh)"]
        if not is_count(saved.sample_index):
            problems.append(f"{where}.state.sample_index={saved.sample_index!r} is not a count")
        where, dataset_state = f"{where}.state.dataset_state", saved.dataset_state
    else:
        problems, dataset_state = [], worker_state
    if not isinstance(dataset_state, Mapping):
        return problems + [f"{where} is {type(dataset_state).__name__}: no saved dataset position (Energon would start afresh)"]
    stages = list(_stage_states(dataset_state))
    if len(stages) != int(packing_stage):
        return problems + [
            f"{where} holds {len(stages)} {_STAGE} states, this loader has {int(packing_stage)}: the state of "
            "another kind of loader (another packing mode, or not energon_pack)"
        ]
    return problems + [f"{where} ({stage['__class__']}): {problem}"
                       for stage in stages for problem in _STAGE_PROBLEMS[stage["__class__"]](stage)]


def energon_state_problems(
    state: Any, *, num_workers: int, micro_batch_size: int | None = 1, packing_stage: bool = True
) -> list[str]:
    """What is wrong with Energon's rank state for a loader with ``num_workers`` workers, batches of
    ``micro_batch_size`` and (``packing_stage``) the packing stage in its workers ([] if nothing).

    ``None`` (saved before the first row) is a valid state. Example: a state saved with two
    workers whose second entry was deleted -> ``["worker_states has 1 entries, the loader has
    num_workers=2 (expects 2)"]``.
    """
    if state is None:
        return []
    if not isinstance(state, SavableDataLoaderState):
        return [f"energon_state is a {type(state).__name__}, not Energon's SavableDataLoaderState"]
    expected = max(num_workers, 1)
    problems = []
    if not isinstance(state.worker_states, list) or len(state.worker_states) != expected:
        found = len(state.worker_states) if isinstance(state.worker_states, list) else type(state.worker_states).__name__
        problems.append(f"worker_states has {found} entries, the loader has num_workers={num_workers} (expects {expected})")
    else:
        for index, worker_state in enumerate(state.worker_states):
            problems += _worker_problems(
                f"worker_states[{index}]", worker_state, in_workers=num_workers > 0, packing_stage=packing_stage
            )
    if not is_count(state.next_worker_id) or state.next_worker_id >= expected:
        problems.append(f"next_worker_id={state.next_worker_id!r} is not a worker index below {expected}")
    if state.micro_batch_size != micro_batch_size:
        problems.append(f"micro_batch_size={state.micro_batch_size!r}, this loader batches {micro_batch_size}")
    return problems


def check_loader_state(
    fingerprint: Any,
    energon_state: Any,
    worker_stats: Any,
    *,
    num_workers: int,
    micro_batch_size: int | None = 1,
    packing_stage: bool = True,
) -> None:
    """Raise ``InvalidLoaderStateError`` listing every problem of a ``PackingLoaderState``'s parts."""
    problems = []
    if not isinstance(fingerprint, Mapping):
        problems.append(f"fingerprint is a {type(fingerprint).__name__}, not a mapping")
    if not isinstance(worker_stats, Mapping):
        problems.append(f"worker_stats is a {type(worker_stats).__name__}, not a mapping")
    problems += energon_state_problems(
        energon_state, num_workers=num_workers, micro_batch_size=micro_batch_size, packing_stage=packing_stage
    )
    raise_if_state_problems(problems, saved_by="PackingDataLoader")


def raise_if_state_problems(problems: list[str], *, saved_by: str) -> None:
    """Raise ``InvalidLoaderStateError`` listing ``problems`` (nothing when empty); ``saved_by``: the
    loader class whose ``save_state_rank()`` makes valid states (named in the fix)."""
    if problems:
        raise InvalidLoaderStateError(
            "cannot restore this loader state, it is damaged or not from this kind of loader:\n  - "
            + "\n  - ".join(problems)
            + f"\nfix: restore the unmodified object that {saved_by}.save_state_rank() returned (pickled "
            "as a whole), or an earlier checkpoint; to start afresh on purpose, do not call restore_state_rank"
        )


def check_restored_type(
    state: object, state_type: type, *, loader_name: str, current_fingerprint: Mapping[str, Any],
    allow_inexact: bool, note: str = "",
) -> None:
    """The checks every loader's ``restore_state_rank`` starts with: TypeError unless ``state`` is a
    ``state_type`` (the object ``<loader_name>.save_state_rank()`` returned; ``note`` adds to the fix),
    then, when the state carries a fingerprint as a mapping (a damaged one is left to the loader's
    own state checks), its token rules (``TokenRulesError``, also with ``allow_inexact``: a state
    of other token rules holds other counts) and the rest against ``current_fingerprint``
    (`check_resume_fingerprint`).

    Example: ``check_restored_type({}, PlanLoaderState, loader_name="PlanDataLoader", ...)`` -> TypeError
    "restore_state_rank got dict; pass the object returned by PlanDataLoader.save_state_rank()".
    """
    if not isinstance(state, state_type):
        raise TypeError(
            f"restore_state_rank got {type(state).__name__}; pass the object returned by "
            f"{loader_name}.save_state_rank(){note}"
        )
    saved = getattr(state, "fingerprint", None)
    if isinstance(saved, Mapping):
        check_token_rules(
            recorded_rules(saved), f"the {loader_name} state",
            "restore it with the energon_pack release that saved it, or start this loader afresh (do not call "
            "restore_state_rank; with a plan, rebuild the plan first)",
        )
        check_resume_fingerprint(saved, current_fingerprint, allow_inexact=allow_inexact)
