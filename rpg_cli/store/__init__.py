"""The results store: the only package that knows SQL (and the only one that imports SQLAlchemy).

    url         the one parser of --db values (a SQLAlchemy URL or a SQLite file path)
    schema      the tables;  migrations: schema versions, upgraded in place on open
    db          Store (runs, states, evals, samples); ingestion.py's and queries.py's methods mixed in
    ingestion   Store.ingest_metrics: a run's metrics.jsonl into the store, each byte once
    opening     open_store: a --db URL to a Store (files, driver, SQLite's settings, the upgrade)
    queries     the read-only queries of the report and `rpg eval` (mixed into Store)
    bulk        many rows into one table in each dialect's fastest words (PostgreSQL: COPY, one INSERT)
    ingest      metrics.jsonl: its rules, parsing and rows, verl's validation scores (pure Python)
    jsonl       reading a job's JSONL file as untrusted input, incrementally (cursor, fingerprint)
    limits      the columns' limits and the checks of untrusted values
    scored      rpg eval's scored-samples file: written, checked, turned into rows
    light       the run states the dry run reads, with the standard library only

    store = open_store("sqlite:///runs/results.db")
    store.ingest_metrics(run_id, run_dir / "metrics.jsonl")

Importing this package imports no SQLAlchemy: the names below load their module on first use, so
`rpg sweep --dry-run` (url, light) stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rpg_cli.store.url import (
    DEFAULT_DB_URL,
    EmptyStoreError,
    NoStoreError,
    StoreError,
    display_url,
    normalize_url,
    sqlite_path,
)

if TYPE_CHECKING:
    from rpg_cli.store.db import PlannedRun, RunRecord, Store
    from rpg_cli.store.ingest import VERL_VAL_SCORER, parse_metric_lines
    from rpg_cli.store.light import run_states
    from rpg_cli.store.opening import open_store
    from rpg_cli.store.queries import ProblemScore

_LAZY = {
    "Store": "db",
    "RunRecord": "db",
    "PlannedRun": "db",
    "open_store": "opening",
    "ProblemScore": "queries",
    "parse_metric_lines": "ingest",
    "VERL_VAL_SCORER": "ingest",
    "run_states": "light",
}

__all__ = [
    "DEFAULT_DB_URL",
    "EmptyStoreError",
    "NoStoreError",
    "PlannedRun",
    "ProblemScore",
    "RunRecord",
    "Store",
    "StoreError",
    "VERL_VAL_SCORER",
    "display_url",
    "normalize_url",
    "open_store",
    "parse_metric_lines",
    "run_states",
    "sqlite_path",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"rpg_cli.store.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
