"""Where a score comes from, and which one the report shows: the Last/Best of a metric per run and
benchmark, from `rpg eval` (the `evals` table), else from the validation the trainer logged (copied
into `evals` under VERL_VAL_SCORER at ingestion, else read from `metrics`). The store runs the queries;
this module decides what to ask."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rpg_cli import rundir
from rpg_cli.benchmarks import benchmark_name
from rpg_cli.metrics import VAL_CORE, VAL_KEY_RE
from rpg_cli.states import DONE, LIVE, run_action
from rpg_cli.store.ingest import VERL_VAL_SCORER

if TYPE_CHECKING:
    from rpg_cli.store import RunRecord, Store


class ReportError(RuntimeError):
    """Input the report cannot use (no runs, unknown sweep, metric nobody logged); one-line message."""


def select_runs(store: Store, sweep: str | None = None) -> list[RunRecord]:
    """The runs a report covers (a sweep's, or all); ReportError naming what exists when there are none."""
    runs = store.runs(sweep=sweep)
    if runs:
        return runs
    if sweep is not None and (sweeps := store.sweeps()):
        raise ReportError(f"no sweep {sweep!r} in the results store; sweeps: {', '.join(sweeps)}")
    raise ReportError("the results store has no runs yet; run `rpg sweep SPEC` first (or pass --db URL)")


# -------------------------------------------------------------------- runs that did not finish

RUNNING, DIVERGED = "running", "diverged"  # how a live run and a failed run that diverged are shown
REASON_CHARS = 200  # a reason in a footer: its first line, cut here


@dataclass(frozen=True)
class Unfinished:
    """A run that did not finish (any state but succeeded): it gives its cell no score from any source
    (a diverged run's own training validation never stands in for its missing evaluation), only a
    line in the footer, and it counts in the cell's seeds ("2/3")."""

    id: str
    name: str
    seed: Any
    state: str  # DIVERGED, failed, stopped, preempted, ... as stored; RUNNING for pending, submitted, running
    reason: str | None  # diverged: what went non-finite; else the stored error's first line
    step: int | None  # the step it reached (diverged: the step that diverged); None: none logged

    def text(self) -> str:
        """'diverged at step 120 (actor/pg_loss is nan)', 'preempted at step 40', 'running, step 37'."""
        if self.state == RUNNING:
            return f"{RUNNING}, " + ("no step yet" if self.step is None else f"step {self.step}")
        at = "before its first step" if self.step is None else f"at step {self.step}"
        if self.state == DIVERGED:
            return f"{DIVERGED} {at}" + (f" ({self.reason})" if self.reason else "")
        return f"{self.state} {at}" + (f": {self.reason}" if self.reason else "")

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "seed": self.seed, "state": self.state, "reason": self.reason, "step": self.step}


def unfinished_runs(store: Store, runs: Sequence[RunRecord]) -> dict[str, Unfinished]:
    """{run id: Unfinished} for the runs not succeeded, in their order, with the step each reached (the
    store's ingestion bookkeeping: one query, no metrics scan)."""
    lost = [r for r in runs if run_action(r.status) != DONE]
    steps = store.last_steps([r.id for r in lost]) if lost else {}
    out = {}
    for r in lost:
        state, reason, step = r.status, _first_line(r.error), steps.get(r.id)
        if r.status in LIVE:
            state, reason = RUNNING, None
        elif r.status == "failed" and (at := rundir.diverged_at(r.error)):
            state, (step, reason) = DIVERGED, at
            reason = reason or None
        out[r.id] = Unfinished(r.id, r.name, r.spec.get("seed"), state, reason, step)
    return out


def _first_line(error: str | None) -> str | None:
    line = next((x.strip() for x in (error or "").splitlines() if x.strip()), "")
    return None if not line else line if len(line) <= REASON_CHARS else line[: REASON_CHARS - 3] + "..."


def who(run: Unfinished, seeds: Sequence[Any], method: str) -> str:
    """How a footer names a run of a method: 'GRPO seed 2' where its seed is once among `seeds` (those of
    all the method's runs), else 'GRPO grpo-s2-1a2b3c4d' (its run name)."""
    unique = isinstance(run.seed, int) and list(seeds).count(run.seed) == 1
    return f"{method} seed {run.seed}" if unique else f"{method} {run.name}"


