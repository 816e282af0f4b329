"""A job's files are untrusted input and the store is the record (issue 35, classes 1 and 2): forged lines
of every kind in metrics.jsonl and in rpg eval's scored-samples files are skipped with one warning each,
on SQLite and PostgreSQL, and never stop another run's ingestion; a restart record voids stored steps only
for a live run, once per attempt; a finished run's rows survive a truncated, rewritten or replaced file,
which `rpg runs` marks; a huge line or tail is read once, in bounded pieces."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import sqlite3
from pathlib import Path

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from rpg_cli import rundir
from rpg_cli.cli import app
from rpg_cli.orchestration.plan import RunPlan
from rpg_cli.rundir import MetricsLog, restart_line
from rpg_cli.store import ingest, ingestion, jsonl, migrations, open_store
from rpg_cli.store.ingest import INT_MAX, metrics_view, parse_sample_line, read_new, sample_line, sample_rows
from rpg_cli.store.schema import schema

VAL = "val-core/aime2025/acc/mean@4"


def line(step, **data) -> str:
    return json.dumps({"step": step, "data": data}) + "\n"


def record(store, run_id: str, root: Path, status: str | None = None) -> None:
    store.record_plan(RunPlan(run_id, run_id, "sw", "local", {"seed": 0}, root / run_id, ["true"]))
    if status is not None:
        store.set_status(run_id, status)


def db_metrics(store, run_id: str) -> dict[int, dict[str, float | None]]:
    out: dict[int, dict[str, float | None]] = {}
    with store.engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT step, key, value FROM metrics WHERE run_id = :r"), {"r": run_id})
        for step, key, value in rows:
            out.setdefault(step, {})[key] = value
    return dict(sorted(out.items()))


def db_val(store, run_id: str) -> dict[int, float | None]:
    with store.engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT step, value FROM evals WHERE run_id = :r AND metric = 'mean@k'"), {"r": run_id}
        )
        return dict(sorted(rows.all()))


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.fixture
def store(db_url):
    s = open_store(db_url)
    yield s
    s.close()


# ------------------------------------------------------------------------------ forged metrics lines

DEEP = "[" * 200_000 + "]" * 200_000  # deeper than json's parser recursion: RecursionError, not ValueError

FORGED_METRICS = {
    "400-digit value": '{"step": 2, "data": {"a": 1' + "0" * 400 + "}}",
    "negative 400-digit value": '{"step": 2, "data": {"a": -9' + "9" * 400 + "}}",
    "5000-digit value (past Python's int limit)": '{"step": 2, "data": {"a": ' + "7" * 5000 + "}}",
    "30-digit step": '{"step": 1' + "0" * 29 + ', "data": {"a": 2.0}}',
    "negative step": line(-5, a=2.0),
    "step past the store's integer": line(INT_MAX + 1, a=2.0),
    "fractional step": '{"step": 2.5, "data": {"a": 2.0}}',
    "step as text": '{"step": "2", "data": {"a": 2.0}}',
    "step true": '{"step": true, "data": {"a": 2.0}}',
    "step null": '{"step": null, "data": {"a": 2.0}}',
    "30-digit k in a validation key": line(2, **{"val-core/aime2025/acc/mean@99999999999999999999999": 0.5}),
    "k past the store's integer": line(2, **{f"val-aux/aime2025/acc/std@{INT_MAX + 1}": 0.1}),
    "k of 0": line(2, **{"val-core/aime2025/acc/mean@0": 0.5}),
    "accuracy -3": line(2, **{VAL: -3.0}),
    "accuracy 10": line(2, **{VAL: 10.0}),
    "accuracy 1.01": line(2, **{VAL: 1.01}),
    "accuracy inf": '{"step": 2, "data": {"' + VAL + '": Infinity}}',
    "accuracy 1e999": '{"step": 2, "data": {"' + VAL + '": 1e999}}',
    "aux best@k below 0": line(2, **{"val-aux/aime2025/acc/best@2/mean": -0.5}),
    "data source longer than a benchmark name": line(2, **{f"val-core/{'x' * 150}/acc/mean@4": 0.5}),
    "metric name of 201 characters": line(2, **{"k" * 201: 1.0}),
    "empty metric name": line(2, **{"": 1.0}),
    "NUL in a metric name": line(2, **{"a\u0000b": 1.0}),
    "newline in a metric name": line(2, **{"a\nb": 1.0}),
    "lone surrogate in a metric name": '{"step": 2, "data": {"a\\ud800": 1.0}}',
    "data a list": '{"step": 2, "data": [1, 2]}',
    "an extra field": '{"step": 2, "data": {"a": 2.0}, "note": 1}',
    "no data": '{"step": 2}',
    "nested past the parser's stack": '{"step": 2, "data": {"a": ' + DEEP + "}}",
    "not UTF-8": b'{"step": 2, "data": {"\xff\xfe": 1.0}}'.decode("latin-1"),
    "restart without keep_through": '{"restart": {}}',
    "restart keep_through -1": '{"restart": {"keep_through": -1}}',
    "restart keep_through of 30 digits": '{"restart": {"keep_through": 1' + "0" * 29 + "}}",
    "restart keep_through as text": '{"restart": {"keep_through": "0"}}',
    "restart keep_through 0.5": '{"restart": {"keep_through": 0.5}}',
    "restart with another field": '{"restart": {"keep_through": 0, "all": true}}',
    "restart beside a record": '{"restart": {"keep_through": 0}, "step": 2, "data": {}}',
    "restart null": '{"restart": null}',
    "restart a list": '{"restart": [0]}',
}


def test_every_forged_metrics_line_is_skipped_with_one_warning_and_the_rest_is_stored(store, tmp_path, caplog):
    """Each forged line between two good ones, each in its own run of one store: the good lines are
    stored, the forged one is not (no row, no deletion), one warning names its file and line, once;
    `rpg runs` and the report's queries then work (they crashed on the first of these)."""
    caplog.set_level(logging.WARNING, logger="rpg_cli.store")
    good = {1: {"a": 1.0, VAL: 0.25}, 3: {"a": 3.0}}
    for i, (name, forged) in enumerate(FORGED_METRICS.items()):
        run_id, path = f"forged{i:03d}", tmp_path / f"m{i:03d}.jsonl"
        record(store, run_id, tmp_path)
        with open(path, "w", encoding="latin-1" if name == "not UTF-8" else "utf-8") as f:
            f.write(line(1, a=1.0, **{VAL: 0.25}) + forged.rstrip("\n") + "\n" + line(3, a=3.0))
        caplog.clear()
        assert store.ingest_metrics(run_id, path) == 3, name
        assert db_metrics(store, run_id) == good and db_val(store, run_id) == {1: 0.25}, name
        assert store.last_steps([run_id]) == {run_id: 3}, name
        (warning,) = warnings_of(caplog)
        assert warning.startswith(f"{path} line 2: ") and warning.endswith("skipped") and "\n" not in warning, name
        assert len(warning) < 400, name  # a 400-digit number is not echoed whole
        caplog.clear()
        assert store.ingest_metrics(run_id, path) == 0 and warnings_of(caplog) == [], name  # once, not every poll
    with store.engine.connect() as conn:
        keys = conn.execute(sa.text("SELECT DISTINCT key FROM metrics")).scalars().all()
    assert sorted(keys) == sorted(["a", VAL])


