"""`rpg report` and `rpg_cli.report` on real SQLite stores filled by the tests with known values:
Last/Best, mean over seeds with a seeds-only interval (benchmark means: no samples here; the
per-problem intervals are test_compare.py's), bold/underline, the four text formats, --compare-paper, plots
(files and figure objects), run summaries with --where, and bad input."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
import statistics
from pathlib import Path

import pytest
from helpers import eval_row
from typer.testing import CliRunner

from rpg_cli import report, rundir, stats
from rpg_cli.cli import app
from rpg_cli.orchestration.plan import RunPlan
from rpg_cli.states import STATUSES
from rpg_cli.store import open_store

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def spec(
    algorithm: str,
    kl: str = "none",
    seed: int = 0,
    optimizer: str = "adamw",
    context: str = "4k",
    model: str = "Qwen/Qwen3-4B",
    clip=(0.2, 0.28),
) -> dict:
    return {
        "algorithm": algorithm,
        "kl": kl,
        "seed": seed,
        "optimizer": optimizer,
        "context": context,
        "model": model,
        "beta": 1e-4,
        "lr": 1e-6,
        "clip": None if clip is None else {"eps_low": clip[0], "eps_high": clip[1], "c": 10.0},
    }


PROTOCOL = {"n": 32, "temperature": 1.0, "top_p": 0.7, "max_tokens": 4096, "seed": 0}
SHOWN = "n=32 T=1 top_p=0.7 max_tokens=4096 seed=0"  # PROTOCOL in a source line


def val_shown() -> str:
    """The protocol of logged validation of a spec that sets none: the spec's defaults (seed not kept: 0)."""
    from rpg_cli.report.scores import protocol_text
    from rpg_cli.spec import val_sampling

    return protocol_text({**val_sampling({"context": "4k"}), "seed": 0})


class Filler:
    """Records runs in a store and gives them metrics (through metrics.jsonl ingestion) and evals."""

    def __init__(self, store, root: Path):
        self.store, self.root, self.n = store, root, 0

    def run(self, spec_: dict, sweep: str = "sw", name: str | None = None, status: str | None = "succeeded") -> str:
        """A run recorded in `status` (None: as planned, pending): a table holds finished runs only."""
        self.n += 1
        run_id = f"r{self.n:04d}"
        name = name or f"{spec_['algorithm']}-{spec_['kl']}-s{spec_['seed']}-{run_id}"
        plan = RunPlan(
            id=run_id,
            name=name,
            sweep=sweep,
            backend="local",
            spec=spec_,
            run_dir=self.root / sweep / name,
            entrypoint=["true"],
        )
        self.store.record_plan(plan)
        if status is not None:
            self.store.set_status(run_id, status)
        return run_id

    def metrics(self, run_id: str, rows: dict[int, dict[str, float]]) -> None:
        path = self.root / f"{run_id}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps({"step": s, "data": d}) + "\n" for s, d in sorted(rows.items())))
        self.store.ingest_metrics(run_id, path)

    def evals(
        self,
        run_id: str,
        bench: str,
        values: dict[int, float],
        metric: str = "mean@32",
        k: int = 32,
        scorer: str = "dapo",
        **protocol,
    ) -> None:
        self.store.record_evals(
            eval_row(
                run_id=run_id,
                step=step,
                benchmark=bench,
                metric=metric,
                k=k,
                value=v,
                scorer=scorer,
                **{**PROTOCOL, **protocol},
            )
            for step, v in values.items()
        )


@pytest.fixture
def db(tmp_path):
    return f"sqlite:///{tmp_path / 'results.db'}"


@pytest.fixture
def store(db):
    s = open_store(db)
    yield s
    s.close()


@pytest.fixture
def fill(store, tmp_path):
    return Filler(store, tmp_path / "runs")


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


# ------------------------------------------------------------------------------- a known grid

# Evaluated at steps 5, 10, 15: values chosen so that Last != Best and seeds differ.
GRID = {
    # (algorithm, kl, seed): {benchmark: {step: value}}
    ("grpo", "none", 0): {"aime24": {5: 0.30, 10: 0.40, 15: 0.35}, "aime25": {5: 0.20, 10: 0.25, 15: 0.22}},
    ("dapo", "none", 0): {"aime24": {5: 0.35, 10: 0.45, 15: 0.50}, "aime25": {5: 0.30, 10: 0.28, 15: 0.26}},
    ("rpg", "ufkl", 0): {"aime24": {5: 0.40, 10: 0.60, 15: 0.55}, "aime25": {5: 0.33, 10: 0.36, 15: 0.34}},
    ("rpg", "ufkl", 1): {"aime24": {5: 0.42, 10: 0.50, 15: 0.45}, "aime25": {5: 0.31, 10: 0.40, 15: 0.38}},
}


@pytest.fixture
def grid(fill):
    ids = {}
    for (alg, kl, seed), benches in GRID.items():
        run_id = fill.run(spec(alg, kl, seed))
        ids[(alg, kl, seed)] = run_id
        for bench, values in benches.items():
            fill.evals(run_id, bench, values)
    return ids


def expected(key, bench):
    values = GRID[key][bench]
    return values[max(values)], max(values.values())


def row_of(table, method):
    rows = [r for g in table.groups for r in g.rows if r.method == method]
    assert len(rows) == 1, [r.method for g in table.groups for r in g.rows]
    return rows[0]


def test_last_best_and_mean_interval_over_seeds(store, grid):
    table = report.build_table(store, compare_paper=True)
    assert table.metric == "mean@32"
    assert table.benchmarks == ["aime24", "aime25"]
    assert [(g.model, g.context) for g in table.groups] == [("Qwen3-4B", "4K")]
    assert [r.method for r in table.groups[0].rows] == ["GRPO", "DAPO", "RPG-UFKL"]  # the paper's order
    for key, method in ((("grpo", "none", 0), "GRPO"), (("dapo", "none", 0), "DAPO")):
        row = row_of(table, method)
        for bench in ("aime24", "aime25"):
            last, best = expected(key, bench)
            assert row.cells[(bench, "last")].mean == pytest.approx(last)
            assert row.cells[(bench, "best_test")].mean == pytest.approx(best)
            assert row.cells[(bench, "last")].low is None and row.cells[(bench, "last")].n == 1
    rpg = row_of(table, "RPG-UFKL")
    assert len(rpg.runs) == 2
    for bench in ("aime24", "aime25"):
        lasts = [expected(("rpg", "ufkl", s), bench)[0] for s in (0, 1)]
        bests = [expected(("rpg", "ufkl", s), bench)[1] for s in (0, 1)]
        assert rpg.cells[(bench, "last")].mean == pytest.approx(statistics.fmean(lasts))
        interval = stats.score_from_means(lasts)  # benchmark means only: an interval over the seeds
        assert (rpg.cells[(bench, "last")].low, rpg.cells[(bench, "last")].high) == (interval.low, interval.high)
        assert rpg.cells[(bench, "last")].covers == stats.MEANS_ONLY
        assert rpg.cells[(bench, "best_test")].mean == pytest.approx(statistics.fmean(bests))
        assert rpg.cells[(bench, "best_test")].n == 2
    assert report.build_table(store).which == ("last",)  # the test-selected Best only beside the paper


