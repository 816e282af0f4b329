"""Per-problem counts (schema v8): each evaluation's problems with their samples counted, correct and all, kept
beside the samples as they are written, so that a report reads one row per problem instead of its n samples
(`queries.problem_scores`: a store of 10M samples at 32 a problem holds 320k problems).

Derived, never incremented: after samples are written, the counts of the (evaluation, problem)s they touch are
computed again, in the same transaction: from the rows written when they are the problem's n samples whole (the
table then holds exactly those), else from the samples table. The same samples written twice, a sample's verdict
replaced, an evaluation written in pieces: the counts are what the samples say, and a transaction that fails
writes neither.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from rpg_cli.store import bulk
from rpg_cli.store.schema import PROBLEM_KEY, Schema

# problems per statement: far under every driver's parameter limit, few statements for a benchmark
PROBLEMS_PER_STATEMENT = 500


def derived(t: Schema, *where: Any) -> sa.Select:
    """The counts the samples give, in problem_counts' column order, of the samples `where` selects: grouped in
    the samples' key order (an evaluation's rows are one key range: no sort)."""
    s = t.samples.c
    key = [s[name] for name in PROBLEM_KEY]
    correct = sa.func.sum(sa.case((s.correct, 1), else_=0))
    by_name = {name: column for name, column in zip(PROBLEM_KEY, key)}
    by_name |= {"position": sa.func.min(s.position), "correct": correct, "samples": sa.func.count()}
    columns = [by_name[c.name] for c in t.problem_counts.columns]
    return sa.select(*columns).where(*where).group_by(*key)


def refresh(conn: sa.Connection, t: Schema, rows: Sequence[tuple[Any, ...]]) -> None:
    """Count again every (evaluation, problem) these sample rows touch (tuples in the samples table's column
    order, in key order, just written in this transaction). A problem whose rows are exactly its n samples,
    indexes 0 to n-1 once each (what `rpg eval` writes: the samples table then holds just these), is counted
    from them, its counts written in bulk; any other from the samples table, one INSERT ... SELECT ... ON
    CONFLICT per evaluation, in key order (two writers of one evaluation lock its counts in the same order)."""
    names = t.samples.columns.keys()
    problem_key = operator.itemgetter(*(names.index(name) for name in PROBLEM_KEY))
    index, n_at, position, correct = (names.index(n) for n in ("sample_index", "n", "position", "correct"))
    whole, partial = [], {}
    for key, group in itertools.groupby(rows, key=problem_key):
        samples = list(group)
        n = samples[0][n_at]
        if [r[index] for r in samples] == list(range(n)):
            first = min((r[position] for r in samples if r[position] is not None), default=None)
            whole.append((*key, first, sum(bool(r[correct]) for r in samples), n))
        else:
            partial.setdefault(key[:-1], set()).add(key[-1])
    bulk.bulk_upsert(conn, t.problem_counts, whole)  # in key order, as the rows came
    if not partial:
        return
    statement = bulk.upsert(conn.dialect.name, t.problem_counts, derived(t, *_evaluation_filters(t)))
    for key, problems in sorted(partial.items()):
        fixed = {f"k_{name}": value for name, value in zip(PROBLEM_KEY[:-1], key)}
        ordered = sorted(problems)
        for lo in range(0, len(ordered), PROBLEMS_PER_STATEMENT):
            conn.execute(statement, {**fixed, "problems": ordered[lo : lo + PROBLEMS_PER_STATEMENT]})


def _evaluation_filters(t: Schema) -> list[Any]:
    """One evaluation's samples of some problems, its values bound at execution (one statement compiled)."""
    s = t.samples.c
    return [s[name] == sa.bindparam(f"k_{name}") for name in PROBLEM_KEY[:-1]] + [
        s.problem.in_(sa.bindparam("problems", expanding=True))
    ]


def backfill(conn: sa.Connection, t: Schema) -> None:
    """Every problem's counts from the samples already stored (the upgrade to version 8; the table is empty)."""
    names = [c.name for c in t.problem_counts.columns]
    conn.execute(t.problem_counts.insert().from_select(names, derived(t, sa.true())))