def test_the_store_holds_what_the_checks_let_through(store, tmp_path):
    """The edges that are values, not forgeries: the largest step and k, NaN (kept as NULL), infinities
    (a divergence), an accuracy's bounds met exactly, a long but valid name, and training metrics outside
    their plot range (bf16 arithmetic: the store keeps what the trainer logged)."""
    record(store, "edge", tmp_path)
    path = tmp_path / "m.jsonl"
    key = "k" * ingest.KEY_CHARS
    path.write_text(
        line(0, **{VAL: 0.0, "actor/entropy": -1e-4, "ref/kl": -1e-9, "critic/score/mean": 1.1})
        + '{"step": 1, "data": {"actor/pg_loss": NaN, "actor/grad_norm": Infinity, "x": 1e308}}\n'
        + line(INT_MAX, **{VAL: 1.0, key: -(2**60), f"val-aux/aime2025/acc/std@{INT_MAX}": 0.5, "flag": True})
    )
    assert store.ingest_metrics("edge", path) == 11
    values = db_metrics(store, "edge")
    assert values[0] == {VAL: 0.0, "actor/entropy": -1e-4, "ref/kl": -1e-9, "critic/score/mean": 1.1}
    assert values[1]["actor/pg_loss"] is None and math.isinf(values[1]["actor/grad_norm"])
    assert values[INT_MAX][key] == -(2.0**60) and values[INT_MAX]["flag"] == 1.0
    assert store.divergence("edge") is not None  # the NaN loss is still seen
    assert db_val(store, "edge") == {0: 0.0, INT_MAX: 1.0}