def test_bold_best_and_underline_second_per_column(store, grid):
    table = report.build_table(store, compare_paper=True)
    ranks = {(r.method, col): r.cells[col].rank for r in table.groups[0].rows for col in table.columns}
    # aime24 Last: GRPO .35, DAPO .50, RPG mean(.55,.45)=.50 -> DAPO and RPG tie for best, GRPO second
    assert ranks[("DAPO", ("aime24", "last"))] == 1 and ranks[("RPG-UFKL", ("aime24", "last"))] == 1
    assert ranks[("GRPO", ("aime24", "last"))] == 2
    # aime24 Best: GRPO .40, DAPO .50, RPG mean(.60,.50)=.55
    assert [ranks[(m, ("aime24", "best_test"))] for m in ("RPG-UFKL", "DAPO", "GRPO")] == [1, 2, None]
    # aime25 Best: GRPO .25, DAPO .30, RPG mean(.36,.40)=.38
    assert [ranks[(m, ("aime25", "best_test"))] for m in ("RPG-UFKL", "DAPO", "GRPO")] == [1, 2, None]
    md = report.to_markdown(table)
    rpg_line = next(line for line in md.splitlines() if line.startswith("| RPG-UFKL"))
    best = stats.score_from_means([0.60, 0.50])  # aime24 Best: mean .55, an interval over the two seeds
    assert f"**55.0 [{best.low * 100:.1f}, {best.high * 100:.1f}]**" in rpg_line
    grpo_line = next(line for line in md.splitlines() if line.startswith("| GRPO"))
    assert "<u>35.0</u>" in grpo_line and "**" not in grpo_line


def test_markdown_csv_json_shapes(store, grid):
    table = report.build_table(store, compare_paper=True)
    md = report.to_markdown(table)
    rows = [line for line in md.splitlines() if line.startswith("|")]
    assert len(rows) == 2 + 3  # header, alignment, one per method
    assert all(line.count("|") == rows[0].count("|") for line in rows)
    assert "aime24 Last" in rows[0] and "aime25 Best (test-selected)" in rows[0]

    records = list(csv.DictReader(io.StringIO(report.to_csv(table))))
    assert [r["method"] for r in records] == ["GRPO", "DAPO", "RPG-UFKL"]
    assert float(records[1]["aime24_last_mean"]) == pytest.approx(0.50)
    assert records[1]["aime24_last_low"] == "" and records[2]["aime24_last_low"] != ""  # one seed: no interval
    assert records[2]["seeds"] == "2"

    doc = json.loads(report.to_json(table))
    assert doc["metric"] == "mean@32" and doc["benchmarks"] == ["aime24", "aime25"]
    cell = doc["groups"][0]["rows"][2]["cells"]["aime25"]["best_test"]
    assert cell["mean"] == pytest.approx(0.38) and cell["n"] == 2 and cell["rank"] == 1
    assert cell["low"] < 0.38 < cell["high"] and cell["covers"] == stats.MEANS_ONLY


def _balanced(text: str) -> bool:
    depth = 0
    for i, ch in enumerate(text):
        if ch in "{}" and i > 0 and text[i - 1] == "\\":
            continue
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth < 0:
            return False
    return depth == 0


def test_latex_is_structurally_sound(store, grid):
    tex = report.to_latex(report.build_table(store, compare_paper=True))
    assert _balanced(tex)
    assert tex.count("\\begin{tabular}") == tex.count("\\end{tabular}") == 1
    ncols = len(re.search(r"\\begin\{tabular\}\{(\w+)\}", tex).group(1))
    body = [line for line in tex.splitlines() if line.endswith("\\\\") and "&" in line]
    # every row with '&' fills all columns (multicolumn headers count their span)
    for line in body:
        spans = sum(int(n) for n in re.findall(r"\\multicolumn\{(\d+)\}", line))
        cells = line.count("&") + 1
        assert cells - len(re.findall(r"\\multicolumn", line)) + spans == ncols, line
    methods = [line.split("&")[0].strip() for line in body]
    for method in ("GRPO", "DAPO", "RPG-UFKL"):
        assert methods.count(method) == 1
    best = stats.score_from_means([0.60, 0.50])
    assert f"\\textbf{{55.0 {{\\scriptsize [{best.low * 100:.1f}, {best.high * 100:.1f}]}}}}" in tex
    assert "\\underline{35.0}" in tex


def test_groups_by_model_and_context_and_names_variants(store, fill):
    for ctx in ("2k", "8k"):
        for opt in ("adamw", "schedule_free"):
            run_id = fill.run(spec("rpg_reinforce", "urkl", optimizer=opt, context=ctx))
            fill.evals(run_id, "aime24", {10: 0.5 if opt == "adamw" else 0.4})
    run_id = fill.run(spec("rpg_reinforce", "urkl", context="2k", clip=(0.1, 0.1)))
    fill.evals(run_id, "aime24", {10: 0.3})
    other = fill.run(spec("grpo", model="Qwen/Qwen2.5-7B-Instruct", context="2k"))
    fill.evals(other, "aime24", {10: 0.2})
    table = report.build_table(store)
    assert [(g.model, g.context) for g in table.groups] == [
        ("Qwen2.5-7B-Instruct", "2K"),
        ("Qwen3-4B", "2K"),
        ("Qwen3-4B", "8K"),
    ]
    assert [r.method for r in table.groups[0].rows] == ["GRPO"]
    assert [r.method for r in table.groups[1].rows] == [
        "RPG-REINFORCE-URKL (clip 0.1/0.1, AdamW)",
        "RPG-REINFORCE-URKL (clip 0.2/0.28, AdamW)",
        "RPG-REINFORCE-URKL (clip 0.2/0.28, Schedule-Free)",
    ]
    assert [r.method for r in table.groups[2].rows] == [
        "RPG-REINFORCE-URKL (AdamW)",
        "RPG-REINFORCE-URKL (Schedule-Free)",
    ]