_METRIC_RE = re.compile(r"^(mean|pass|maj)(?:@(k|\d+))?$")
# Under VERL_VAL_SCORER the store keeps the validation scores a run logged itself, with verl's metric names.
_VERL_VAL_METRICS = {"mean@k": "mean", "maj@k/mean": "maj"}


def parse_metric(metric: str) -> tuple[str, int | None]:
    """'mean@32' -> ('mean', 32); 'pass@k' or 'pass' -> ('pass', None): the largest k logged."""
    m = _METRIC_RE.match(metric.strip())
    if not m:
        raise ReportError(
            f"unknown metric {metric!r}; allowed: mean@K, pass@K, maj@K (K a number, or k for the largest logged)"
        )
    k = m.group(2)
    return m.group(1), None if k in (None, "k") else int(k)


@dataclass(frozen=True)
class Score:
    last: float | None  # the value at the run's final evaluated step
    best: float | None  # the maximum over its evaluated steps
    last_step: int
    steps: int  # how many evaluated steps
    first_step: int | None = None
    first: float | None = None  # the value at the first evaluated step (step 0: the starting policy)


@dataclass(frozen=True)
class Origin:
    """Where a run's scores come from: the `evals` rows of one scorer, statistic, k and protocol
    (scorer VERL_VAL_SCORER: the validation the trainer logged); protocol None: read from `metrics`
    (a version 1 database), no protocol known."""

    scorer: str
    stat: str
    k: int
    names: tuple[str, ...]  # the metric names of those `evals` rows
    protocol: tuple[tuple[str, object], ...] | None  # sorted (name, value) pairs of schema.PROTOCOL

    @property
    def evaluated(self) -> bool:
        """Scored by `rpg eval`: its samples are stored, so per-problem scores exist."""
        return self.scorer != VERL_VAL_SCORER and self.protocol is not None

    def text(self) -> str:
        how = "training validation" if self.scorer == VERL_VAL_SCORER else f"rpg eval (scorer {self.scorer})"
        return f"{how}, {self.stat}@{self.k}" + (f", {protocol_text(dict(self.protocol))}" if self.protocol else "")

    @property
    def source(self) -> tuple:
        """What a table cell may hold one of: the scorer, statistic, k and protocol (not the metric
        names, which differ by benchmark for scores read from `metrics`)."""
        return (self.scorer, self.stat, self.k, self.protocol)

    @property
    def rank(self) -> tuple[bool, bool]:
        """A cell's preferred source first: `rpg eval`, then validation the store copied, then `metrics`."""
        return (not self.evaluated, self.protocol is None)


@dataclass
class Scores:
    """Per-run, per-benchmark Last/Best of one metric, and where they came from."""

    values: dict[str, dict[str, Score]]  # run id -> benchmark -> score
    sources: list[str]  # human-readable: "rpg eval (scorer dapo, mean@32): 12 runs"
    metric: str  # the resolved name, e.g. mean@32 (or mean@32/mean@4 when sources differ)
    origins: dict[str, Origin] = field(default_factory=dict)  # run id -> where its values come from
    # `rpg eval` protocols not shown (each with the runs scored under it): the table gives each its own section
    other_protocols: list[tuple[dict, set[str]]] = field(default_factory=list)


def _eval_stat(metric: str, scorer: str) -> str | None:
    """The table statistic (mean, pass, maj) an `evals` row holds; None for the others (std@k, ...)."""
    if scorer == VERL_VAL_SCORER:
        return _VERL_VAL_METRICS.get(metric)
    m = _METRIC_RE.match(metric)
    return m.group(1) if m else None


def _eval_names(stat: str, k: int, scorer: str) -> list[str]:
    if scorer == VERL_VAL_SCORER:
        return [name for name, s in _VERL_VAL_METRICS.items() if s == stat]
    return [f"{stat}@k", f"{stat}@{k}", stat]


def available_metrics(store: Store, run_ids: Sequence[str]) -> list[str]:
    """Every `stat@k` some run has a score for, from evals or logged validation metrics."""
    return sorted(
        {f"{s}@{k}" for s, k, _ in _eval_combos(store, run_ids)} | {f"{s}@{k}" for s, k in _val_combos(store, run_ids)}
    )


def _eval_combos(store: Store, run_ids: Sequence[str]) -> set[tuple[str, int, str]]:
    """(stat, k, scorer) of the table statistics in `evals` for these runs."""
    return {
        (stat, k, scorer)
        for metric, k, scorer in store.eval_combos(run_ids)
        if (stat := _eval_stat(metric, scorer)) is not None
    }