def test_one_runs_forged_file_never_stops_another_runs_ingestion(store, tmp_path):
    """A watcher ingests every run in turn: a file of nothing but forged lines is one run's problem."""
    record(store, "bad", tmp_path)
    record(store, "good", tmp_path)
    bad, good = tmp_path / "bad.jsonl", tmp_path / "good.jsonl"
    bad.write_bytes("".join(forged.rstrip("\n") + "\n" for forged in FORGED_METRICS.values()).encode("latin-1"))
    good.write_text(line(1, a=1.0))
    for run_id, path in (("bad", bad), ("good", good)):
        store.ingest_metrics(run_id, path)
    assert db_metrics(store, "bad") == {} and db_metrics(store, "good") == {1: {"a": 1.0}}


def test_metrics_view_applies_the_same_checks():
    text = line(1, a=1.0) + line(-5, a=-5.0) + line(2, **{VAL: -3.0}) + '{"restart": {}}\n' + line(3, a=3.0)
    assert metrics_view(text) == {1: {"a": 1.0}, 3: {"a": 3.0}}


# ------------------------------------------------------------------------------ forged scored samples


def scored(problem: str = "p0", **changes) -> str:
    """A scored-problem line as rpg eval writes it, with `changes` (dotted: protocol.seed) forged in."""
    protocol = {"n": 2, "temperature": 1.0, "top_p": 1.0, "max_tokens": 16, "seed": 0}
    obj = json.loads(sample_line(problem, 0, "dapo", "dapo-1", protocol, [("1", True, 3), (None, False, 4)]))
    for name, value in changes.items():
        target, _, field = name.rpartition(".")
        where = obj
        for part in filter(None, target.split(".")):
            where = where[int(part)] if isinstance(where, list) else where[part]
        where[int(field) if isinstance(where, list) else field] = value
    return json.dumps(obj)