def test_todays_baselines_and_the_estimators_are_named_exactly_and_ordered_by_the_algorithm_table(store, fill):
    from rpg_cli.report.names import METHOD_ORDER, method_base

    rows = {
        "sapo": {**spec("sapo", clip=None), "sapo": {"tau_pos": 1.0, "tau_neg": 1.05}},
        "gspo": spec("gspo", clip=(3e-4, 4e-4)),
        "grpo_exact": {**spec("grpo"), "kl_clamp": False},
        "grpo": {**spec("grpo"), "kl_clamp": True},
        "dr_grpo": spec("dr_grpo"),
        "tis": {**spec("rpg", "urkl"), "rollout_correction": {"rollout_is": "token", "rollout_is_threshold": 2.0}},
        "rpg": spec("rpg", "urkl"),
        "custom": {**spec("custom", clip=None), "loss": "mylosses.pg:my_loss", "loss_settings": {"scale": 2.0}},
        "custom_other": {**spec("custom", clip=None), "loss": "mylosses.pg:my_loss", "loss_settings": {"scale": 3.0}},
    }
    for s in rows.values():
        fill.evals(fill.run(s), "aime24", {10: 0.5})
    table = report.build_table(store, compare_paper=True)
    assert [r.method for r in table.groups[0].rows] == [
        "GRPO",
        "GRPO (exact k3)",  # the paper ran GRPO's k3 clamped (verl's low_var_kl): the exact one is another estimator
        "RPG-URKL",
        "RPG-URKL (TIS token 2)",
        "Dr. GRPO",
        "GSPO",
        "SAPO",
        "my_loss (loss_settings=scale:2)",  # a custom loss is its function; its settings tell its runs apart
        "my_loss (loss_settings=scale:3)",
    ]
    # only the methods as the paper ran them are compared with its numbers
    assert row_of(table, "GRPO").paper_method == "GRPO" and row_of(table, "GRPO (exact k3)").paper_method is None
    assert row_of(table, "RPG-URKL (TIS token 2)").paper_method is None
    assert METHOD_ORDER.index("GRPO") < METHOD_ORDER.index("RPG-URKL") < METHOD_ORDER.index("Dr. GRPO")
    both = {"rollout_is": "sequence", "rollout_is_threshold": 5.0, "rollout_is_batch_normalize": True}
    both |= {"rollout_rs": "seq_mean_k3", "rollout_rs_threshold": 0.01}
    assert (
        method_base({**spec("grpo"), "kl_clamp": False, "kl_correction": True, "rollout_correction": both})
        == "GRPO-Corrected (exact k3, TIS sequence 5 normalized, RS seq_mean_k3 0.01)"
    )
    rs = {"rollout_is": None, "rollout_rs": "token_k1", "rollout_rs_threshold": "0.5_2.0"}
    assert method_base({**spec("gmpo"), "rollout_correction": rs}) == "GMPO (RS token_k1 0.5_2.0)"


# --------------------------------------------------------------------------- --compare-paper


def test_compare_paper_matches_by_method_model_context(store, fill):
    # the paper's table 5 (Qwen3-4B, 4K): GRPO aime24 .3458/.3677, RPG-UFKL aime25 .3625/.3979
    grpo = fill.run(spec("grpo"))
    fill.evals(grpo, "aime24", {5: 0.30, 10: 0.40, 15: 0.35})
    ufkl = fill.run(spec("rpg", "ufkl"))
    fill.evals(ufkl, "aime25", {5: 0.30, 10: 0.42})
    sf = fill.run(spec("rpg", "urkl", optimizer="schedule_free"))
    fill.evals(sf, "aime25", {5: 0.5})
    table = report.build_table(store, compare_paper=True)
    g = row_of(table, "GRPO").cells[("aime24", "last")]
    assert (g.paper, g.diff) == (pytest.approx(0.3458), pytest.approx(0.35 - 0.3458))
    b = row_of(table, "GRPO").cells[("aime24", "best_test")]
    assert (b.paper, b.diff) == (pytest.approx(0.3677), pytest.approx(0.40 - 0.3677))
    u = row_of(table, "RPG-UFKL").cells[("aime25", "best_test")]
    assert (u.paper, u.diff) == (pytest.approx(0.3979), pytest.approx(0.42 - 0.3979))
    assert row_of(table, "RPG-UFKL").paper_method == "RPG-UFKL"
    # a schedule-free run has no published counterpart
    assert row_of(table, "RPG-URKL").cells[("aime25", "last")].paper is None
    md = report.to_markdown(table)
    assert "| paper | Δ |" in md and "34.6 | +0.4" in md  # percent, the difference in points
    rec = next(r for r in csv.DictReader(io.StringIO(report.to_csv(table))) if r["method"] == "GRPO")
    assert float(rec["aime24_last_paper"]) == pytest.approx(0.3458)
    assert _balanced(report.to_latex(table))


def test_compare_paper_fills_table_7_from_the_appendix_benchmarks(store, fill):
    # Table 7: Qwen3-4B, 4K, on Minerva-Math and OlympiadBench, under the names `rpg prepare-data` gives them
    paper = report.paper_results()
    grpo = fill.run(spec("grpo"))
    fill.evals(grpo, "minerva_math", {10: 0.3})
    ufkl = fill.run(spec("rpg", "ufkl"))
    fill.metrics(ufkl, {10: {"val-core/olympiadbench/acc/mean@32": 0.5}})  # training validation, by data_source
    table = report.build_table(store, compare_paper=True)
    assert table.benchmarks == ["minerva_math", "olympiadbench"]
    m = row_of(table, "GRPO").cells[("minerva_math", "last")]
    assert m.paper == paper[("Qwen3-4B", "4K", "GRPO", "minerva_math")][0]
    o = row_of(table, "RPG-UFKL").cells[("olympiadbench", "best_test")]
    assert (o.mean, o.paper) == (0.5, paper[("Qwen3-4B", "4K", "RPG-UFKL", "olympiadbench")][1])


