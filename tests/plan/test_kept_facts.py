"""Kept facts of a dataset read in place (``plan.kept_facts``): reused for the same key and token
rules, measured again otherwise."""

from __future__ import annotations

import json

import numpy as np

from energon_pack.core.token_rules import TOKEN_RULES_VERSION
from energon_pack.plan.build import Measurement
from energon_pack.plan.kept_facts import kept_facts_path, load_kept_facts, save_kept_facts


def _measurement() -> Measurement:
    measurement = Measurement.empty(3)
    measurement.tokens[:] = [5, 6, 7]
    measurement.skipped["overlong"] = 1
    return measurement


def test_kept_facts_are_reused_for_their_key_and_token_rules_only(tmp_path):
    path = kept_facts_path("/data/bridge_ds", "train", tmp_path)
    assert path == tmp_path / "bridge_ds.train.facts.npz"
    save_kept_facts(path, "key", _measurement())
    kept = load_kept_facts(path, "key")
    assert kept["tokens"].tolist() == [5, 6, 7] and kept["skipped"] == {"overlong": 1}
    assert load_kept_facts(path, "other") == f"kept facts at {path} were measured for another dataset, processor or packing config"
    for recorded, found in ((None, "unversioned"), (TOKEN_RULES_VERSION + 1, f"v{TOKEN_RULES_VERSION + 1}")):
        with np.load(path) as archive:
            arrays = {name: archive[name] for name in archive.files}
        meta = json.loads(arrays["meta"].tobytes())
        meta.pop("token_rules", None)
        if recorded is not None:
            meta["token_rules"] = recorded
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        with open(path, "wb") as out:
            np.savez(out, **arrays)
        assert load_kept_facts(path, "key") == (
            f"kept facts at {path} counted tokens under token rules {found}, this energon_pack counts with v{TOKEN_RULES_VERSION}"
        )
