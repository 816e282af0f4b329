"""The read-only queries behind the report and `rpg eval`: mixed into `Store`, so every query of the
project lives in this package. Callers decide what to ask (which scorer, which k); these only ask."""

from __future__ import annotations

import contextlib
import itertools
import operator
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import sqlalchemy as sa

from rpg_cli.store.schema import PROBLEM_KEY, PROTOCOL

if TYPE_CHECKING:
    from rpg_cli.store.schema import Schema

SERIES_CHUNK = 50_000  # rows per fetch of series() from a server: millions of values without holding them twice
# The dialects whose database runs in this process: a statement costs microseconds, so thousands of reads of one
# key range each beat one read of them all, whose rows carry their keys (millions of repeated strings: half its
# time). A server costs a round trip per statement: there, one read.
IN_PROCESS = frozenset({"sqlite"})
PROBLEM_KEYS = 5000  # runs or (run, step) pairs per query of problem_scores: under SQLite's 32,766 parameters
Protocol = Mapping[str, Any]  # n, temperature, top_p, max_tokens, seed (schema.PROTOCOL): how samples were drawn


class ProblemScore(NamedTuple):
    """One problem's accuracy in one evaluation: the mean over its n samples (`Store.problem_scores`)."""

    run_id: str
    step: int
    benchmark: str
    scorer: str
    n: int
    temperature: float
    top_p: float
    max_tokens: int
    seed: int
    problem: str  # fingerprint of the prompt and the ground truth
    position: int | None  # its index among the benchmark's unique problems
    accuracy: float  # correct samples / n


# (run_id, group, last step, values counted, value at the last step, best value, first step, value there)
LastAndBest = tuple[str, str, int, int, "float | None", "float | None", int, "float | None"]

# Distinct keys under a prefix by a "skip scan": per run, hop from one key to the next greater one
# through the (run_id, key, step) primary key, so the cost is one index seek per distinct key, not a
# scan of every logged step (a plain DISTINCT reads all 400 steps x all val keys of every run).
_KEYS_SQL = """
WITH RECURSIVE found(run_id, key) AS (
    SELECT r.id, (SELECT MIN(m.key) FROM metrics m WHERE m.run_id = r.id AND m.key >= :lo AND m.key < :hi)
    FROM runs r WHERE r.id IN :ids
    UNION ALL
    SELECT f.run_id, (SELECT MIN(m.key) FROM metrics m WHERE m.run_id = f.run_id AND m.key > f.key AND m.key < :hi)
    FROM found f WHERE f.key IS NOT NULL
)
SELECT DISTINCT key FROM found WHERE key IS NOT NULL
"""