def test_packaged_paper_results_match_the_reference_copy():
    import os
    from importlib import resources

    shared = Path(os.environ.get("RPG_SHARED_DATA") or Path(__file__).resolve().parents[1].parent / "shared" / "data")
    reference = shared / "paper_results.csv"
    if not reference.is_file():
        pytest.skip(f"no reference data at {shared}")
    packaged = resources.files("rpg_cli").joinpath("data", "paper_results.csv").read_text(encoding="utf-8")
    assert list(csv.DictReader(io.StringIO(packaged))) == list(
        csv.DictReader(io.StringIO(reference.read_text(encoding="utf-8")))
    )


def test_paper_results_data_file_covers_the_papers_tables():
    paper = report.paper_results()
    assert {k[0] for k in paper} == {"Qwen3-4B", "Qwen2.5-7B-Instruct"}
    assert paper[("Qwen3-4B", "8K", "RPG-UFKL", "aime24")] == (0.5938, 0.6177)
    assert paper[("Qwen2.5-7B-Instruct", "2K", "RPG-REINFORCE-FKL", "amc23")] == (0.8727, 0.8727)


# -------------------------------------------------------------------- sources other than rpg eval


def test_training_validation_metrics_feed_the_table(store, fill):
    run_id = fill.run(spec("dapo"))
    fill.metrics(
        run_id,
        {
            1: {"critic/score/mean": 0.1},
            5: {
                "val-core/math_dapo/acc/mean@4": 0.25,
                "val-core/aime2025/acc/mean@4": 0.1,
                "val-core/amc_23/acc/maj@4/mean": 0.9,
            },
            10: {"val-core/math_dapo/acc/mean@4": 0.5, "val-core/aime2025/acc/mean@4": 0.05},
        },
    )
    evaluated = fill.run(spec("grpo"))
    fill.evals(evaluated, "aime24", {10: 0.7})
    table = report.build_table(store, compare_paper=True)
    assert table.benchmarks == ["aime24", "aime25"]
    dapo = row_of(table, "DAPO")
    assert (dapo.cells[("aime24", "last")].mean, dapo.cells[("aime24", "best_test")].mean) == (0.5, 0.5)
    assert (dapo.cells[("aime25", "last")].mean, dapo.cells[("aime25", "best_test")].mean) == (0.05, 0.1)
    assert row_of(table, "GRPO").cells[("aime24", "last")].mean == 0.7
    fill.run(spec("reinforce_pp"))  # never evaluated: no row, but counted
    table = report.build_table(store, compare_paper=True)
    assert [r.method for g in table.groups for r in g.rows] == ["GRPO", "DAPO"]
    assert table.sources == [
        f"rpg eval (scorer dapo, mean@32, {SHOWN}): 1 run",
        f"training validation (mean@4, {val_shown()}): 1 run",
        "not scored yet: 1 run",
    ]
    maj = report.build_table(store, metric="maj@k", compare_paper=True)
    assert maj.benchmarks == ["amc23"] and row_of(maj, "DAPO").cells[("amc23", "best_test")].mean == 0.9


AIME24_COLUMNS = [("aime24", "last"), ("aime24", "best_test")]


def test_validation_logged_before_ingestion_copied_it_is_read_from_the_metrics(tmp_path):
    """A results.db written before the store copied logged validation into `evals` (schema version 1):
    the report reads those runs' val-core metrics directly."""
    import sqlite3

    db = tmp_path / "results.db"
    con = sqlite3.connect(db)
    con.executescript((Path(__file__).resolve().parent / "data" / "results-v1.sql").read_text(encoding="utf-8"))
    con.close()
    store = open_store(f"sqlite:///{db}", create=False)
    try:
        # as recorded: one run failed, one still running: neither's logged validation stands in for a score
        (row,) = [r for g in report.build_table(store, compare_paper=True).groups for r in g.rows]
        assert (row.seeds_text, row.runs, list(row.cells)) == ("1/3", ["rpg-urkl-s1-v1run001"], AIME24_COLUMNS)
        assert [(u.seed, u.text()) for u in row.not_finished] == [
            (2, "failed at step 4: Traceback ..."),
            (3, "running, step 4"),
        ]
        for run_id in ("v1run002", "v1run003"):  # had they finished, their validation is read from `metrics`
            store.set_status(run_id, "succeeded")
        table = report.build_table(store, compare_paper=True)
    finally:
        store.close()
    # version 1 kept no protocol: the upgrade filled in what version 1 sampled with (n from k)
    assert table.sources == [
        f"rpg eval (scorer dapo, mean@4, {SHOWN.replace('n=32', 'n=4')}): 1 run",
        "training validation (mean@32): 2 runs",
    ]
    (row,) = [r for g in table.groups for r in g.rows]
    assert (row.method, len(row.runs)) == ("RPG-URKL", 3)
    assert row.cells[("aime24", "last")].mean == 0.25 and row.cells[("aime24", "last")].n == 1
    assert (row.cells[("aime25", "last")].mean, row.cells[("aime25", "best_test")].n) == (pytest.approx(0.2), 2)


def test_validation_copied_at_ingestion_is_used_under_the_papers_benchmark_names(store, fill):
    from rpg_cli.store import VERL_VAL_SCORER as VERL_SCORER

    copied = fill.run(spec("dapo"))
    fill.metrics(
        copied,
        {
            5: {
                "val-core/math_dapo/acc/mean@32": 0.2,
                "val-core/math_dapo/acc/best@32/mean": 0.9,
                "val-core/math_dapo/acc/maj@32/mean": 0.3,
                "val-aux/math_dapo/acc/std@32": 0.4,
            },
            10: {"val-core/math_dapo/acc/mean@32": 0.1},
        },
    )
    with store.engine.connect() as conn:  # the ingestion copied them into evals, as `rpg eval` names the benchmark
        copies = conn.exec_driver_sql("SELECT step, benchmark, metric, k FROM evals WHERE scorer = ?", (VERL_SCORER,))
        assert sorted(copies) == [
            (5, "aime24", "best@k/mean", 32),
            (5, "aime24", "maj@k/mean", 32),
            (5, "aime24", "mean@k", 32),
            (5, "aime24", "std@k", 32),
            (10, "aime24", "mean@k", 32),
        ]
    both = fill.run(spec("grpo"))
    fill.evals(both, "aime24", {10: 0.6}, scorer="dapo")
    fill.evals(both, "aime24", {10: 0.05}, metric="mean@k", scorer=VERL_SCORER)
    table = report.build_table(store, compare_paper=True)
    assert table.benchmarks == ["aime24"]
    assert row_of(table, "DAPO").cells[("aime24", "last")].mean == 0.1
    assert row_of(table, "DAPO").cells[("aime24", "best_test")].mean == 0.2
    assert row_of(table, "GRPO").cells[("aime24", "last")].mean == 0.6  # rpg eval wins over the copy
    maj = report.build_table(store, metric="maj@k", compare_paper=True)
    assert [r.method for g in maj.groups for r in g.rows] == ["DAPO"] and maj.metric == "maj@32"
    # verl's best@N is a biased bootstrap: never shown as pass@k
    with pytest.raises(report.ReportError, match=r"no run has pass@k scores; logged: maj@32, mean@32"):
        report.build_table(store, metric="pass@k")