FORGED_SAMPLES = {
    "huge position": scored(position=10**30),
    "negative position": scored(position=-1),
    "position as text": scored(position="3"),
    "huge protocol.seed": scored(**{"protocol.seed": 10**30}),
    "protocol.seed past the store's integer": scored(**{"protocol.seed": INT_MAX + 1}),
    "protocol.seed as text": scored(**{"protocol.seed": "0"}),
    "huge length": scored(**{"samples.0.length": 10**30}),
    "negative length": scored(**{"samples.1.length": -4}),
    "temperature hot": scored(**{"protocol.temperature": "hot"}),
    "temperature NaN": scored(**{"protocol.temperature": float("nan")}),
    "temperature inf": scored(**{"protocol.temperature": float("inf")}),
    "temperature -1": scored(**{"protocol.temperature": -1.0}),
    "temperature true": scored(**{"protocol.temperature": True}),
    "top_p 0": scored(**{"protocol.top_p": 0.0}),
    "top_p 1.5": scored(**{"protocol.top_p": 1.5}),
    "huge max_tokens": scored(**{"protocol.max_tokens": 10**30}),
    "max_tokens 0": scored(**{"protocol.max_tokens": 0}),
    "n 0": scored(**{"protocol.n": 0, "samples": []}),
    "n past the samples": scored(**{"protocol.n": 3}),
    "huge n": scored(**{"protocol.n": 10**30}),
    "protocol without seed": json.dumps({**json.loads(scored()), "protocol": {"n": 2, "temperature": 1.0}}),
    "problem of 65 characters": scored("p" * 65),
    "NUL in the problem": scored("p\u00000"),
    "scorer of 101 characters": scored(scorer="s" * 101),
    "scorer a number": scored(scorer=7),
    "scorer_version a huge number": scored(scorer_version=10**30),
    "NUL in an extracted answer": scored(**{"samples.0.extracted": "4\u00002"}),
    "lone surrogate in an extracted answer": scored().replace('"extracted": "1"', '"extracted": "\\udc00"'),
    "extracted a number": scored(**{"samples.0.extracted": 42}),
    "correct as text": scored(**{"samples.0.correct": "yes"}),
    "a sample a list": scored(**{"samples.1": [1]}),
    "samples not a list": scored(samples="all right"),
    "nested past the parser's stack": '{"problem": ' + DEEP + "}",
    "a list": "[1, 2]",
}


def test_every_forged_scored_line_is_skipped_and_the_rest_is_stored(store, tmp_path):
    """rpg eval's part: read_new, sample_rows and record_samples (as ScoredFeed runs them) on a file
    whose middle line is forged: the good problems are stored, the forged one is named, nothing raises."""
    record(store, "ev", tmp_path)
    for i, (name, forged) in enumerate(FORGED_SAMPLES.items()):
        path = tmp_path / f"s{i:03d}.scored.jsonl"
        path.write_text(scored("p0") + "\n" + forged + "\n" + scored("p2") + "\n")
        parsed, cursor = read_new(path, None, parse_sample_line)
        assert [e["problem"] for e in parsed.events] == ["p0", "p2"], name
        assert [index for index, _ in parsed.bad] == [1] and "\n" not in parsed.bad[0][1], name
        rows = [row for e in parsed.events for row in sample_rows("ev", i, "b", e)]
        assert store.record_samples(rows) == 4, name
        assert read_new(path, cursor, parse_sample_line)[0].events == [], name  # read once
    with store.engine.connect() as conn:
        stored = conn.execute(sa.text("SELECT DISTINCT problem, position, response_length FROM samples")).all()
    assert sorted(stored) == [("p0", 0, 3), ("p0", 0, 4), ("p2", 0, 3), ("p2", 0, 4)]


def test_scored_files_are_read_in_bounded_pieces_each_problem_once(tmp_path, monkeypatch):
    """What ScoredFeed reads per call is bounded (READ_LIMIT); the next call reads on; a line past
    MAX_LINE (a forged samples list) is skipped, in the feed's reads and in ScoredFile.load's whole-file parse."""
    monkeypatch.setattr(jsonl, "MAX_LINE", 400)
    path = tmp_path / "b.scored.jsonl"
    lines = [scored(f"p{i}") for i in range(50)]
    lines[20] = scored("p20", samples=[{"correct": True, "extracted": "x" * 500, "length": 1}] * 2)
    path.write_text("".join(text + "\n" for text in lines))
    cursor, seen, bad, calls = None, [], [], 0
    while True:
        parsed, cursor = read_new(path, cursor, parse_sample_line, limit=1000)
        calls += 1
        seen += [e["problem"] for e in parsed.events]
        bad += [(cursor.lines - parsed.lines + index, why) for index, why in parsed.bad]
        if not parsed.more:
            break
    assert seen == [f"p{i}" for i in range(50) if i != 20] and calls >= path.stat().st_size // 1000
    assert bad == [(20, "longer than 400 bytes")]
    whole = ingest.parse_lines(path.read_bytes(), parse_sample_line)
    assert len(whole.events) == 49 and whole.bad == [(20, "longer than 400 bytes")]


