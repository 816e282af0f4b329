"""The store at scale, on SQLite and on a real PostgreSQL server: per-problem scores read only what is asked
(and give what the query before version 6 gave), the samples keyed by evaluation (version 6, upgraded in
place), and the dialects' bulk ingestion (PostgreSQL: COPY, then one INSERT ... SELECT) with the semantics of
row-by-row writing: the last row of a key wins, or, for a finished run, only new keys are added."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import sqlalchemy as sa

from rpg_cli.orchestration.plan import RunPlan
from rpg_cli.store import bulk, migrations, open_store, queries
from rpg_cli.store.schema import PROTOCOL, SAMPLES_KEY

P1 = {"n": 4, "temperature": 1.0, "top_p": 0.7, "max_tokens": 64, "seed": 0}
P2 = {"n": 2, "temperature": 0.6, "top_p": 1.0, "max_tokens": 64, "seed": 1}

# The query of problem_scores before version 6 (a sort of every sample of the runs): the reference.
OLD_QUERY = """
SELECT run_id, step, benchmark, scorer, n, temperature, top_p, max_tokens, seed, problem, MIN(position),
       SUM(CASE WHEN correct THEN 1 ELSE 0 END), COUNT(*)
FROM samples WHERE run_id IN ({ids})
GROUP BY run_id, step, benchmark, scorer, n, temperature, top_p, max_tokens, seed, problem
HAVING COUNT(*) = n
ORDER BY run_id, step, benchmark, scorer, n, temperature, top_p, max_tokens, seed, MIN(position), problem
"""

# The samples table as versions 2 to 5 created it (a rowid table on SQLite, the problem before the scorer).
V5_SAMPLES = """
CREATE TABLE samples (
    run_id VARCHAR(64) NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    step INTEGER NOT NULL, benchmark VARCHAR(100) NOT NULL, problem VARCHAR(64) NOT NULL,
    sample_index INTEGER NOT NULL, scorer VARCHAR(100) NOT NULL, n INTEGER NOT NULL, temperature FLOAT NOT NULL,
    top_p FLOAT NOT NULL, max_tokens INTEGER NOT NULL, seed INTEGER NOT NULL, position INTEGER, extracted TEXT,
    correct BOOLEAN NOT NULL, response_length INTEGER,
    PRIMARY KEY (run_id, step, benchmark, problem, sample_index, scorer, n, temperature, top_p, max_tokens, seed)
)
"""


def plan(run_id: str, root: Path) -> RunPlan:
    return RunPlan(run_id, f"name-{run_id}", "sw", "local", {"steps": 3}, root / run_id, ["true"])


def sample_rows(run_id: str, step: int, bench: str, scorer: str, proto: dict, problems: int, rng: random.Random):
    """An evaluation's samples; the last problem of some lacks a sample (an evaluation still running)."""
    rows = []
    for p in range(problems):
        for j in range(proto["n"]):
            if p == problems - 1 and j == 0 and step % 2:
                continue
            rows.append(
                dict(
                    run_id=run_id,
                    step=step,
                    benchmark=bench,
                    problem=f"{bench}-{(p * 7919) % 101:03d}",  # fingerprints in another order than positions
                    sample_index=j,
                    scorer=scorer,
                    **proto,
                    position=p,
                    extracted=str(j),
                    correct=rng.random() < 0.4,
                    response_length=10 + j,
                )
            )
    return rows


@pytest.fixture
def filled(db_url, tmp_path):
    """A store of 5 runs (ids not in the order they are made), 3 steps, 2 benchmarks, 2 scorers, 2 protocols."""
    rng = random.Random(7)
    store = open_store(db_url)
    ids = ["r-b", "r-a", "R_c", "r-d", "r-0"]
    store.record_plans([plan(i, tmp_path) for i in ids], "sw")
    for run_id in ids:
        for step in (1, 2, 3):
            for bench in ("aime24", "math500"):
                for scorer, proto in (("dapo", P1), ("math-verify", P1), ("dapo", P2)):
                    store.record_samples(sample_rows(run_id, step, bench, scorer, proto, 5, rng))
    yield store, ids
    store.close()