def test_explicit_k_and_benchmark_selection(store, grid, fill):
    fill.evals(grid[("grpo", "none", 0)], "aime24", {5: 0.9}, metric="pass@8", k=8)
    table = report.build_table(store, metric="pass@8")
    assert [r.method for g in table.groups for r in g.rows] == ["GRPO"]
    assert report.build_table(store, benchmarks=["aime25"]).benchmarks == ["aime25"]
    with pytest.raises(report.ReportError, match="amc23.*scored: aime24, aime25"):
        report.build_table(store, benchmarks=["amc23"])


# ------------------------------------------------------------------------------------------ CLI


def test_cli_table_formats_and_output_file(db, grid, tmp_path):
    res = invoke("report", "--table", "--db", db)
    assert res.exit_code == 0, res.output
    last = stats.score_from_means([0.55, 0.45])
    assert "RPG-UFKL" in res.output and f"50.0 ±{(last.high - last.low) * 50:.1f}" in res.output
    res = invoke("report", "--table", "--format", "markdown", "--db", db)
    assert res.exit_code == 0 and res.output.startswith("## ") and "| DAPO |" in res.output
    out = tmp_path / "t" / "table.tex"
    res = invoke("report", "--table", "--db", db, "--output", str(out))  # format from the suffix
    assert res.exit_code == 0, res.output
    assert out.read_text().count("\\begin{tabular}") == 1 and str(out) in res.output
    res = invoke("report", "--table", "--format", "json", "--compare-paper", "--db", db)
    assert res.exit_code == 0
    assert json.loads(res.output)["groups"][0]["rows"][0]["cells"]["aime24"]["last"]["paper"] == pytest.approx(0.3458)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--sweep", "nope"], "no sweep 'nope' in the results store; sweeps: sw"),
        (["--metric", "maj@k"], "no run has maj@k scores; logged: mean@32"),
        (["--metric", "median"], "unknown metric 'median'"),
        (["--format", "html"], "html"),
    ],
)
def test_cli_bad_input_one_line_exit_2(db, grid, args, message):
    res = invoke("report", "--table", "--db", db, *args)
    assert res.exit_code == 2
    assert message in res.output


def test_cli_empty_and_missing_store(db, store, tmp_path):
    res = invoke("report", "--table", "--db", db)
    assert res.exit_code == 2 and "no runs yet" in res.output
    res = invoke("report", "--table", "--db", str(tmp_path / "none.db"))
    assert res.exit_code == 2 and "no results database" in res.output
    assert not (tmp_path / "none.db").exists()


def test_cli_runs_without_scores_say_so(db, fill):
    fill.run(spec("grpo"))
    res = invoke("report", "--table", "--db", db)
    assert res.exit_code == 2 and "no evaluation scores yet" in res.output


# ----------------------------------------------------------------------------------------- plots


@pytest.fixture
def curves(fill):
    ids = []
    for alg, kl, seed in (("grpo", "none", 0), ("dapo", "none", 0), ("rpg", "urkl", 0), ("rpg", "urkl", 1)):
        run_id = fill.run(spec(alg, kl, seed))
        rows = {}
        for step in range(1, 21):
            rows[step] = {
                "critic/score/mean": step / 20 + 0.1 * seed,
                "actor/entropy": 1 - step / 40,
                "response_length/mean": 100 + step,
                "actor/ppo_kl": 0.01 * step,
            }
            if alg != "dapo":
                rows[step]["actor/kl_loss"] = 0.001 * step
            if step % 5 == 0:
                rows[step]["val-core/math_dapo/acc/mean@4"] = step / 40
                rows[step]["val-core/aime2025/acc/mean@4"] = step / 80
        fill.metrics(run_id, rows)
        ids.append(run_id)
    return ids


def test_plot_figure_has_one_line_per_method_with_its_band(store, curves):
    fig = report.plot_training(store, metrics=["reward", "entropy", "response_length", "kl", "val"])
    axes = [ax for ax in fig.axes if ax.get_visible() and ax.get_title()]
    assert [ax.get_title() for ax in axes] == ["reward", "entropy", "response length", "kl", "val aime24", "val aime25"]
    for ax in axes:
        n = 2 if ax.get_title() == "kl" else 3  # kl: actor/kl_loss, which DAPO does not log
        assert len(ax.get_lines()) == n, ax.get_title()
        assert len(ax.collections) == n  # one shaded band per method
        assert ax.get_xlabel() == "training step" and ax.get_ylabel()
    labels = [line.get_label() for line in axes[0].get_lines()]
    assert labels == ["GRPO", "DAPO", "RPG-URKL (2 seeds)"]
    assert stats.BAND_MEANING in fig._suptitle.get_text()
    # the mean of the two RPG-URKL seeds (rewards step/20 and step/20 + 0.1), its band the t interval
    rpg = axes[0].get_lines()[2]
    band = stats.curve_band(
        [(range(1, 21), [s / 20 for s in range(1, 21)]), (range(1, 21), [s / 20 + 0.1 for s in range(1, 21)])],
        bounds=(None, 1.0),  # a score is at most 1: the band stops there
    )
    assert list(rpg.get_ydata()) == pytest.approx(list(band.mean))
    (verts,) = axes[0].collections[2].get_paths()
    assert verts.vertices[:, 1].max() == pytest.approx(band.high.max())
    per_seed = report.plot_training(store, metrics=["reward"], per_seed=True)
    assert len(per_seed.axes[0].get_lines()) == 3 + 4  # and one thin line per run
    assert len(fig.legends) == 1  # one legend, outside the panels
    val = axes[4].get_lines()[0]
    assert list(val.get_xdata()) == [5, 10, 15, 20] and list(val.get_ydata()) == [0.125, 0.25, 0.375, 0.5]