# ------------------------------------------------------------------------------------ lengths, bounds


def test_a_huge_line_is_skipped_once_and_a_huge_tail_is_not_read_again(tmp_path, caplog):
    """A line past MAX_LINE, complete or still being written: skipped with one warning; its bytes are
    consumed, so the next poll reads only what follows (not the whole tail again); lines after it count."""
    store = open_store(f"sqlite:///{tmp_path / 'results.db'}")
    caplog.set_level(logging.WARNING, logger="rpg_cli.store")
    path = tmp_path / "metrics.jsonl"
    try:
        record(store, "r", tmp_path)
        huge = '{"step": 2, "data": {"a": "' + "x" * (ingest.MAX_LINE + 10) + '"}}'
        path.write_text(line(1, a=1.0) + huge + "\n" + line(3, a=3.0))
        assert store.ingest_metrics("r", path) == 2
        assert warnings_of(caplog) == [f"{path} line 2: longer than {ingest.MAX_LINE} bytes; skipped"]
        caplog.clear()
        with open(path, "a") as f:  # a tail with no end: a writer gone mad, or a forger
            f.write('{"step": 4, "data": {"a": "' + "y" * (ingest.MAX_LINE + 10))
        assert store.ingest_metrics("r", path) == 0
        offset = _offset(store, "r")
        assert offset == path.stat().st_size  # consumed: never read again
        with open(path, "a") as f:
            f.write("y" * 1000 + '"}}\n' + line(5, a=5.0))  # its end comes; then a good line
        assert store.ingest_metrics("r", path) == 1 and db_metrics(store, "r") == {
            1: {"a": 1.0},
            3: {"a": 3.0},
            5: {"a": 5.0},
        }
        assert warnings_of(caplog) == [f"{path} line 4: longer than {ingest.MAX_LINE} bytes; skipped"]
        with open(path, "a") as f:
            f.write("garbage\n")
        caplog.clear()
        store.ingest_metrics("r", path)
        assert warnings_of(caplog) == [f"{path} line 6: not JSON; skipped"]  # line numbers stay right
    finally:
        store.close()


def _offset(store, run_id: str) -> int:
    with store.engine.connect() as conn:
        return conn.execute(sa.text('SELECT "offset" FROM metric_files WHERE run_id = :r'), {"r": run_id}).scalar()


def test_each_ingest_call_reads_a_bounded_number_of_bytes_the_next_reads_on(tmp_path, monkeypatch):
    monkeypatch.setattr(jsonl, "MAX_LINE", 1000)
    monkeypatch.setattr(ingestion, "METRICS_CHUNK", 4096)
    store = open_store(f"sqlite:///{tmp_path / 'results.db'}")
    path = tmp_path / "metrics.jsonl"
    try:
        record(store, "r", tmp_path)
        path.write_text("".join(line(s, a=float(s), b=-float(s)) for s in range(1, 2001)))
        size, reads = path.stat().st_size, []
        while (n := store.ingest_metrics("r", path, max_bytes=20_000)) or not reads:
            reads.append((n, _offset(store, "r")))
        offsets = [0] + [offset for _, offset in reads]
        assert all(0 < b - a <= 20_000 + 4096 for a, b in zip(offsets, offsets[1:]))  # each call: bounded
        assert offsets[-1] == size and sum(n for n, _ in reads) == 4000
        assert db_metrics(store, "r")[2000] == {"a": 2000.0, "b": -2000.0} and len(db_metrics(store, "r")) == 2000
    finally:
        store.close()


