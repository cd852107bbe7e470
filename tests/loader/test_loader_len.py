"""``len()`` of a packing loader: never the sample count; rows are not known before packing."""

from __future__ import annotations

import pytest
from tqdm import tqdm

from energon_pack import PackingConfig, get_packing_loader


def test_len_raises_type_error_and_iteration_still_works(synthetic_dataset, processor):
    config = PackingConfig(seq_length=4096, num_workers=0, repeat=False)
    loader = get_packing_loader(synthetic_dataset.out_dir, config, processor)
    with pytest.raises(TypeError, match="rows .* only known after packing"):
        len(loader)
    bar = tqdm(loader, disable=True)
    assert bar.total is None, "a progress bar must not show the sample count as the number of rows"
    rows = list(loader)
    assert 0 < len(rows) < synthetic_dataset.written
    assert loader.stats()["rows"] == len(rows)