def old_scores(store, ids: list[str]) -> list[tuple]:
    """problem_scores as the query before version 6 answered it."""
    marks = ", ".join(f"'{i}'" for i in ids)
    with store.engine.connect() as conn:
        return [(*row[:-2], row[-2] / row[-1]) for row in conn.exec_driver_sql(OLD_QUERY.format(ids=marks))]


def test_problem_scores_are_what_the_old_query_gave(filled):
    store, ids = filled
    got = store.problem_scores(ids)
    assert [tuple(r) for r in got] == old_scores(store, ids)
    assert len(got) == 5 * 3 * 2 * 3 * 5 - 5 * 2 * 2 * 3  # the incomplete problems (of odd steps) left out
    assert {r.n for r in got} == {4, 2}


def test_steps_and_protocol_give_exactly_the_rows_of_the_whole_answer_they_name(filled):
    store, ids = filled
    whole = store.problem_scores(ids)
    steps = {"r-b": [3], "r-a": [1, 3], "R_c": [3], "r-0": [2, 1, 2]}  # r-d: not named, none of it
    picked = store.problem_scores(ids, steps=steps)
    assert picked == [r for r in whole if r.step in steps.get(r.run_id, ())]
    assert [r.run_id for r in picked] == [r.run_id for r in whole if r.run_id in steps and r.step in steps[r.run_id]]
    one = store.problem_scores(ids, steps=steps, protocol=P2, scorer="dapo", benchmark="math500")
    expected = [
        r
        for r in whole
        if r.step in steps.get(r.run_id, ())
        and all(getattr(r, k) == P2[k] for k in PROTOCOL)
        and (r.scorer, r.benchmark) == ("dapo", "math500")
    ]
    assert one == expected and one
    assert store.problem_scores(ids, step=2, steps=steps) == [r for r in whole if r.run_id == "r-0" and r.step == 2]
    assert store.problem_scores(ids, steps={}) == []
    assert store.problem_scores(ids, protocol=P1, scorer="math-verify") == [
        r for r in whole if r.scorer == "math-verify" and r.n == 4
    ]


@pytest.mark.parametrize("reads", ["as the dialect reads", "one query (a server's way)"])
def test_evaluation_problems_are_the_problem_scores_of_one_benchmark_scorer_and_protocol(filled, monkeypatch, reads):
    """What a table's intervals read: per evaluation, its problems in position order and their correct counts, as
    problem_scores gives them; on SQLite one read per evaluation, else one query (both ways on every dialect)."""
    store, ids = filled
    if reads != "as the dialect reads":
        monkeypatch.setattr("rpg_cli.store.queries.IN_PROCESS", frozenset())
        monkeypatch.setattr("rpg_cli.store.queries.PROBLEM_KEYS", 2)
    whole = store.problem_scores(ids)
    steps = {"r-b": [3], "r-a": [1, 3], "R_c": [3, 2], "r-0": [2, 1, 2], "ghost": [1]}  # r-d: not asked
    for bench, scorer, proto in (("aime24", "dapo", P1), ("math500", "dapo", P2), ("math500", "math-verify", P1)):
        expected: dict = {}
        for r in whole:
            if (r.benchmark, r.scorer, r.n, r.temperature) != (bench, scorer, proto["n"], proto["temperature"]):
                continue
            if r.step in steps.get(r.run_id, ()):
                problems, correct = expected.get((r.run_id, r.step), ((), ()))
                expected[(r.run_id, r.step)] = (problems + (r.problem,), correct + (round(r.accuracy * r.n),))
        got = store.evaluation_problems(steps, bench, scorer, proto)
        assert got == expected and len(got) == 7 and all(len(p) in (4, 5) for p, _ in got.values())
    assert store.evaluation_problems({}, "aime24", "dapo", P1) == {}
    assert store.evaluation_problems(steps, "aime24", "dapo", {**P1, "seed": 9}) == {}


def test_problem_scores_ask_for_runs_in_pieces_and_keep_the_order(filled, monkeypatch):
    store, ids = filled
    whole = store.problem_scores(ids)
    monkeypatch.setattr("rpg_cli.store.queries.PROBLEM_KEYS", 2)
    assert store.problem_scores(ids) == whole
    assert store.problem_scores(ids, steps={i: [1, 2, 3] for i in ids}) == whole