def val_keys(store: Store, run_ids: Sequence[str]) -> list[str]:
    """Every val-core/... key logged by any of the runs."""
    return store.metric_keys(run_ids, f"{VAL_CORE}/")


def _val_combos(store: Store, run_ids: Sequence[str]) -> set[tuple[str, int]]:
    out = set()
    for key in val_keys(store, run_ids):
        if (m := VAL_KEY_RE.match(key)) is not None:
            out.add((m["stat"], int(m["k"])))
    return out


def scores(
    store: Store,
    run_ids: Sequence[str],
    metric: str = "mean@k",
    scorer: str | None = None,
    protocol: dict | None = None,
) -> Scores:
    """Last and Best of `metric` for each run and benchmark, from the best source each run has:
    `rpg eval` scores (of `scorer`; by default the one with the most rows), else its logged
    validation metrics (as the store copied them into `evals`, else straight from `metrics`).
    `rpg eval` scores of one protocol only (the one most runs have, or `protocol`); the others are
    in `other_protocols`, never mixed in. ReportError listing what exists when no run has the metric."""
    stat, k = parse_metric(metric)
    run_ids = list(run_ids)
    values: dict[str, dict[str, Score]] = {}
    origins: dict[str, Origin] = {}
    sources, resolved = [], []
    combos = [c for c in _eval_combos(store, run_ids) if c[0] == stat and (k is None or c[1] == k)]

    own = [c for c in combos if c[2] != VERL_VAL_SCORER and (scorer is None or c[2] == scorer)]
    others: list[tuple[dict, set[str]]] = []
    if scorer is not None and scorer != VERL_VAL_SCORER and not own:
        have = sorted({c[2] for c in combos if c[2] != VERL_VAL_SCORER})
        raise ReportError(
            f"no {metric} scores from scorer {scorer!r}; scorers: {', '.join(have) or 'none (no rpg eval yet)'}"
        )
    if own:
        k_eval = k if k is not None else max(c[1] for c in own)
        chosen = scorer or _most_rows_scorer(
            store, run_ids, stat, k_eval, sorted({c[2] for c in own if c[1] == k_eval})
        )
        names = _eval_names(stat, k_eval, chosen)
        protocols = store.eval_protocols(run_ids, names, k_eval, chosen)
        if protocol is not None:
            protocols = sorted(protocols, key=lambda pr: pr[0] != dict(protocol))
        (shown, _), *others = protocols
        origin = Origin(chosen, stat, k_eval, tuple(names), tuple(sorted(shown.items())))
        for run_id, bench, last_step, n, last, best, first_step, first in store.last_and_best_evals(
            run_ids, names, k_eval, chosen, shown
        ):
            values.setdefault(run_id, {})[bench] = Score(last, best, last_step, n, first_step, first)
            origins[run_id] = origin
        sources.append(f"rpg eval (scorer {chosen}, {stat}@{k_eval}, {protocol_text(shown)}): {runs_text(len(values))}")
        resolved.append(f"{stat}@{k_eval}")
        if protocol is not None:  # a section of its own: the runs of the other protocols are in theirs
            return Scores(values, sources, "/".join(resolved), origins)

    rest = [r for r in run_ids if r not in values]
    copied = [c for c in combos if c[2] == VERL_VAL_SCORER]
    validated: set[str] = set()  # runs whose logged validation the store copied, under any protocol
    if rest and copied:
        k_val = k if k is not None else max(c[1] for c in copied)
        names = _eval_names(stat, k_val, VERL_VAL_SCORER)
        protocols = store.eval_protocols(rest, names, k_val, VERL_VAL_SCORER)
        validated = set().union(*(runs for _, runs in protocols))
        found: set[str] = set()
        if protocols:
            (val_protocol, _), *val_others = protocols
            origin = Origin(VERL_VAL_SCORER, stat, k_val, tuple(names), tuple(sorted(val_protocol.items())))
            for run_id, source, last_step, n, last, best, first_step, first in store.last_and_best_evals(
                rest, names, k_val, VERL_VAL_SCORER, val_protocol
            ):
                values.setdefault(run_id, {})[benchmark_name(source)] = Score(
                    last, best, last_step, n, first_step, first
                )
                origins[run_id] = origin
                found.add(run_id)
            sources += _left_out(val_others, values, "validated")
        if found:
            sources.append(
                f"training validation ({stat}@{k_val}, {protocol_text(val_protocol)}): {runs_text(len(found))}"
            )
            resolved.append(f"{stat}@{k_val}")

    # logged before the store copied validation into evals (a version 1 database): read from metrics
    rest = [r for r in run_ids if r not in values and r not in validated]
    by_key = pick_val_keys(val_keys(store, rest), stat, k) if rest else {}
    if by_key:
        found = set()
        for run_id, key, last_step, n, last, best, first_step, first in store.last_and_best_metrics(rest, list(by_key)):
            values.setdefault(run_id, {})[by_key[key]] = Score(last, best, last_step, n, first_step, first)
            origins[run_id] = Origin(VERL_VAL_SCORER, stat, int(VAL_KEY_RE.match(key)["k"]), (key,), None)
            found.add(run_id)
        label = "/".join(f"{stat}@{kk}" for kk in sorted({int(VAL_KEY_RE.match(key)["k"]) for key in by_key}))
        sources.append(f"training validation ({label}): {runs_text(len(found))}")
        resolved.append(label)
    if not values:
        have = available_metrics(store, run_ids)
        if have:
            raise ReportError(f"no run has {metric} scores; logged: {', '.join(have)} (pass one with --metric)")
        raise ReportError(
            "no evaluation scores yet: no `rpg eval` results and no val-core metrics logged for these runs; "
            "run `rpg eval RUN` (or train with validation on)"
        )
    return Scores(values, sources, "/".join(dict.fromkeys(resolved)), origins, others)