def test_a_fifo_planted_as_metrics_jsonl_is_refused_not_waited_on(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'results.db'}")
    path = tmp_path / "metrics.jsonl"
    os.mkfifo(path)
    signal.signal(signal.SIGALRM, lambda *_: pytest.fail("ingestion waited on a FIFO"))
    signal.alarm(10)
    try:
        record(store, "r", tmp_path)
        with pytest.raises(rundir.UnsafePathError, match="not a regular file"):
            store.ingest_metrics("r", path)
    finally:
        signal.alarm(0)
        store.close()


# ---------------------------------------------------------------------------- history: restarts


def test_a_restart_record_on_a_finished_run_deletes_nothing(store, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="rpg_cli.store")
    whole = {s: {"a": float(s), VAL: 0.33} for s in range(1, 6)}
    for status in ("succeeded", "failed", "stopped"):
        for keep in (None, 0, 2):
            run_id, path = f"{status}-{keep}", tmp_path / f"{status}-{keep}.jsonl"
            record(store, run_id, tmp_path)
            path.write_text("".join(line(s, **d) for s, d in whole.items()))
            store.ingest_metrics(run_id, path)
            store.set_status(run_id, status)
            with open(path, "a") as f:
                f.write(restart_line(keep) + line(1, a=100.0))  # appended after it finished
            caplog.clear()
            store.ingest_metrics(run_id, path)
            assert db_metrics(store, run_id) == whole and store.last_steps([run_id]) == {run_id: 5}, run_id
            assert len(db_val(store, run_id)) == 5
            (warning,) = warnings_of(caplog)
            assert warning == (
                f"{path} line 6: a restart record, ignored (the run has finished ({status})): the store keeps the "
                "steps it has"
            )


def test_a_live_run_restarts_once_per_attempt(store, tmp_path, caplog):
    """Both backends' resume (MetricsLog's restart line) voids the redone steps of a live run; a second
    restart within the same attempt is ignored; the next attempt's restart applies again."""
    caplog.set_level(logging.WARNING, logger="rpg_cli.store")
    record(store, "r", tmp_path)
    path = tmp_path / "r" / "metrics.jsonl"
    store.begin_attempt("r")
    log = MetricsLog(path, keep_through=None)
    for s in range(1, 6):
        log.write(s, {"a": float(s)})
    assert store.ingest_metrics("r", path) == 5
    store.begin_attempt("r")  # attempt 2 resumes from step 2
    log = MetricsLog(path, keep_through=2)
    log.write(3, {"a": -3.0})
    assert store.ingest_metrics("r", path) == 1
    assert db_metrics(store, "r") == {1: {"a": 1.0}, 2: {"a": 2.0}, 3: {"a": -3.0}}
    with open(path, "a") as f:  # a second restart in attempt 2: not its resume
        f.write(restart_line(None))
    log.write(4, {"a": -4.0})
    caplog.clear()
    assert store.ingest_metrics("r", path) == 1
    assert db_metrics(store, "r") == {1: {"a": 1.0}, 2: {"a": 2.0}, 3: {"a": -3.0}, 4: {"a": -4.0}}
    assert warnings_of(caplog) == [
        f"{path} line 8: a restart record, ignored (its attempt (2) has restarted once already): the store keeps "
        "the steps it has"
    ]
    store.begin_attempt("r")  # attempt 3, no checkpoint: everything is redone
    MetricsLog(path, keep_through=None).write(1, {"a": 10.0})
    store.ingest_metrics("r", path)
    assert db_metrics(store, "r") == {1: {"a": 10.0}} and store.last_steps(["r"]) == {"r": 1}


