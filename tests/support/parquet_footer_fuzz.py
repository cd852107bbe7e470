"""Footer fuzz of ``prepare``'s Parquet input (``data.parquet_footer``): a tiny good file and
``MUTATIONS`` copies with a damaged footer (bit flips, truncations, footer lengths out of range,
broken magic, overwritten spans; seeded), prepared as one folder.

Run as ``python -m tests.support.parquet_footer_fuzz FOLDER`` (in a child process, so that an
abort cannot end the test that runs it): its last output line is the JSON of the files, rows
and skips ``prepare`` reported (``tests/data/test_parquet_footer.py`` checks them).
"""

from __future__ import annotations

import io
import json
import random
import sys
from collections import Counter
from pathlib import Path

#: Mutations by kind (300 in all).
MUTATIONS = {"flip": 150, "truncate": 50, "length": 50, "magic": 20, "overwrite": 30}
ROWS = 2


def base_file() -> bytes:
    """A Parquet file of ``ROWS`` chats, each with an embedded 8x8 PNG (pyarrow's defaults; no id
    column: every copy's records get ids from their row numbers)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    png = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 30, 30)).save(png, format="PNG")
    chat = json.dumps([{"role": "user", "content": "<image>What?"}, {"role": "assistant", "content": "Red."}])
    table = pa.table({
        "messages": [chat] * ROWS,
        "images": [[{"bytes": png.getvalue(), "path": None}]] * ROWS,
    })
    out = io.BytesIO()
    pq.write_table(table, out)
    return out.getvalue()


def mutations(base: bytes, seed: int = 0) -> list[tuple[str, bytes]]:
    """``(kind, bytes)`` of every mutation of ``base``'s footer (the footer, its length field and
    the magic bytes), deterministic for ``seed``."""
    rng = random.Random(seed)
    size = len(base)
    length = int.from_bytes(base[-8:-4], "little")
    start = size - 8 - length
    out = []
    for kind, count in MUTATIONS.items():
        for _ in range(count):
            data = bytearray(base)
            if kind == "flip":
                for _ in range(rng.choice((1, 1, 2, 3))):
                    data[rng.randrange(start, size)] ^= 1 << rng.randrange(8)
            elif kind == "truncate":
                data = data[: rng.randrange(max(start - 16, 0), size)]
            elif kind == "length":
                wrong = rng.choice((0, 1, length - 1, length + 1, size - 11, size, 2**31, 2**32 - 1, rng.randrange(2**32)))
                data[-8:-4] = wrong.to_bytes(4, "little")
            elif kind == "magic":
                data[rng.choice((0, 1, 2, 3, size - 4, size - 3, size - 2, size - 1))] ^= 1 << rng.randrange(8)
            else:
                at = rng.randrange(start, size - 8)
                span = rng.randrange(1, 64)
                data[at : at + span] = bytes(rng.randrange(256) for _ in range(min(span, size - 8 - at)))
            out.append((kind, bytes(data)))
    return out


def run(folder: Path) -> dict:
    """Write the good file and the mutations into ``folder/input``, prepare it, and count."""
    from energon_pack.data.parquet_records import TableInput
    from energon_pack.data.prepare import prepare_dataset

    base = base_file()
    table = folder / "input"
    table.mkdir(parents=True)
    (table / "000-good.parquet").write_bytes(base)
    for index, (kind, data) in enumerate(mutations(base)):
        (table / f"{index + 1:03d}-{kind}.parquet").write_bytes(data)
    opened = TableInput(table)
    lines = [line for line, _ in opened.records()]
    report = prepare_dataset(table, folder, folder / "out", samples_per_shard=1000, progress=False)
    reasons = Counter(problem.reason for problem in report.problems)
    named = {problem.detail.split(":")[0] for problem in report.problems if problem.reason == "unreadable_file"}
    return {
        "files": len(opened.files),
        "unreadable_files": sorted(path.name for path in opened.unreadable),
        "named_unreadable": sorted(named),
        "lines": lines,
        "written": report.written,
        "problems": len(report.problems),
        "reasons": dict(reasons),
    }


if __name__ == "__main__":
    print(json.dumps(run(Path(sys.argv[1]))))