def _plans_of(store, call) -> list[str]:
    """SQLite's query plan of every problem_scores statement `call` runs."""
    plans: list[str] = []
    statements: list[tuple[str, tuple]] = []

    def spy(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("SELECT") and "FROM problem_counts" in statement:
            statements.append((statement, parameters))

    sa.event.listen(store.engine, "before_cursor_execute", spy)
    try:
        call()
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", spy)
    with store.engine.connect() as conn:
        for statement, parameters in statements:
            rows = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters).all()
            plans.append(" | ".join(row[-1] for row in rows))
    return plans


def test_sqlite_reads_only_the_key_ranges_asked_of_the_problem_counts(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'results.db'}")
    try:
        store.record_plans([plan("r1", tmp_path)], "sw")
        store.record_samples(sample_rows("r1", 10, "aime24", "dapo", P1, 3, random.Random(1)))
        cases = {
            "every step": lambda: store.problem_scores(["r1"], scorer="dapo"),
            "last step": lambda: store.problem_scores(["r1"], scorer="dapo", steps={"r1": [10]}),
            "one cell": lambda: store.problem_scores(
                ["r1"], benchmark="aime24", scorer="dapo", steps={"r1": [10]}, protocol=P1
            ),
        }
        for name, call in cases.items():
            (found,) = _plans_of(store, call)
            assert "USING PRIMARY KEY (run_id=?" in found, (name, found)
            assert "GROUP BY" not in found and "SCAN" not in found and "samples" not in found, (name, found)
        (found,) = _plans_of(store, cases["one cell"])
        assert "(run_id=? AND step=? AND benchmark=? AND scorer=? AND n=?" in found  # the whole evaluation's range
    finally:
        store.close()


def test_a_version_5_store_is_upgraded_with_every_sample_kept(db_url, tmp_path):
    """Version 6 keys the samples by evaluation (and on SQLite drops the rowid); a version 5 store's samples
    table is rebuilt with every row and the same scores; a second open does nothing."""
    rng = random.Random(3)
    store = open_store(db_url)
    store.record_plans([plan(i, tmp_path) for i in ("a", "b")], "sw")
    rows = [r for i in ("a", "b") for s in (1, 2) for r in sample_rows(i, s, "aime24", "dapo", P1, 4, rng)]
    with store.engine.begin() as conn:  # the layout version 5 wrote, holding these rows
        conn.exec_driver_sql("DROP TABLE samples")
        conn.exec_driver_sql("DROP TABLE problem_counts")  # version 8's
        conn.exec_driver_sql(V5_SAMPLES)
        if conn.dialect.name != "sqlite":  # version 5's foreign keys (SQLite's were never enforced)
            for table in ("metrics", "evals"):
                conn.exec_driver_sql(f"ALTER TABLE {table} ADD FOREIGN KEY (run_id) REFERENCES runs (id)")
        conn.execute(sa.insert(store.t.samples), rows)
        conn.exec_driver_sql("UPDATE schema_version SET version = 5")
    before = old_scores(store, ["a", "b"])
    store.close()

    store = open_store(db_url, create=False)  # upgraded as `rpg report` opens it
    try:
        with store.engine.connect() as conn:
            assert migrations.current_version(conn, store.t) == migrations.LATEST == 8
            assert sa.inspect(conn).get_pk_constraint("samples")["constrained_columns"] == list(SAMPLES_KEY)
            if conn.dialect.name == "sqlite":
                ddl = conn.exec_driver_sql("SELECT sql FROM sqlite_master WHERE name = 'samples'").scalar()
                assert "WITHOUT ROWID" in ddl.upper()
                assert not conn.exec_driver_sql("SELECT name FROM sqlite_master WHERE name LIKE '%v5%'").all()
            else:
                assert not [fk for t in ("metrics", "evals", "samples") for fk in sa.inspect(conn).get_foreign_keys(t)]
            names = [c.name for c in store.t.samples.columns]
            stored = conn.execute(sa.select(store.t.samples)).all()
        assert sorted(tuple(r) for r in stored) == sorted(tuple(r[n] for n in names) for r in rows)
        assert [tuple(r) for r in store.problem_scores(["a", "b"])] == before
        store.record_samples(rows[:3])  # the new key takes the same rows again: upserted, not doubled
        assert [tuple(r) for r in store.problem_scores(["a", "b"])] == before
    finally:
        store.close()
    open_store(db_url, create=False).close()  # a second open: nothing to do