def test_restarts_of_a_first_read_are_folded_as_written(store, tmp_path):
    """A store that never read the file (a new store over an old run directory) holds nothing of it:
    every restart in it applies, as metrics_view folds it."""
    record(store, "r", tmp_path)
    path = tmp_path / "m.jsonl"
    text = line(1, a=1.0) + line(2, a=2.0) + line(3, a=3.0) + restart_line(2) + line(3, a=-3.0)
    text += restart_line(1) + line(2, a=-2.0)
    path.write_text(text)
    store.ingest_metrics("r", path)
    assert db_metrics(store, "r") == metrics_view(text) == {1: {"a": 1.0}, 2: {"a": -2.0}}


# ------------------------------------------------------------------ history: a file that changed


def _finished(store, tmp_path: Path, run_id: str, steps: int = 40) -> Path:
    path = tmp_path / f"{run_id}.jsonl"
    record(store, run_id, tmp_path)
    path.write_text("".join(line(s, a=float(s), **{VAL: 0.33}) for s in range(1, steps + 1)))
    assert store.ingest_metrics(run_id, path) == 2 * steps
    store.set_status(run_id, "succeeded")
    return path


def test_a_finished_runs_file_truncated_rewritten_or_replaced_changes_nothing(store, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="rpg_cli.store")
    whole = {s: {"a": float(s), VAL: 0.33} for s in range(1, 41)}

    def truncate(path: Path) -> None:
        path.write_text(line(1, a=1.0, **{VAL: 0.33}))

    def rewrite_in_place(path: Path) -> None:  # the same size: 0.33 -> 10.0 at step 3
        text = path.read_text()
        old = line(3, a=3.0, **{VAL: 0.33})
        path.write_text(text.replace(old, old.replace("0.33", "10.0")))

    def replace(path: Path) -> None:  # another file moved over it
        other = path.with_suffix(".new")
        other.write_text("".join(line(s, a=-1.0) for s in range(1, 60)))
        os.replace(other, path)

    def empty(path: Path) -> None:
        path.write_text("")

    for change in (truncate, rewrite_in_place, replace, empty):
        run_id = change.__name__
        path = _finished(store, tmp_path, run_id)
        change(path)
        caplog.clear()
        assert store.ingest_metrics(run_id, path) == 0, run_id
        assert db_metrics(store, run_id) == whole and store.last_steps([run_id]) == {run_id: 40}, run_id
        assert db_val(store, run_id) == {s: 0.33 for s in range(1, 41)}, run_id
        (warning,) = warnings_of(caplog)
        assert warning.startswith(f"{path}: no longer the file the store read (") and "not believed" in warning
        assert run_id in store.changed_files([run_id]), run_id
        caplog.clear()
        assert store.ingest_metrics(run_id, path) == 0 and warnings_of(caplog) == [], run_id  # reported once
        with open(path, "a") as f:  # what is added from now on is read: only what the store lacks
            f.write(line(2, a=-2.0) + line(41, a=41.0))
        assert store.ingest_metrics(run_id, path) == 2, run_id
        assert db_metrics(store, run_id) == {**whole, 41: {"a": 41.0}} and warnings_of(caplog) == [], run_id
    assert set(store.changed_files(["truncate", "rewrite_in_place", "replace", "empty", "nothing"])) == {
        "truncate",
        "rewrite_in_place",
        "replace",
        "empty",
    }


