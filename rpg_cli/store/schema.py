"""The tables of the results store, at the latest schema version (migrations.py upgrades older files).

sweeps        name, created_at
runs          id, sweep (the sweep that created it: its directory is under that sweep's), name, spec
              (JSON), backend, run_dir, status, submission_id, attempts, created/started/finished_at
              (naive UTC), error (its tail), running_at; held_s and held_at (v7): the seconds the run held
              its devices in attempts that ended, and when its current attempt began holding them (rpg_cli/cost.py)
sweep_runs    (sweep, run): every sweep that lists a run; a run is its spec, shared by the sweeps
metrics       (run, key, step) -> value: the training metrics of metrics.jsonl, the latest attempt's
metric_files  how far each run's metrics.jsonl has been read, and which file that was (identity); the
              attempt whose restart the store last applied, and whether the file stopped matching
              what was read (ingest.py: the store is the record); when its last step last grew in the
              run's current attempt (a stall: rpg_cli/watch.py), and the step that attempt resumed after
              (the watchdog judges the steps it logs, not an earlier attempt's)
evals         (run, step, benchmark, metric, k, scorer, protocol) -> value, scorer_version
samples       (run, step, benchmark, scorer, protocol, problem, sample_index) -> position, extracted,
              correct, length; `problem` is a fingerprint of the prompt and the ground truth
problem_counts  (run, step, benchmark, scorer, protocol, problem) -> position, correct, samples (v8): the
              samples of each problem counted, kept with them as they are written (counts.py)
schema_version  one row: the version of this layout (see migrations.py)

The widths of the columns a job's files fill, and the range of an integer, are ingest.py's limits: what
it checks every field of those files against before a row is written.

The protocol of a score is how its samples were drawn: n (samples per problem), temperature, top_p,
max_tokens and seed. It is part of every score's identity, so that scores under different protocols
never overwrite each other or mix: pass@k from n = 8 and from n = 32 are two rows.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import sqlalchemy as sa

from rpg_cli.states import STATUSES
from rpg_cli.store.ingest import KEY_CHARS, NAME_CHARS, PROBLEM_CHARS


class Schema(NamedTuple):
    metadata: sa.MetaData
    sweeps: sa.Table
    runs: sa.Table
    sweep_runs: sa.Table
    metrics: sa.Table
    metric_files: sa.Table
    evals: sa.Table
    samples: sa.Table
    problem_counts: sa.Table
    schema_version: sa.Table


PROTOCOL = ("n", "temperature", "top_p", "max_tokens", "seed")
# the samples' primary key, in its order (v6): an evaluation's rows, then each problem's, are key ranges
SAMPLES_KEY = ("run_id", "step", "benchmark", "scorer", *PROTOCOL, "problem", "sample_index")
# the per-problem counts' key (v8): the samples' less the sample
PROBLEM_KEY = SAMPLES_KEY[:-1]
CHANGED_CHARS = 300  # metric_files.changed: one line
STATUS_CHECK = "runs_status"  # the constraint that keeps runs.status one of states.STATUSES


def status_check() -> str:
    """The condition of runs.status: one of the states rpg knows (migrations.py renews it when they change)."""
    return "status IN ({})".format(", ".join(f"'{s}'" for s in STATUSES))


def protocol_columns(key: bool = True) -> list[sa.Column]:
    """How the samples of a score were drawn (module docstring); part of the primary key (`key` False: the
    table names its key in a constraint of its own, in its own order)."""
    return [
        sa.Column("n", sa.Integer, primary_key=key),  # samples per problem
        sa.Column("temperature", sa.Float, primary_key=key),
        sa.Column("top_p", sa.Float, primary_key=key),
        sa.Column("max_tokens", sa.Integer, primary_key=key),
        sa.Column("seed", sa.Integer, primary_key=key),
    ]


@functools.cache
def schema() -> Schema:
    md = sa.MetaData()
    run_fk = functools.partial(sa.ForeignKey, "runs.id", ondelete="CASCADE")
    sweeps = sa.Table(
        "sweeps",
        md,
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("created_at", sa.DateTime, nullable=False),
    )
    runs = sa.Table(
        "runs",
        md,
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("sweep", sa.String(200), sa.ForeignKey("sweeps.name"), nullable=False, index=True),
        sa.Column("name", sa.String(300), nullable=False),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("backend", sa.String(16), nullable=False),
        sa.Column("run_dir", sa.String(1000), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("submission_id", sa.String(100)),
        sa.Column("attempts", sa.Integer, nullable=False, default=0),
        sa.Column("created_at", sa.DateTime, nullable=False),  # all timestamps: naive UTC
        sa.Column("started_at", sa.DateTime),  # when Ray took the job (its queue time included)
        sa.Column("finished_at", sa.DateTime),
        sa.Column("error", sa.Text),  # the last ERROR_TAIL_CHARS of the failure message / log
        sa.Column("running_at", sa.DateTime),  # when rpg first saw its job running: out of Ray's queue (v3)
        # v7: device time (rpg_cli/cost.py): seconds held in the attempts that ended, and when the current attempt
        # began holding its devices (its job's mark, rundir.mark_held: after verl's wait for GPUs; NULL: not yet)
        sa.Column("held_s", sa.Float, nullable=False, default=0.0, server_default=sa.text("0")),
        sa.Column("held_at", sa.DateTime),
        sa.CheckConstraint(status_check(), name=STATUS_CHECK),
    )
    sweep_runs = sa.Table(
        "sweep_runs",
        md,
        sa.Column("sweep", sa.String(200), sa.ForeignKey("sweeps.name"), primary_key=True),
        sa.Column("run_id", sa.String(64), run_fk(), primary_key=True, index=True),
        sa.Column("added_at", sa.DateTime, nullable=False),
    )
    # Primary key (run, key, step): unique on the three, and ordered so that "latest value of key k
    # for run r" is one index seek. WITHOUT ROWID on SQLite: the key is the row, no second b-tree.
    # metrics, evals and samples name their run without a foreign key (v6): only ingestion writes them, for
    # runs it has recorded, and no run is ever deleted; PostgreSQL's per-row check of it was a third of its
    # ingest time, and SQLite (PRAGMA foreign_keys off) never enforced it.
    metrics = sa.Table(
        "metrics",
        md,
        sa.Column("run_id", sa.String(64), primary_key=True),
        sa.Column("key", sa.String(KEY_CHARS), primary_key=True),
        sa.Column("step", sa.Integer, primary_key=True),
        sa.Column("value", sa.Float),  # NULL stands for NaN (SQLite cannot store NaN)
        sqlite_with_rowid=False,
    )
    # How far each run's metrics.jsonl has been ingested, so re-ingesting reads only new bytes; and
    # which file that was (device:inode, a fingerprint of what was read), so a file started over or
    # rewritten is noticed whatever its size (ingest.py).
    metric_files = sa.Table(
        "metric_files",
        md,
        sa.Column("run_id", sa.String(64), run_fk(), primary_key=True),
        sa.Column("path", sa.String(1000), nullable=False),
        sa.Column("offset", sa.BigInteger, nullable=False),
        sa.Column("last_step", sa.Integer),
        sa.Column("file_id", sa.String(100)),  # NULL: not known (a version 1 row): read again
        sa.Column("fingerprint", sa.String(64)),
        sa.Column("lines", sa.BigInteger),  # lines read, for the line numbers of warnings
        sa.Column("restart_attempt", sa.Integer),  # the attempt whose restart was applied (v4; NULL: none)
        sa.Column("changed", sa.String(CHANGED_CHARS)),  # how the file stopped matching, when (v4; NULL: never)
        sa.Column("advanced_at", sa.DateTime),  # when last_step last grew in this attempt (v5; NULL: not yet)
        sa.Column("resumed_after", sa.Integer),  # this attempt's restart keep_through (v5; NULL: none, from scratch)
    )
    evals = sa.Table(
        "evals",
        md,
        sa.Column("run_id", sa.String(64), primary_key=True),
        sa.Column("step", sa.Integer, primary_key=True),
        sa.Column("benchmark", sa.String(NAME_CHARS), primary_key=True),
        sa.Column("metric", sa.String(16), primary_key=True),  # mean@k | pass@k | maj@k
        sa.Column("k", sa.Integer, primary_key=True),
        sa.Column("scorer", sa.String(NAME_CHARS), primary_key=True),
        *protocol_columns(),
        sa.Column("value", sa.Float),
        sa.Column("scorer_version", sa.String(NAME_CHARS)),
    )
    # Primary key (v6): the evaluation (run, step, benchmark, scorer, protocol) first, then problem and sample, so
    # that per-problem scores of the evaluations a report shows are one range read each, grouped in key order
    # (queries.problem_scores: no sort of the table). WITHOUT ROWID on SQLite: the key is the row, not stored twice.
    samples = sa.Table(
        "samples",
        md,
        sa.Column("run_id", sa.String(64)),
        sa.Column("step", sa.Integer),
        sa.Column("benchmark", sa.String(NAME_CHARS)),
        sa.Column("problem", sa.String(PROBLEM_CHARS)),  # fingerprint of prompt and ground truth
        sa.Column("sample_index", sa.Integer),
        sa.Column("scorer", sa.String(NAME_CHARS)),
        *protocol_columns(key=False),
        sa.Column("position", sa.Integer),  # the problem's index among its benchmark's unique problems
        sa.Column("extracted", sa.Text),  # the extracted answer, NULL when none was found
        sa.Column("correct", sa.Boolean, nullable=False),
        sa.Column("response_length", sa.Integer),
        sa.PrimaryKeyConstraint(*SAMPLES_KEY, name="samples_pkey"),
        sqlite_with_rowid=False,
    )
    # v8: each evaluation's problems, their samples counted (counts.py keeps them with the samples), so that a
    # report reads a row per problem, not one per sample; keyed as the samples, WITHOUT ROWID likewise
    problem_counts = sa.Table(
        "problem_counts",
        md,
        sa.Column("run_id", sa.String(64)),
        sa.Column("step", sa.Integer),
        sa.Column("benchmark", sa.String(NAME_CHARS)),
        sa.Column("scorer", sa.String(NAME_CHARS)),
        *protocol_columns(key=False),
        sa.Column("problem", sa.String(PROBLEM_CHARS)),
        sa.Column("position", sa.Integer),  # the lowest of its samples' (one, as `rpg eval` writes them)
        sa.Column("correct", sa.Integer, nullable=False),  # its samples judged correct
        sa.Column("samples", sa.Integer, nullable=False),  # its samples stored (all n: a complete problem)
        sa.PrimaryKeyConstraint(*PROBLEM_KEY, name="problem_counts_pkey"),
        sqlite_with_rowid=False,
    )
    schema_version = sa.Table("schema_version", md, sa.Column("version", sa.Integer, nullable=False))
    return Schema(md, sweeps, runs, sweep_runs, metrics, metric_files, evals, samples, problem_counts, schema_version)