def not_shown(store: Store, run_ids: Sequence[str], stat: str, shown: set[tuple[str, int]]) -> list[str]:
    """A footer line for every other k, scorer and protocol of `stat` these runs were scored with than
    the (scorer, k) pairs `shown`, with the flags that show it: no protocol disappears silently."""
    lines = []
    for _, k, scorer in sorted(c for c in _eval_combos(store, run_ids) if c[0] == stat):
        if (scorer, k) in shown:
            continue
        how = "training validation" if scorer == VERL_VAL_SCORER else f"rpg eval (scorer {scorer})"
        flags = f"--metric {stat}@{k}" + ("" if scorer == VERL_VAL_SCORER else f" --scorer {scorer}")
        for protocol, runs in store.eval_protocols(run_ids, _eval_names(stat, k, scorer), k, scorer):
            lines.append(
                f"not shown: {how}, {stat}@{k}, {protocol_text(protocol)}: {runs_text(len(runs))} (show with {flags})"
            )
    return lines


def protocol_text(protocol: dict) -> str:
    """How the samples of a score were drawn, in a few words."""
    return (
        f"n={protocol['n']} T={protocol['temperature']:g} top_p={protocol['top_p']:g} "
        f"max_tokens={protocol['max_tokens']} seed={protocol['seed']}"
    )


def _left_out(others: list, values: dict, how: str) -> list[str]:
    """A source line for the runs scored only under protocols other than the one shown: never mixed."""
    runs = set().union(*(r for _, r in others)) - set(values) if others else set()
    if not runs:
        return []
    shown = "; ".join(protocol_text(p) for p, _ in others[:2]) + ("; ..." if len(others) > 2 else "")
    return [f"left out: {runs_text(len(runs))} {how} only under another protocol ({shown})"]


def runs_text(n: int) -> str:
    return f"{n} run" if n == 1 else f"{n} runs"


def _most_rows_scorer(store: Store, run_ids: list[str], stat: str, k: int, scorers: list[str]) -> str:
    if len(scorers) == 1:
        return scorers[0]
    counts = store.eval_row_counts(run_ids, k, scorers, _eval_names(stat, k, ""))
    return max(scorers, key=lambda s: (counts.get(s, 0), s == scorers[0]))


def pick_val_keys(keys: Iterable[str], stat: str, k: int | None) -> dict[str, str]:
    """{val-core key: benchmark} for one stat: per data source the 'acc' variable when logged (verl's
    core variable; else the first), and the wanted k (else the largest logged)."""
    found: dict[str, list[tuple[str, int, str]]] = defaultdict(list)
    for key in keys:
        m = VAL_KEY_RE.match(key)
        if m and m["stat"] == stat and (k is None or int(m["k"]) == k):
            found[m["source"]].append((m["var"], int(m["k"]), key))
    out = {}
    for source, options in found.items():
        var = "acc" if any(v == "acc" for v, _, _ in options) else sorted(v for v, _, _ in options)[0]
        out[max((kk, key) for v, kk, key in options if v == var)[1]] = benchmark_name(source)
    return out