# ------------------------------------------------------------------------------------------ bulk ingestion


def _table_rows(store, table: sa.Table) -> list[tuple]:
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.select(table).order_by(*table.primary_key.columns))]


@pytest.mark.parametrize("replace", [True, False])
def test_bulk_upsert_keeps_row_by_row_semantics_on_every_path(db_url, tmp_path, monkeypatch, replace):
    """Batches below and above COPY_MIN_ROWS (PostgreSQL's COPY path), a key twice in one batch, keys already
    stored: the table ends as writing the rows one by one leaves it (last wins, or first new one)."""
    store = open_store(db_url)
    try:
        store.record_plans([plan("r", tmp_path)], "sw")
        m = store.t.metrics
        old = [("r", f"k{k}", s, 1.0) for k in range(3) for s in range(50)]
        new = [("r", f"k{k}", s, 2.0 + s) for k in range(2, 5) for s in range(40, 90)]
        new += [("r", "k4", 60, -1.0), ("r", "k0", 10, None), ("r", "k0", 10, float("inf"))]  # twice in the batch
        expected = {row[:3]: row for row in old}
        for row in new:  # row by row: the last row of a key wins, or (insert-new) the stored or first one stays
            if replace:
                expected[row[:3]] = row
            else:
                expected.setdefault(row[:3], row)
        results = []
        for threshold in (10**9, 1):  # executemany; COPY (PostgreSQL)
            monkeypatch.setattr(bulk, "COPY_MIN_ROWS", threshold)
            with store.engine.begin() as conn:
                conn.execute(m.delete())
            with store._write() as conn:
                bulk.bulk_upsert(conn, m, old)
                bulk.bulk_upsert(conn, m, new, replace)  # one transaction writes the table twice
            results.append(_table_rows(store, m))
        assert results[0] == results[1] == sorted(expected.values(), key=lambda row: row[:3])
    finally:
        store.close()


def test_reads_one_by_one_see_one_snapshot(tmp_path):
    """SQLite's thousands of small reads (a plot's curves, a table's problems) run in one transaction: rows a
    writer commits between two of them are not seen, the reads agree with each other (and SQLite keeps one lock
    and its page cache, not one of each per read)."""
    url = f"sqlite:///{tmp_path / 'results.db'}"
    store, writer = open_store(url), open_store(url)
    try:
        store.record_plans([plan("r", tmp_path)], "sw")
        path = tmp_path / "r" / "metrics.jsonl"
        path.parent.mkdir(parents=True)
        path.write_text("".join(json.dumps({"step": s, "data": {"a": float(s)}}) + "\n" for s in (1, 2)))
        store.ingest_metrics("r", path)
        m = store.t.metrics.c
        one = sa.select(m.step, m.value).where(m.run_id == sa.bindparam("run_id"), m.key == sa.bindparam("key"))
        with store.engine.connect() as conn, queries._driver_reads(conn, one.order_by(m.step)) as read:
            before = read(run_id="r", key="a")
            with open(path, "a") as f:
                f.write(json.dumps({"step": 3, "data": {"a": 3.0}}) + "\n")
            writer.ingest_metrics("r", path)  # committed by another connection meanwhile
            assert read(run_id="r", key="a") == before == [(1, 1.0), (2, 2.0)]
        assert store.series(["r"], ["a"])[("r", "a")] == ([1, 2, 3], [1.0, 2.0, 3.0])  # a new read sees it
    finally:
        store.close()
        writer.close()


