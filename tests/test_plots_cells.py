"""`rpg report --plot` over a grid with more cells than a legend can hold (report/plots.py MAX_CELLS): one
line and band per method, the line the mean of its cells' mean curves, the band their 95% interval over
cells; at most MAX_CELLS cells keep one line per cell (a report with one cell per method is drawn as
before: tests/test_report.py). A real SQLite store filled through metrics.jsonl ingestion."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rpg_cli import report, stats
from rpg_cli.orchestration.plan import RunPlan
from rpg_cli.report.plots import CELLS_MEANING, MAX_CELLS, plot_lines
from rpg_cli.store import open_store

LRS = (1e-6, 2e-6, 3e-6, 4e-6, 5e-6)  # 3 methods x 5 learning rates = 15 cells > MAX_CELLS


def reward(alg: str, lr: float, seed: int, step: int) -> float:
    return {"grpo": 0.1, "dapo": 0.2, "rpg": 0.3}[alg] + lr * 1e4 + 0.01 * seed + step / 100


@pytest.fixture
def store(tmp_path):
    s = open_store(f"sqlite:///{tmp_path / 'results.db'}")
    n = 0
    for alg, kl in (("grpo", "none"), ("dapo", "none"), ("rpg", "urkl")):
        for lr in LRS:
            for seed in (0, 1):
                n += 1
                run_id = f"r{n:04d}"
                spec = {"algorithm": alg, "kl": kl, "seed": seed, "lr": lr, "model": "m/x", "context": "2k"}
                s.record_plan(
                    RunPlan(
                        id=run_id,
                        name=f"{alg}-{n}",
                        sweep="grid",
                        backend="local",
                        spec=spec,
                        run_dir=tmp_path / "runs" / run_id,
                        entrypoint=["true"],
                    )
                )
                path = tmp_path / f"{run_id}.jsonl"
                rows = ({"step": t, "data": {"critic/score/mean": reward(alg, lr, seed, t)}} for t in range(1, 11))
                path.write_text("".join(json.dumps(r) + "\n" for r in rows))
                s.ingest_metrics(run_id, path)
    yield s
    s.close()


def test_more_cells_than_a_legend_holds_draw_one_line_and_band_per_method(store):
    assert 3 * len(LRS) > MAX_CELLS
    fig = report.plot_training(store, metrics=["reward"])
    (ax,) = [a for a in fig.axes if a.get_visible()]
    assert [line.get_label() for line in ax.get_lines()] == [
        "GRPO (5 cells, 10 runs)",
        "DAPO (5 cells, 10 runs)",
        "RPG-URKL (5 cells, 10 runs)",
    ]
    assert len(ax.collections) == 3  # one band per method
    (legend,) = fig.legends
    assert len(legend.get_texts()) == 3
    assert CELLS_MEANING in fig._suptitle.get_text()
    # GRPO's line: the mean over its cells of each cell's mean over seeds; its band over the 5 cell means
    cells = [[reward("grpo", lr, 0, t) / 2 + reward("grpo", lr, 1, t) / 2 for t in range(1, 11)] for lr in LRS]
    band = stats.curve_band([(range(1, 11), c) for c in cells], bounds=(None, 1.0))
    grpo = ax.get_lines()[0]
    assert list(grpo.get_xdata()) == list(range(1, 11))
    assert list(grpo.get_ydata()) == pytest.approx(list(np.mean(cells, axis=0)))
    (path,) = ax.collections[0].get_paths()
    assert path.vertices[:, 1].min() == pytest.approx(np.nanmin(band.low))
    assert path.vertices[:, 1].max() == pytest.approx(np.nanmax(band.high))
    thin = report.plot_training(store, metrics=["reward"], per_seed=True)
    assert len(thin.axes[0].get_lines()) == 3 + 30  # every run as a thin line under its method's


def test_up_to_max_cells_each_cell_keeps_its_line(store):
    runs = store.runs()
    some = [r for r in runs if r.spec["lr"] in LRS[:4]]  # 3 x 4 = 12 cells: one line each
    lines = plot_lines(some)
    assert len(lines) == MAX_CELLS and all(len(line.cells) == 1 and len(line.cells[0]) == 2 for line in lines)
    assert lines[0].label == "GRPO (lr=1e-06)"
    grouped = plot_lines(runs)
    assert [(line.label, len(line.cells)) for line in grouped] == [("GRPO", 5), ("DAPO", 5), ("RPG-URKL", 5)]
