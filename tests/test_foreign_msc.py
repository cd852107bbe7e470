"""A Megatron-Bridge-format dataset on object storage (``msc://``): the dispatch reads its
dataset.yaml through Energon's EPath, and the rows equal those of the local copy."""

from __future__ import annotations

import pytest

from tests.test_msc import SKIP, _config, _rows, _upload, s3  # noqa: F401  (s3: the moto fixture)

pytest.importorskip("moto.server", reason=SKIP)

pytestmark = pytest.mark.slow


def test_bridge_rows_through_msc_equal_the_local_copy(s3, tmp_path, processor):  # noqa: F811
    from tests.bridge_datasets import PICKLED_YAML, pickled_samples, write_bridge_dataset

    local = write_bridge_dataset(tmp_path / "bridge", pickled_samples(), PICKLED_YAML)
    remote = _upload(s3, local, "bridge")
    rows = _rows(remote, _config(), processor)
    assert rows and rows == _rows(local, _config(), processor)