def test_plot_bands_stay_within_what_a_metric_can_be():
    from rpg_cli.metrics import bounds

    assert bounds("actor/entropy") == (0.0, None) and bounds("ref/kl") == (0.0, None)
    assert bounds("val-core/aime2025/acc/mean@32") == (0.0, 1.0)
    assert bounds("val-core/aime2025/reward/mean@32") == (None, None)  # a score may be negative
    assert bounds("critic/score/mean") == (None, 1.0)  # +-1 scores, shaping only subtracts
    assert bounds("actor/kl_loss") == (None, None) and bounds("actor/ppo_kl") == (None, None)


def test_plot_smoothing_is_a_trailing_moving_average(store, curves):
    assert report.smooth([1.0, 2.0, 3.0, 4.0], 2) == [1.0, 1.5, 2.5, 3.5]
    fig = report.plot_training(store, metrics=["response_length"], smooth_window=3)
    ys = list(fig.axes[0].get_lines()[0].get_ydata())
    assert ys[:3] == [101.0, 101.5, 102.0] and ys[-1] == pytest.approx(119.0)


def test_cli_plot_writes_png_and_svg(db, curves, tmp_path):
    out = tmp_path / "plots"
    res = invoke("report", "--plot", "--metrics", "reward,val", "--smooth", "2", "--output", str(out), "--db", db)
    assert res.exit_code == 0, res.output
    png, svg = out / "training-all.png", out / "training-all.svg"
    assert png.read_bytes()[:8] == PNG_MAGIC and svg.read_text().lstrip().startswith("<?xml")
    assert str(png) in res.output and str(svg) in res.output
    assert [p.name for p in out.iterdir()] and not list(out.glob(".*tmp"))


def test_cli_plot_metric_nobody_logged(db, curves, tmp_path):
    res = invoke("report", "--plot", "--metrics", "reward,grad_norm", "--output", str(tmp_path / "p"), "--db", db)
    assert res.exit_code == 2
    assert "nothing logged for grad_norm; plottable: entropy, kl, response_length, reward, val" in res.output
    assert not (tmp_path / "p").exists()


# ----------------------------------------------------------------------------------- run summary


def test_runs_summary_columns_and_where(store, fill):
    from datetime import datetime

    a = fill.run(spec("rpg", "ufkl", optimizer="schedule_free", clip=(0.1, 0.1)), status=None)
    b = fill.run(spec("grpo"), status=None)
    fill.metrics(
        a,
        {
            1: {"critic/score/mean": 0.2},
            5: {"critic/score/mean": 0.4, "val-core/math_dapo/acc/mean@4": 0.5, "val-core/aime2025/acc/mean@4": 0.3},
            6: {"critic/score/mean": 0.45},
        },
    )
    store.set_status(a, "running", at=datetime(2026, 1, 1, 10, 0, 0))
    store.set_status(a, "succeeded", at=datetime(2026, 1, 1, 11, 30, 0))
    rows = {r["id"]: r for r in report.runs_summary(store)}
    assert rows[a]["step"] == 6 and rows[a]["reward"] == 0.45 and rows[a]["val"] == pytest.approx(0.4)
    assert rows[a]["wall_s"] == 5400 and report.wall_text(5400) == "1h30m"
    assert rows[b]["step"] is None and rows[b]["wall_s"] is None
    assert [r["id"] for r in report.runs_summary(store, where=["algorithm=rpg"])] == [a]
    assert [r["id"] for r in report.runs_summary(store, where=["clip.eps_low=0.1", "optimizer!=adamw"])] == [a]
    assert [r["id"] for r in report.runs_summary(store, where=["kl=ufkl,none"])] == [a, b]
    with pytest.raises(report.ReportError, match="no spec field 'algo'"):
        report.runs_summary(store, where=["algo=rpg"])


def test_runs_summary_above_its_detail_limit_reads_no_runs_reward_accuracy_or_pace(store, fill, monkeypatch):
    """A table of sweeps shows none of them: above `detail_limit` runs they are None and never read."""
    a = fill.run(spec("rpg", "ufkl"), status=None)
    b = fill.run(spec("grpo"), status=None)
    fill.metrics(
        a, {s: {"critic/score/mean": s / 10, "timing_s/step": 2.0, "val-core/x/acc/mean@4": 0.5} for s in (1, 2)}
    )
    detail = ("reward", "val", "s_per_step", "tokens_s_per_device", "eta_s")
    full = {r["id"]: r for r in report.runs_summary(store, detail_limit=2)}
    assert (full[a]["reward"], full[a]["val"], full[a]["s_per_step"]) == (0.2, 0.5, 2.0)

    def unread(*args, **kwargs):
        raise AssertionError("read above the detail limit")

    monkeypatch.setattr(type(store), "step_times", unread)
    monkeypatch.setattr(type(store), "latest_values", unread)
    brief = {r["id"]: r for r in report.runs_summary(store, detail_limit=1)}
    assert all(brief[run][key] is None for run in (a, b) for key in detail)
    assert {run: {k: v for k, v in row.items() if k not in detail} for run, row in brief.items()} == {
        run: {k: v for k, v in row.items() if k not in detail} for run, row in full.items()
    }


def test_cli_plot_default_panels_skip_what_nobody_logged(db, fill, tmp_path):
    run_id = fill.run(spec("grpo"))
    fill.metrics(run_id, {1: {"critic/score/mean": 0.1}, 2: {"critic/score/mean": 0.3}})
    res = invoke("report", "--plot", "--output", str(tmp_path / "p"), "--db", db)
    assert res.exit_code == 0, res.output
    assert (tmp_path / "p" / "training-all.png").read_bytes()[:8] == PNG_MAGIC
    with_store = open_store(db)
    fig = report.plot_training(with_store, metrics=report.DEFAULT_PLOT_METRICS, strict=False)
    with_store.close()
    assert [ax.get_title() for ax in fig.axes if ax.get_visible()] == ["reward"]