class Queries:
    engine: sa.Engine
    t: Schema

    # -- scores (the report) ------------------------------------------------------------------------

    def eval_combos(self, run_ids: Sequence[str]) -> set[tuple[str, int, str]]:
        """(metric, k, scorer) of every `evals` row of these runs."""
        e = self.t.evals.c
        query = sa.select(e.metric, e.k, e.scorer).where(e.run_id.in_(list(run_ids))).distinct()
        with self.engine.connect() as conn:
            return {(metric, k, scorer) for metric, k, scorer in conn.execute(query)}

    def eval_row_counts(
        self, run_ids: Sequence[str], k: int, scorers: Sequence[str], metrics: Sequence[str]
    ) -> dict[str, int]:
        """Rows per scorer among `evals` of these runs with this k and one of these metric names."""
        e = self.t.evals.c
        query = (
            sa.select(e.scorer, sa.func.count())
            .where(e.run_id.in_(list(run_ids)), e.k == k, e.scorer.in_(list(scorers)), e.metric.in_(list(metrics)))
            .group_by(e.scorer)
        )
        with self.engine.connect() as conn:
            return dict(conn.execute(query).all())

    def metric_keys(self, run_ids: Sequence[str], prefix: str) -> list[str]:
        """Every metrics key starting with `prefix` that any of the runs logged, sorted."""
        if not run_ids:
            return []
        hi = prefix[:-1] + chr(ord(prefix[-1]) + 1)  # the first string after every one with the prefix
        query = sa.text(_KEYS_SQL).bindparams(sa.bindparam("ids", expanding=True))
        with self.engine.connect() as conn:
            return sorted(conn.execute(query, {"ids": list(run_ids), "lo": prefix, "hi": hi}).scalars())

    def eval_protocols(
        self, run_ids: Sequence[str], metrics: Sequence[str], k: int, scorer: str
    ) -> list[tuple[dict[str, Any], set[str]]]:
        """The protocols (schema.PROTOCOL) under which these runs have `evals` rows of this k, scorer and
        one of these metric names, each with the runs that have them: most runs first."""
        e = self.t.evals.c
        cols = [e[name] for name in PROTOCOL]
        query = (
            sa.select(*cols, e.run_id)
            .where(e.run_id.in_(list(run_ids)), e.metric.in_(list(metrics)), e.k == k, e.scorer == scorer)
            .distinct()
        )
        found: dict[tuple[Any, ...], set[str]] = {}
        with self.engine.connect() as conn:
            for *protocol, run_id in conn.execute(query):
                found.setdefault(tuple(protocol), set()).add(run_id)
        ranked = sorted(found.items(), key=lambda item: (-len(item[1]), item[0]))
        return [(dict(zip(PROTOCOL, protocol)), runs) for protocol, runs in ranked]

    def last_and_best_evals(
        self, run_ids: Sequence[str], metrics: Sequence[str], k: int, scorer: str, protocol: Protocol | None = None
    ) -> list[LastAndBest]:
        """Per (run, benchmark): Last/Best/first of the `evals` rows with one of these metric names,
        under one protocol (give it when the runs have several: eval_protocols)."""
        e = self.t.evals.c
        filters = [
            e.run_id.in_(list(run_ids)),
            e.metric.in_(list(metrics)),
            e.k == k,
            e.scorer == scorer,
            e.value.is_not(None),
            *_same(self.t.evals, protocol),
        ]
        return self._last_and_best(self.t.evals, e.benchmark, filters)

    def eval_series(
        self, run_ids: Sequence[str], metrics: Sequence[str], k: int, scorer: str, protocol: Protocol | None = None
    ) -> dict[tuple[str, str], dict[int, float]]:
        """{(run, benchmark): {step: value}} of the `evals` rows with one of these metric names, k and
        scorer, under one protocol: every evaluated step (the report's val-selected Best and
        `rpg compare --step` read them)."""
        e = self.t.evals.c
        query = sa.select(e.run_id, e.benchmark, e.step, e.value).where(
            e.run_id.in_(list(run_ids)),
            e.metric.in_(list(metrics)),
            e.k == k,
            e.scorer == scorer,
            e.value.is_not(None),
            *_same(self.t.evals, protocol),
        )
        out: dict[tuple[str, str], dict[int, float]] = {}
        with self.engine.connect() as conn:
            for run_id, bench, step, value in conn.execute(query):
                out.setdefault((run_id, bench), {})[step] = value
        return out

    def last_and_best_metrics(self, run_ids: Sequence[str], keys: Sequence[str]) -> list[LastAndBest]:
        """Per (run, key): Last/Best/first of these training metrics (NaN left out)."""
        m = self.t.metrics.c
        return self._last_and_best(
            self.t.metrics, m.key, [m.run_id.in_(list(run_ids)), m.key.in_(list(keys)), m.value.is_not(None)]
        )

    def _last_and_best(self, table: sa.Table, group_col: Any, filters: list[Any]) -> list[LastAndBest]:
        """Aggregated in the database: min/max(step) and max(value) per (run, group), then the values at
        those steps."""
        c = table.c
        agg = (
            sa.select(
                c.run_id.label("run_id"),
                group_col.label("grp"),
                sa.func.max(c.step).label("last_step"),
                sa.func.count(c.value).label("n"),
                sa.func.max(c.value).label("best"),
                sa.func.min(c.step).label("first_step"),
            )
            .where(*filters)
            .group_by(c.run_id, group_col)
            .subquery()
        )
        first = table.alias("first")
        f = first.c
        adapter = sa.sql.util.ClauseAdapter(first)  # the filters, restated against the alias
        query = (
            sa.select(agg.c.run_id, agg.c.grp, agg.c.last_step, agg.c.n, c.value, agg.c.best, agg.c.first_step, f.value)
            .select_from(agg)
            .join(table, sa.and_(c.run_id == agg.c.run_id, group_col == agg.c.grp, c.step == agg.c.last_step, *filters))
            .join(
                first,
                sa.and_(
                    f.run_id == agg.c.run_id,
                    getattr(f, group_col.key) == agg.c.grp,
                    f.step == agg.c.first_step,
                    *(adapter.traverse(x) for x in filters),
                ),
            )
        )
        with self.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(query)]

    # -- training curves (the plots) ----------------------------------------------------------------

    def changed_files(self, run_ids: Iterable[str]) -> dict[str, str]:
        """The runs whose metrics.jsonl stopped matching what the store read, and how and when (the last
        time): the store kept its rows instead of believing the file (ingest.py); `rpg runs` marks them."""
        mf = self.t.metric_files.c
        ids = list(run_ids)
        query = sa.select(mf.run_id, mf.changed).where(mf.run_id.in_(ids), mf.changed.is_not(None))
        with self.engine.connect() as conn:
            return {run_id: note for run_id, note in conn.execute(query)} if ids else {}

    def logged_keys(self, run_ids: Sequence[str], keys: Iterable[str]) -> set[str]:
        """Which of `keys` any of the runs logged: per key, one seek per run until a first row is found (a
        DISTINCT over all keys would read every row of every key asked for: millions for thousands of runs)."""
        m = self.t.metrics.c
        ids = list(run_ids)
        query = sa.select(m.key).where(m.run_id.in_(ids), m.key == sa.bindparam("wanted")).limit(1)
        with self.engine.connect() as conn:
            return {key for key in sorted(keys) if ids and conn.execute(query, {"wanted": key}).first() is not None}

    def series(
        self, run_ids: Sequence[str], keys: Sequence[str]
    ) -> dict[tuple[str, str], tuple[list[int], list[float]]]:
        """{(run id, key): (steps, values)} in step order; NaN (NULL) values are left out. A plot of thousands
        of runs reads millions of values: in process, one read per (run, key) (IN_PROCESS); else one query, its
        rows taken as the driver's tuples in pieces, a (run, key)'s rows together as they come in key order."""
        m = self.t.metrics.c
        out: dict[tuple[str, str], tuple[list[int], list[float]]] = {}
        with self.engine.connect() as conn:
            if conn.dialect.name in IN_PROCESS:
                one = sa.select(m.step, m.value).where(
                    m.run_id == sa.bindparam("run_id"), m.key == sa.bindparam("key"), m.value.is_not(None)
                )
                with _driver_reads(conn, one.order_by(m.step)) as read:
                    for run_id in run_ids:
                        for key in keys:
                            if rows := read(run_id=run_id, key=key):
                                steps, values = zip(*rows)
                                out[(run_id, key)] = (list(steps), list(values))
                return out
            query = (
                sa.select(m.run_id, m.key, m.step, m.value)
                .where(m.run_id.in_(list(run_ids)), m.key.in_(list(keys)), m.value.is_not(None))
                .order_by(m.run_id, m.key, m.step)
            )
            cursor = conn.execute(query).cursor
            while chunk := cursor.fetchmany(SERIES_CHUNK):
                for (run_id, key), rows in itertools.groupby(chunk, key=operator.itemgetter(0, 1)):
                    steps, values = out.setdefault((run_id, key), ([], []))
                    for _, _, step, value in rows:
                        steps.append(step)
                        values.append(value)
        return out

    # -- samples and scores of one evaluation (`rpg eval`) -----------------------------------------

    def stored_samples(
        self, run_id: str, step: int, benchmark: str, scorer: str, protocol: Protocol
    ) -> dict[str, list[tuple[str | None, bool]]]:
        """Problems with all n samples stored under this protocol: problem -> [(extracted answer,
        correct)] in sample order."""
        s = self.t.samples.c
        query = (
            sa.select(s.problem, s.sample_index, s.extracted, s.correct)
            .where(
                s.run_id == run_id,
                s.step == step,
                s.benchmark == benchmark,
                s.scorer == scorer,
                *_same(self.t.samples, protocol),
            )
            .order_by(s.problem, s.sample_index)
        )
        by_problem: dict[str, list[tuple[str | None, bool]]] = {}
        with self.engine.connect() as conn:
            for problem, _, extracted, correct in conn.execute(query):
                by_problem.setdefault(problem, []).append((extracted, bool(correct)))
        return {p: samples for p, samples in by_problem.items() if len(samples) == protocol["n"]}

    def eval_values(
        self, run_id: str, step: int, benchmark: str, scorer: str, metrics: Sequence[str], protocol: Protocol
    ) -> list[tuple[str, int, float | None]]:
        """(metric, k, value) of one evaluated checkpoint and benchmark under one protocol."""
        e = self.t.evals.c
        query = sa.select(e.metric, e.k, e.value).where(
            e.run_id == run_id,
            e.step == step,
            e.benchmark == benchmark,
            e.scorer == scorer,
            e.metric.in_(list(metrics)),
            *_same(self.t.evals, protocol),
        )
        with self.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(query)]

    def count_samples(
        self,
        run_id: str,
        steps: Sequence[int],
        benchmark: str,
        scorer: str,
        protocol: Protocol,
        problems: Sequence[str],
    ) -> int:
        """Samples stored for these checkpoints of a run, under this protocol, of these problems."""
        s = self.t.samples.c
        query = sa.select(sa.func.count()).where(
            s.run_id == run_id,
            s.step.in_(list(steps)),
            s.benchmark == benchmark,
            s.scorer == scorer,
            s.problem.in_(list(problems)),
            *_same(self.t.samples, protocol),
        )
        with self.engine.connect() as conn:
            return conn.execute(query).scalar_one()

    def problem_scores(
        self,
        run_ids: Sequence[str],
        step: int | None = None,
        benchmark: str | None = None,
        scorer: str | None = None,
        *,
        steps: Mapping[str, Collection[int]] | None = None,
        protocol: Protocol | None = None,
    ) -> list[ProblemScore]:
        """Per-problem accuracy (correct samples / n) of every evaluation of these runs stored with its
        samples (`rpg eval`), optionally of one step, benchmark or scorer; each with its protocol.
        `steps`: only these steps of each run (a run it does not name: none); `protocol` (schema.PROTOCOL's
        five names): only that protocol. None: every step, every protocol.

        What interval statistics start from: an evaluation is one (run, step, benchmark, scorer,
        protocol); group the rows by it, never across protocols. Only problems with all n samples
        stored count (an interrupted evaluation has the others still to come). Ordered by run, step,
        benchmark, scorer, protocol, position.

        Reads only what is asked, a row per problem: the problems' counts (schema v8, counts.py: kept as the
        samples are written) are keyed by evaluation first, so the (run, step)s asked for are key ranges (only
        the rows read are sorted by position). Runs asked for the same steps share one query; PROBLEM_KEYS runs
        at most each (the driver's parameter limit).
        """
        p = self.t.problem_counts.c
        evaluation = [p[name] for name in ("run_id", "step", "benchmark", "scorer", *PROTOCOL)]
        fixed = {"step": step, "benchmark": benchmark, "scorer": scorer, **(protocol or {})}
        base = (
            sa.select(*evaluation, p.problem, p.position, p.correct, p.samples)
            .where(p.samples == p.n)
            .order_by(*evaluation, p.position, p.problem)
        )
        asks = _step_groups(sorted(set(run_ids)), steps, step)
        out: list[ProblemScore] = []
        with self.engine.connect() as conn:
            for ids, wanted in asks:
                filters = _key_filters(self.t.problem_counts, conn.dialect.name, ids, wanted, fixed)
                rows = conn.execute(base.where(*filters)).all()  # whole: iterating fetches a row at a time
                out.extend(ProblemScore(*row[:-2], row[-2] / row[-1]) for row in rows)
            if len(asks) > 1:  # the pieces in the database's order of runs (its collation), each run's kept
                rank = {run_id: i for i, run_id in enumerate(self._run_order(conn, run_ids))}
                out.sort(key=lambda row: rank[row.run_id])
        return out

    def evaluation_problems(
        self, steps: Mapping[str, Collection[int]], benchmark: str, scorer: str, protocol: Protocol
    ) -> dict[tuple[str, int], tuple[tuple[str, ...], tuple[int, ...]]]:
        """{(run id, step): (problems, each one's correct samples)} of the evaluations of these steps of each run
        on one benchmark under one scorer and protocol (n samples each), problems in position order, only those
        with all n samples stored: `problem_scores` narrowed to what an interval needs, no row object per
        problem. In process, one read per evaluation (IN_PROCESS); else the runs asked for the same steps in one
        query (PROBLEM_KEYS at most)."""
        p = self.t.problem_counts.c
        fixed = {"benchmark": benchmark, "scorer": scorer, **protocol}
        out: dict[tuple[str, int], tuple[tuple[str, ...], tuple[int, ...]]] = {}
        with self.engine.connect() as conn:
            if conn.dialect.name in IN_PROCESS:
                one = sa.select(p.problem, p.correct).where(
                    p.run_id == sa.bindparam("run_id"),
                    p.step == sa.bindparam("step"),
                    *(p[name] == value for name, value in fixed.items()),
                    p.samples == p.n,
                )
                with _driver_reads(conn, one.order_by(p.position, p.problem)) as read:
                    for run_id, run_steps in steps.items():
                        for step in sorted(set(run_steps)):
                            if rows := read(run_id=run_id, step=step):
                                problems, correct = zip(*rows)
                                out[(run_id, step)] = (problems, correct)
                return out
            order = [*(p[name] for name in PROBLEM_KEY[:-1]), p.position, p.problem]  # evaluation, then position
            query = sa.select(p.run_id, p.step, p.problem, p.correct).where(p.samples == p.n).order_by(*order)
            for ids, wanted in _step_groups(sorted(steps), steps, None):
                filters = _key_filters(self.t.problem_counts, conn.dialect.name, ids, wanted, fixed)
                rows = conn.execute(query.where(*filters)).cursor.fetchall()  # the driver's tuples
                for evaluated, group in itertools.groupby(rows, key=operator.itemgetter(0, 1)):
                    _, _, problems, correct = zip(*group)
                    out[evaluated] = (problems, correct)
        return out

    def _run_order(self, conn: sa.Connection, run_ids: Sequence[str]) -> list[str]:
        """These run ids sorted as the database sorts them (ORDER BY: its collation, not Python's); one read of
        the runs' ids, which every store holds few enough of."""
        wanted = set(run_ids)
        ordered = conn.execute(sa.select(self.t.runs.c.id).order_by(self.t.runs.c.id)).scalars()
        return [run_id for run_id in ordered if run_id in wanted]