def test_metrics_of_a_live_and_a_finished_run_ingest_alike_on_both_dialects(db_url, tmp_path):
    """ingest_metrics through the bulk path (chunks big enough for COPY): a step logged twice keeps its last
    value, NaN is NULL; once the run has finished, a file that grows only adds the (step, key) it lacks."""
    store = open_store(db_url)
    try:
        store.record_plans([plan("r", tmp_path)], "sw")
        path = tmp_path / "r" / "metrics.jsonl"
        path.parent.mkdir(parents=True)
        lines = [{"step": s, "data": {"a": s, "b": -s, "c": float("nan") if s == 5 else 0.5}} for s in range(1, 101)]
        lines.append({"step": 7, "data": {"a": 700.0}})  # logged again: the later value wins
        path.write_text("".join(json.dumps(x) + "\n" for x in lines))
        assert store.ingest_metrics("r", path) == 301
        series = store.series(["r"], ["a", "b", "c"])
        assert series[("r", "a")][1][6] == 700.0 and len(series[("r", "a")][0]) == 100
        assert 5 not in series[("r", "c")][0]  # NaN: stored as NULL, left out of curves
        assert store.logged_keys(["x", "r"], ["zz", "c", "a"]) == {"a", "c"} and store.logged_keys([], ["a"]) == set()
        with pytest.MonkeyPatch.context() as mp:  # the other way of reading (SQLite's per key, or a server's)
            dialect = store.engine.dialect.name
            mp.setattr("rpg_cli.store.queries.IN_PROCESS", frozenset() if dialect == "sqlite" else frozenset({dialect}))
            assert store.series(["r"], ["a", "b", "c"]) == series
        m = store.t.metrics.c  # what one plain query of the rows gives
        with store.engine.connect() as conn:
            rows = conn.execute(sa.select(m.key, m.step, m.value).where(m.value.is_not(None)).order_by(m.key, m.step))
            plain: dict = {}
            for key, step, value in rows:
                plain.setdefault(("r", key), ([], []))[0].append(step)
                plain[("r", key)][1].append(value)
        assert series == plain and store.series(["r", "ghost"], ["a", "zz"]) == {("r", "a"): plain[("r", "a")]}
        store.set_status("r", "succeeded")
        more = [{"step": 7, "data": {"a": -1.0, "d": 1.0}}] + [{"step": s, "data": {"a": s}} for s in range(101, 201)]
        with open(path, "a") as f:
            f.write("".join(json.dumps(x) + "\n" for x in more))
        store.ingest_metrics("r", path)
        a = dict(zip(*store.series(["r"], ["a"])[("r", "a")]))
        assert a[7] == 700.0 and len(a) == 200  # a finished run's rows are never replaced, new steps added
        assert store.latest_values(["r"], ["d"]) == {"r": {"d": (7, 1.0)}}
    finally:
        store.close()


def test_samples_recorded_in_bulk_are_upserted_once_on_both_dialects(db_url, tmp_path):
    store = open_store(db_url)
    try:
        store.record_plans([plan("r", tmp_path)], "sw")
        rows = sample_rows("r", 1, "aime24", "dapo", P1, 40, random.Random(5))  # 160 rows: COPY on PostgreSQL
        assert store.record_samples(rows) == len(rows)
        flipped = [{**r, "correct": not r["correct"]} for r in rows[:100]]
        assert store.record_samples(flipped + rows[100:] + flipped[:1]) == len(rows) + 1
        with store.engine.connect() as conn:
            assert conn.execute(sa.select(sa.func.count()).select_from(store.t.samples)).scalar() == len(rows)
            flips = conn.execute(sa.select(sa.func.count()).where(store.t.samples.c.correct == rows[0]["correct"]))
            assert flips.scalar() == sum(r["correct"] == rows[0]["correct"] for r in flipped + rows[100:])
    finally:
        store.close()


def test_a_row_postgresql_refuses_for_another_reason_than_its_key_is_not_retried(postgres_db, tmp_path):
    """The COPY path retries with ON CONFLICT only for a key stored already: a sample without its verdict breaks
    a NOT NULL rule, and that error reaches the caller with nothing written."""
    store = open_store(postgres_db)
    try:
        store.record_plans([plan("ghost", tmp_path)], "sw")
        rows = sample_rows("ghost", 1, "aime24", "dapo", P1, 40, random.Random(2))
        broken = [dict(row, correct=None) if i == 70 else row for i, row in enumerate(rows)]
        with pytest.raises(sa.exc.IntegrityError, match="not-null"):
            store.record_samples(broken)
        assert store.problem_scores(["ghost"]) == []
        assert store.record_samples(rows) == len(rows)  # the same connection pool, usable again
    finally:
        store.close()


# ------------------------------------------------------------------------- per-problem counts (version 8)


