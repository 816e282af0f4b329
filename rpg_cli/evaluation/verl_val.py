"""The validation metrics a training run logged itself (verl's, or the local backend's in verl's format),
copied from its metrics.jsonl into the `evals` table under verl's own names.

verl logs `val-core/<data_source>/acc/mean@N`, `.../acc/best@N/mean`, `.../acc/maj@N/mean` and more
(`val-aux/...`: std@N, worst@N/..., and best/maj for smaller N). They are stored with
scorer "verl-val", benchmark = verl's data source name, metric = verl's name with N written k
(`mean@k`, `best@k/mean`, `maj@k/std`, ...) and k = N. verl's best@N and maj@N are bootstrap
estimates (subsets of N drawn with replacement), biased low: they are never labelled pass@k, and
verl's std@N (spread of samples within a problem) is not rpg's std@k; the scorer label keeps them apart.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rpg_cli.store import Store

VERL_SCORER = "verl-val"
VERL_SCORER_VERSION = "verl-validation"
_KEY = re.compile(
    r"^val-(?:core|aux)/(?P<source>.+)/acc/(?P<name>(?:mean|std|best|worst|maj)@(?P<n>\d+)(?:/(?:mean|std))?)$"
)


def verl_val_rows(run_id: str, records: list[tuple[int, dict[str, Any]]]) -> list[dict[str, Any]]:
    """`evals` rows for the accuracy validation metrics in (step, data) records; the last value of a
    (step, key) wins, as in the metrics table."""
    rows: dict[tuple[int, str, str, int], dict[str, Any]] = {}
    for step, data in records:
        for key, value in data.items():
            match = _KEY.match(key)
            if match is None or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            metric = re.sub(r"@\d+", "@k", match["name"])
            row = {"run_id": run_id, "step": step, "benchmark": match["source"], "metric": metric,
                   "k": int(match["n"]), "scorer": VERL_SCORER,
                   "value": None if math.isnan(value) else float(value), "scorer_version": VERL_SCORER_VERSION}  # fmt: skip
            rows[(step, match["source"], metric, int(match["n"]))] = row
    return list(rows.values())


def ingest_verl_val_metrics(store: Store, run_id: str, metrics_path: str | Path) -> int:
    """Copy the run's logged validation accuracy into `evals`; returns the rows written (0 without a file).

    Idempotent (rows are upserted on run, step, benchmark, metric, k, scorer), so it can run after
    every metrics ingestion of a sweep, or once when a run is evaluated.
    """
    from rpg_cli.store import parse_metric_lines

    path = Path(metrics_path)
    try:
        chunk = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        return 0
    records, _ = parse_metric_lines(chunk)
    return store.record_evals(verl_val_rows(run_id, records))