@contextlib.contextmanager
def _driver_reads(conn: sa.Connection, statement: sa.Select) -> Iterator[Callable[..., list[tuple[Any, ...]]]]:
    """`read(**params)`: the rows of `statement` (its parameters named by bindparam) for these values, compiled
    once and run on one cursor of the driver's: for thousands of small reads, each costs the database's work."""
    if not conn.in_transaction():  # one snapshot for them all (SQLite: one lock, and its page cache kept)
        conn.begin()
    compiled = statement.compile(dialect=conn.dialect)
    names = compiled.positiontup if compiled.positional else None
    fixed = compiled.params  # the statement's own values (its comparisons with constants)
    cursor = conn.connection.driver_connection.cursor()

    def read(**params: Any) -> list[tuple[Any, ...]]:
        values = fixed | params
        cursor.execute(compiled.string, values if names is None else tuple(values[n] for n in names))
        return cursor.fetchall()

    try:
        yield read
    finally:
        cursor.close()


def _step_groups(
    ids: list[str], steps: Mapping[str, Collection[int]] | None, step: int | None
) -> list[tuple[list[str], list[int] | None]]:
    """(runs, their steps: None for every step) to ask for, PROBLEM_KEYS runs at most each: runs asked for the
    same steps together (a run `steps` does not name: none of its steps)."""
    by_steps: dict[tuple[int, ...] | None, list[str]] = {}
    for run_id in ids:
        wanted = None if steps is None else tuple(sorted({int(x) for x in steps.get(run_id, ())}))
        if wanted is not None and step is not None:
            wanted = tuple(x for x in wanted if x == step)
        if wanted == ():
            continue
        by_steps.setdefault(wanted, []).append(run_id)
    return [
        (runs[lo : lo + PROBLEM_KEYS], None if wanted is None else list(wanted))
        for wanted, runs in by_steps.items()
        for lo in range(0, len(runs), PROBLEM_KEYS)
    ]


def _key_filters(
    table: sa.Table, dialect: str, ids: list[str], steps: list[int] | None, fixed: Mapping[str, Any]
) -> list[Any]:
    """The WHERE of problem_scores: runs and steps, and each fixed value (None: any). On SQLite, a constraint
    on a key column after the first one left free is written `+column = value`: SQLite then filters on it
    instead of grouping the rows over again in a temporary b-tree (they already arrive in the key's order)."""
    c = table.c
    filters = [c.run_id.in_(ids)]
    prefix = True
    for name in PROBLEM_KEY[1:]:
        if name == "step" and steps is not None:
            filters.append(c.step.in_(steps))
            continue
        value = fixed.get(name)
        if value is None:
            prefix = False
            continue
        column = c[name] if prefix or dialect != "sqlite" else sa.literal_column(f"+{table.name}.{name}", c[name].type)
        filters.append(column == value)
    return filters


def _same(table: sa.Table, protocol: Protocol | None) -> list[Any]:
    """Filters: the rows of one protocol (none: any)."""
    return [table.c[name] == protocol[name] for name in PROTOCOL] if protocol is not None else []