def test_cli_runs_where_and_formats(db, store, fill):
    a = fill.run(spec("rpg", "ufkl"), name="rpg-a")
    fill.run(spec("grpo"), name="grpo-b")
    fill.metrics(a, {3: {"critic/score/mean": 0.625, "val-core/aime2025/acc/mean@4": 0.5}})
    res = invoke("runs", "--db", db, "--where", "algorithm=rpg", "--format", "json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert [(r["name"], r["step"], r["reward"], r["val"]) for r in rows] == [("rpg-a", 3, 0.625, 0.5)]
    res = invoke("runs", "--db", db, "--format", "csv")
    records = list(csv.DictReader(io.StringIO(res.output)))
    assert [r["name"] for r in records] == ["rpg-a", "grpo-b"] and records[1]["reward"] == ""
    res = invoke("runs", "--db", db, "--where", "kl!=ufkl")
    assert res.exit_code == 0 and "grpo-b" in res.output and "rpg-a" not in res.output and "val acc" in res.output
    res = invoke("runs", "--db", db, "--where", "algo=rpg")
    assert res.exit_code == 2 and "no spec field 'algo'; fields: algorithm" in res.output
    res = invoke("runs", "--db", db, "--format", "xml")
    assert res.exit_code == 2 and "allowed: table, csv, json" in res.output


def test_footer_shows_the_starting_policy_when_runs_validated_before_training(store, fill):
    """Step-0 validation is the starting policy: the footer gives its mean per model and context, so a
    table shows how far each method moved from it; runs first validated later add nothing."""
    for algorithm, start, end in (("dapo", 0.1, 0.6), ("grpo", 0.3, 0.5)):
        run_id = fill.run(spec(algorithm))
        fill.metrics(run_id, {0: {"val-core/math_dapo/acc/mean@4": start}, 10: {"val-core/math_dapo/acc/mean@4": end}})
    late = fill.run(spec("reinforce_pp"))
    fill.metrics(late, {5: {"val-core/math_dapo/acc/mean@4": 0.9}})
    table = report.build_table(store)
    assert table.sources[-1] == "starting policy (step 0) on Qwen3-4B 4K: aime24 20.0"
    assert row_of(table, "DAPO").cells[("aime24", "last")].mean == 0.6  # Last/Best unchanged by the footer


def test_report_options_are_frozen_and_the_cli_declares_their_defaults():
    """One request is one value, and `rpg report` / `rpg compare` default to what the functions do."""
    import dataclasses

    import typer.main

    from rpg_cli.cli import app

    options = report.TableOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.metric = "pass@k"
    assert report.TableOptions(benchmarks=("aime25",)) != options
    commands = typer.main.get_command(app).commands
    for command, kinds in (
        ("report", (report.TableOptions, report.PlotOptions)),
        ("compare", (report.CompareOptions,)),
    ):
        cli = {p.name: p.default for p in commands[command].params}
        cli["smooth_window"] = cli.pop("smooth", None)
        checked = 0
        for kind in kinds:
            for f in dataclasses.fields(kind):
                if f.name in cli and f.name not in ("sweep_name", "where", "step", "benchmarks", "metrics"):
                    assert cli[f.name] == f.default, (command, f.name)
                    checked += 1
        assert checked >= 4


# ------------------------------------------------------------------- runs that did not finish

DIVERGED = "rpg local backend: " + rundir.diverged(12, "actor/pg_loss is nan")  # as the local backend's job says it
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\nmore of the log"


def record_state(store, run_id: str, status: str, error: str | None = None) -> None:
    """`status` as rpg records it; a state this tree's states.py lacks yet (preempted: issue 30 item 1) skips."""
    if status not in STATUSES:
        pytest.skip(f"states.py has no {status!r} state yet")
    store.set_status(run_id, status, error=error)


def val_metrics(last_step: int, val: dict[int, float]) -> dict[int, dict[str, float]]:
    """A run's metrics through `last_step`, with logged validation (aime24's data source) at `val`'s steps."""
    return {
        s: {"critic/score/mean": 0.1, **({"val-core/math_dapo/acc/mean@32": val[s]} if s in val else {})}
        for s in range(1, last_step + 1)
    }


@pytest.fixture
def demo(store, fill):
    """The issue's demo: GRPO seeds 0-2 scored by `rpg eval`, seed 2 diverged at step 12 (its eval rows gone,
    its own validation logged at step 10, 0.95: it must never stand in); DAPO seeds 0-3 scored by their
    logged validation, seed 2 failed out of memory at step 3, seed 3 still running at step 7."""
    ids = {}
    for seed, value in ((0, 0.6), (1, 0.8), (2, None)):
        ids["grpo", seed] = run = fill.run(spec("grpo", seed=seed), name=f"grpo-s{seed}", status=None)
        fill.metrics(run, val_metrics(15 if value is not None else 12, {10: 0.95}))
        if value is not None:
            fill.evals(run, "aime24", {15: value})
            store.set_status(run, "succeeded")
    store.set_status(ids["grpo", 2], "failed", error=DIVERGED)
    for seed, last, val in ((0, 10, 0.3), (1, 10, 0.5), (2, 3, 0.9), (3, 7, 0.9)):
        ids["dapo", seed] = run = fill.run(spec("dapo", seed=seed), name=f"dapo-s{seed}", status=None)
        fill.metrics(run, val_metrics(last, {last: val}))
    for seed in (0, 1):
        store.set_status(ids["dapo", seed], "succeeded")
    store.set_status(ids["dapo", 2], "failed", error=OOM)
    store.set_status(ids["dapo", 3], "running")
    return ids


DEMO_LOST = (
    "seeds: finished/ran; did not finish, so no score (each interval is over the seeds that finished): "
    "GRPO seed 2: diverged at step 12 (actor/pg_loss is nan); "
    "DAPO seed 2: failed at step 3: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB; "
    "DAPO seed 3: running, step 7"
)


def test_a_diverged_seed_is_counted_named_and_its_validation_never_stands_in(db, demo):
    """`GRPO | 2/3 |`: the interval over the two that finished, the diverged seed named in the footer with its
    step and reason; its logged validation (0.95) enters no cell, and no failed or live run's does."""
    res = invoke("report", "--table", "--db", db, "--format", "markdown")
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    grpo, dapo = stats.score_from_means([0.6, 0.8]), stats.score_from_means([0.3, 0.5])
    assert lines[4:8] == [
        "| Method | Seeds | aime24 Last |",
        "|:---|---:|---:|",
        f"| GRPO | 2/3 | **70.0 [{grpo.low * 100:.1f}, {grpo.high * 100:.1f}]** |",
        f"| DAPO | 2/4 | <u>40.0 [{dapo.low * 100:.1f}, {dapo.high * 100:.1f}]</u> |",
    ]
    assert f"- {DEMO_LOST}" in lines
    assert lines[-1] == (
        f"- Sources: rpg eval (scorer dapo, mean@32, {SHOWN}): 2 runs; "
        f"training validation (mean@32, {val_shown()}): 2 runs."
    )
    terminal = invoke("report", "--table", "--db", db)
    assert terminal.exit_code == 0, terminal.output
    assert re.search(r"GRPO +│ +2/3 │ +70\.0 ±", terminal.output), terminal.output
    assert DEMO_LOST in " ".join(terminal.output.split())  # the footer may wrap


def test_unfinished_runs_in_csv_and_json(db, demo):
    """Per row: seeds (finished) and ran; per cell: finished, ran, and each run that did not finish."""
    records = list(csv.DictReader(io.StringIO(invoke("report", "--db", db, "--format", "csv").output)))
    assert [(r["method"], r["seeds"], r["ran"], r["runs"]) for r in records] == [
        ("GRPO", "2", "3", "grpo-s0 grpo-s1"),
        ("DAPO", "2", "4", "dapo-s0 dapo-s1"),
    ]
    diverged = {"name": "grpo-s2", "seed": 2, "state": "diverged", "reason": "actor/pg_loss is nan", "step": 12}
    assert (records[0]["aime24_last_finished"], records[0]["aime24_last_ran"]) == ("2", "3")
    assert json.loads(records[0]["aime24_last_not_finished"]) == [diverged]
    doc = json.loads(invoke("report", "--db", db, "--format", "json").output)
    grpo, dapo = doc["groups"][0]["rows"]
    assert (grpo["finished"], grpo["ran"], dapo["finished"], dapo["ran"]) == (2, 3, 2, 4)
    cell = dapo["cells"]["aime24"]["last"]
    assert (cell["mean"], cell["n"], cell["finished"], cell["ran"]) == (pytest.approx(0.4), 2, 2, 4)
    assert cell["not_finished"] == [
        {
            "name": "dapo-s2",
            "seed": 2,
            "state": "failed",
            "reason": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
            "step": 3,
        },
        {"name": "dapo-s3", "seed": 3, "state": "running", "reason": None, "step": 7},
    ]
    assert grpo["cells"]["aime24"]["last"]["not_finished"] == [diverged]
    assert DEMO_LOST in doc["notes"]


def test_preempted_and_stopped_seeds_are_counted_and_a_method_that_lost_every_seed_keeps_its_row(db, store, fill):
    kept = fill.run(spec("grpo", seed=0), name="grpo-s0")
    fill.evals(kept, "aime24", {20: 0.5})
    preempted = fill.run(spec("grpo", seed=1), name="grpo-s1", status=None)
    fill.metrics(preempted, val_metrics(40, {20: 0.9}))
    fill.evals(preempted, "aime24", {20: 0.9})  # evaluated mid-run: still no score of a run that did not finish
    stopped = fill.run(spec("dapo", seed=0), name="dapo-s0", status=None)
    fill.metrics(stopped, val_metrics(6, {}))
    store.set_status(stopped, "stopped", error="cancelled by `rpg cancel`")
    record_state(store, preempted, "preempted")
    res = invoke("report", "--table", "--db", db, "--format", "markdown")
    assert res.exit_code == 0, res.output
    assert [line for line in res.output.splitlines() if line.startswith(("| GRPO", "| DAPO"))] == [
        "| GRPO | 1/2 | 50.0 |",
        "| DAPO | 0/1 | - |",
    ]
    assert (
        "- seeds: finished/ran; did not finish, so no score (each interval is over the seeds that finished): "
        "GRPO seed 1: preempted at step 40; DAPO seed 0: stopped at step 6: cancelled by `rpg cancel`"
    ) in res.output.splitlines()


def test_unfinished_states_and_steps_as_a_footer_says_them(store, fill):
    """Each state but succeeded, one not known today too ("evicted"), with its step from the store."""
    from rpg_cli.report.scores import unfinished_runs

    run_id = fill.run(spec("grpo"), status=None)
    fill.metrics(run_id, val_metrics(40, {}))
    record = store.run(run_id)

    def said(status: str, error: str | None = None) -> str | None:
        lost = unfinished_runs(store, [dataclasses.replace(record, status=status, error=error)])
        return lost[run_id].text() if run_id in lost else None

    assert said("succeeded") is None
    assert said("preempted") == "preempted at step 40"
    assert said("evicted", "the node went away\ntraceback") == "evicted at step 40: the node went away"
    assert said("failed", rundir.diverged(38, "grad_norm is inf")) == "diverged at step 38 (grad_norm is inf)"
    assert said("failed", "x" * 300) == "failed at step 40: " + "x" * 197 + "..."
    assert said("stopped", "cancelled") == "stopped at step 40: cancelled"
    assert [said(s) for s in ("pending", "submitted", "running")] == ["running, step 40"] * 3
    never = fill.run(spec("dapo"), status="failed")
    assert unfinished_runs(store, [store.run(never)])[never].text() == "failed before its first step"


def test_a_table_of_runs_none_of_which_finished_says_so_in_one_line(db, store, fill):
    for seed, status in ((0, "running"), (1, "running"), (2, "failed")):
        run = fill.run(spec("grpo", seed=seed), status=status)
        fill.evals(run, "aime24", {5: 0.5})
    res = invoke("report", "--table", "--db", db)
    assert res.exit_code == 2
    assert res.output.strip() == (
        "rpg report: no run has finished (2 running, 1 failed): a table holds finished runs only; "
        "`rpg runs` shows where each one is"
    )


def test_finished_runs_without_scores_are_told_from_the_others_and_a_shared_seed_names_the_run(db, store, fill):
    from rpg_cli.report.scores import Unfinished, who

    fill.run(spec("grpo", seed=0))  # finished, never evaluated
    lost = fill.run(spec("grpo", seed=1), status=None)
    fill.metrics(lost, val_metrics(12, {10: 0.95}))  # its own validation: no score of a run that did not finish
    store.set_status(lost, "failed", error=rundir.diverged(12, "actor/pg_loss is nan"))
    res = invoke("report", "--table", "--db", db)
    assert res.exit_code == 2 and res.output.strip().endswith(
        "run `rpg eval RUN` (or train with validation on) (finished runs; 1 diverged did not finish and give none)"
    ), res.output
    run = Unfinished("r9", "grpo-s1-r9", 1, "running", None, 3)
    assert who(run, [0, 1], "GRPO") == "GRPO seed 1" and who(run, [1, 1], "GRPO") == "GRPO grpo-s1-r9"
