"""Running worker scripts under torchrun from the tests: the ranks' environment."""

from __future__ import annotations

import os

from tests.support.paths import REPO


def torchrun_env() -> dict[str, str]:
    """Environment for torchrun ranks: offline, one thread each, this checkout first on the path."""
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