def test_a_copied_file_reads_on_and_a_live_runs_second_rewrite_is_not_believed(store, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="rpg_cli.store")
    record(store, "r", tmp_path)
    store.begin_attempt("r")
    path = tmp_path / "m.jsonl"
    path.write_text(line(1, a=1.0) + line(2, a=2.0) + line(3, a=3.0))
    store.ingest_metrics("r", path)
    store.begin_attempt("r")  # attempt 2 resumes from step 1 (its one restart)
    with open(path, "a") as f:
        f.write(restart_line(1) + line(2, a=-2.0))
    assert store.ingest_metrics("r", path) == 1
    copy = tmp_path / "copy.jsonl"  # the same bytes under another inode (a run directory restored)
    copy.write_bytes(path.read_bytes() + line(3, a=-3.0).encode())
    os.replace(copy, path)
    assert store.ingest_metrics("r", path) == 1 and store.changed_files(["r"]) == {}
    want = {1: {"a": 1.0}, 2: {"a": -2.0}, 3: {"a": -3.0}}
    assert db_metrics(store, "r") == want
    path.write_text(line(1, a=100.0))  # the live run's file truncated, with no new attempt begun
    caplog.clear()
    assert store.ingest_metrics("r", path) == 0 and db_metrics(store, "r") == want
    assert "truncated" in store.changed_files(["r"])["r"] and "its attempt (2) has restarted" in caplog.text
    with open(path, "a") as f:  # the live writer goes on appending: read
        f.write(line(4, a=4.0))
    assert store.ingest_metrics("r", path) == 1 and db_metrics(store, "r")[4] == {"a": 4.0}


def test_rpg_runs_marks_a_run_whose_file_changed(tmp_path):
    db = f"sqlite:///{tmp_path / 'results.db'}"
    store = open_store(db)
    try:
        path = _finished(store, tmp_path, "kept")
        _finished(store, tmp_path, "other")
        path.write_text(line(1, a=10.0))
        store.ingest_metrics("kept", path)
    finally:
        store.close()
    result = CliRunner().invoke(app, ["runs", "--db", db], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    kept = next(row for row in result.output.splitlines() if "│ kept" in row)
    other = next(row for row in result.output.splitlines() if "│ other" in row)
    assert "succeeded!" in kept and "succeeded!" not in other
    note = next(row for row in result.output.splitlines() if row.startswith("! 1 run(s)"))
    assert "kept (" in note and "truncated" in note


# ------------------------------------------------------------------------------- schema version 4


def test_a_version_3_database_gains_the_bookkeeping_columns_and_reads_on(db_url, tmp_path):
    store = open_store(db_url)
    path = tmp_path / "m.jsonl"
    try:
        record(store, "r", tmp_path)
        path.write_text(line(1, a=1.0) + line(2, a=2.0))
        store.ingest_metrics("r", path)
        with store.engine.begin() as conn:  # what version 3 wrote
            for column in ("restart_attempt", "changed"):
                conn.exec_driver_sql(f"ALTER TABLE metric_files DROP COLUMN {column}")
            conn.exec_driver_sql("UPDATE schema_version SET version = 3")
    finally:
        store.close()
    store = open_store(db_url, create=False)
    try:
        with store.engine.connect() as conn:
            assert conn.execute(sa.select(schema().schema_version.c.version)).scalar() == migrations.LATEST
            row = conn.execute(sa.text("SELECT restart_attempt, changed FROM metric_files")).one()
        assert tuple(row) == (None, None)
        with open(path, "a") as f:
            f.write(line(3, a=3.0))
        assert store.ingest_metrics("r", path) == 1  # the cursor kept: only the new line read
        assert db_metrics(store, "r") == {1: {"a": 1.0}, 2: {"a": 2.0}, 3: {"a": 3.0}}
        store.set_status("r", "succeeded")
        path.write_text(line(1, a=5.0))
        store.ingest_metrics("r", path)
        assert "truncated" in store.changed_files(["r"])["r"] and db_metrics(store, "r")[1] == {"a": 1.0}
    finally:
        store.close()


def test_the_limits_are_the_store_columns():
    t = schema()
    assert t.metrics.c.key.type.length == ingest.KEY_CHARS
    assert {t.evals.c.benchmark.type.length, t.samples.c.scorer.type.length} == {ingest.NAME_CHARS}
    assert t.samples.c.problem.type.length == ingest.PROBLEM_CHARS
    assert ingest.METRICS_CHUNK > ingest.MAX_LINE and ingest.READ_LIMIT > ingest.MAX_LINE
    assert sqlite3.sqlite_version_info >= (3, 35)  # DROP COLUMN, used above to write a version 3 file
