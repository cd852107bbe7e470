"""Every name ``energon_pack`` exports resolves (the tutorials use only these)."""

from __future__ import annotations

import energon_pack


def test_every_public_name_resolves():
    unresolved = []
    for name in energon_pack.__all__:
        try:
            getattr(energon_pack, name)
        except (AttributeError, ImportError) as err:
            unresolved.append(f"{name}: {err}")
    assert not unresolved, unresolved
