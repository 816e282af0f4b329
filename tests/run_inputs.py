"""Test helper: the files the runs of a sweep read (rpg checks them before it starts a run)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


def write_inputs(root: Path, specs: Path | Iterable, keep: bool = False) -> None:
    """Under `root`, what the runs of a sweep file (or of these specs) read: their data files (one verl
    row each; `keep`: existing files are left as they are) and their local model directories (a
    config.json); hub models are left to the Hugging Face cache."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rpg_cli.datasets import VERL_SCHEMA, verl_row
    from rpg_cli.spec import load_sweep

    for spec in load_sweep(specs).expand() if isinstance(specs, Path) else specs:
        for name in (*spec.data.train_files, *spec.data.val_files):
            if keep and (root / name).exists():
                continue
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            # a training file holds a step's batch at least (rpg refuses a batch larger than the data)
            rows = spec.train_batch_size if name in spec.data.train_files else 1
            table = pa.Table.from_pylist([verl_row(f"{i}+1?", str(i + 1), "toy", i) for i in range(rows)], VERL_SCHEMA)
            pq.write_table(table, root / name)
        if spec.model.count("/") != 1:  # a local directory
            (root / spec.model).mkdir(parents=True, exist_ok=True)
            (root / spec.model / "config.json").write_text('{"max_position_embeddings": 32}')