def stored_counts(store) -> list[tuple]:
    with store.engine.connect() as conn:
        return sorted(tuple(r) for r in conn.execute(sa.select(store.t.problem_counts)))


def counted_from_samples(store) -> list[tuple]:
    """What the samples stored say, counted afresh: what problem_counts must hold."""
    from rpg_cli.store import counts

    with store.engine.connect() as conn:
        return sorted(tuple(r) for r in conn.execute(counts.derived(store.t, sa.true())))


def test_the_counts_are_what_the_samples_say_however_they_were_written(db_url, tmp_path, monkeypatch):
    """An evaluation written in pieces (a problem's samples split between writes), written again, a verdict
    replaced: the counts follow the samples, nothing counted twice; problem_scores gives the old query's answer."""
    from rpg_cli.store import counts

    monkeypatch.setattr(counts, "PROBLEMS_PER_STATEMENT", 7)  # a write's problems over several statements
    store = open_store(db_url)
    try:
        store.record_plans([plan("r", tmp_path)], "sw")
        rows = sample_rows("r", 2, "aime24", "dapo", P1, 40, random.Random(9))  # 160 rows: COPY on PostgreSQL
        for lo in range(0, len(rows), 70):  # pieces that cut problems in two
            store.record_samples(rows[lo : lo + 70])
            assert stored_counts(store) == counted_from_samples(store)
        whole = old_scores(store, ["r"])
        assert [tuple(r) for r in store.problem_scores(["r"])] == whole and len(whole) == 40
        store.record_samples(rows[::-1])  # again, in another order
        assert [tuple(r) for r in store.problem_scores(["r"])] == whole
        flipped = {**rows[5], "correct": not rows[5]["correct"]}
        store.record_samples([flipped])  # a part of a problem: counted from the table
        assert stored_counts(store) == counted_from_samples(store)
        first = [r for r in rows if r["problem"] == rows[0]["problem"]]  # a whole problem twice: the last copy wins
        store.record_samples(first + [{**r, "correct": True} for r in first])
        assert stored_counts(store) == counted_from_samples(store)
        assert [tuple(r) for r in store.problem_scores(["r"])] == old_scores(store, ["r"]) != whole
    finally:
        store.close()


def test_samples_and_their_counts_are_written_together_or_not_at_all(db_url, tmp_path, monkeypatch):
    from rpg_cli.store import counts

    store = open_store(db_url)
    try:
        store.record_plans([plan("r", tmp_path)], "sw")
        rows = sample_rows("r", 2, "aime24", "dapo", P1, 3, random.Random(2))

        def fails(*args):
            raise sa.exc.OperationalError("INSERT INTO problem_counts", {}, Exception("disk I/O error"))

        monkeypatch.setattr(counts, "refresh", fails)
        with pytest.raises(sa.exc.OperationalError):
            store.record_samples(rows)
        monkeypatch.undo()
        assert stored_counts(store) == counted_from_samples(store) == []  # no sample kept without its count
        store.record_samples(rows)
        assert stored_counts(store) == counted_from_samples(store) != []
    finally:
        store.close()


def test_a_version_7_store_gains_its_counts_from_the_samples_it_holds(db_url, tmp_path):
    rng = random.Random(4)
    store = open_store(db_url)
    try:
        store.record_plans([plan(i, tmp_path) for i in ("a", "b")], "sw")
        for run_id in ("a", "b"):
            for step in (1, 2):
                store.record_samples(sample_rows(run_id, step, "aime24", "dapo", P1, 6, rng))
        before = old_scores(store, ["a", "b"])
        with store.engine.begin() as conn:  # what version 7 wrote: no counts
            conn.exec_driver_sql("DROP TABLE problem_counts")
            conn.exec_driver_sql("UPDATE schema_version SET version = 7")
    finally:
        store.close()
    store = open_store(db_url, create=False)  # upgraded as `rpg report` opens it
    try:
        with store.engine.connect() as conn:
            assert migrations.current_version(conn, store.t) == migrations.LATEST == 8
        assert stored_counts(store) == counted_from_samples(store) and stored_counts(store)
        assert [tuple(r) for r in store.problem_scores(["a", "b"])] == before
    finally:
        store.close()
