"""`rpg compare A B`: two groups of runs (a method as the report names it, run ids or names, or a spec
filter), scored the same way at one step, compared per benchmark and overall by rpg_cli.stats.compare:
B - A paired by problem (seeds unpaired unless asked) with its 95% interval over new seeds and new
problems (or these problems), P(B > A) with its interval, the smallest difference detectable at 80%
power (and the seeds that detect a named effect), the verdict. Also every spec field that differs
between the groups besides the compared ones: a silent difference in lr or context makes it unfair.
Runs that did not finish (failed, diverged, stopped, preempted, still running) are compared by nobody:
each side is over its finished seeds, and the verdict says how many it lost and how.

At equal compute (`budget`, device-hours): each run's score is the one it had reached by then, read from its
evaluated steps as a step function (its last evaluated step whose cumulative device-hours, report.costs.Clock, is
at or below the budget; no interpolation). A run that finished before the budget keeps its final score (it had it
by then); a run that reached the budget counts whatever its state now; one that is still live or ended otherwise
before it, or has no evaluation by then, never reached it: it is set aside and named, per side."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from rpg_cli import stats
from rpg_cli.benchmarks import benchmark_sort_key
from rpg_cli.metrics import STEP_TIME
from rpg_cli.report.costs import Clock, clocks, hours_text
from rpg_cli.report.evidence import Evidence, aligned, wanted_steps
from rpg_cli.report.names import method_labels
from rpg_cli.report.options import CompareOptions, given
from rpg_cli.report.scores import (
    RUNNING,
    ReportError,
    Unfinished,
    protocol_text,
    scores,
    select_runs,
    unfinished_runs,
    who,
)
from rpg_cli.report.summary import parse_where, spec_matches

if TYPE_CHECKING:
    from rpg_cli.store import RunRecord, Store

# Fields a method name stands for: comparing two methods compares these (the seed never is a difference)
METHOD_FIELDS = ("algorithm", "kl", "kl_correction")
_MEANS = ("benchmark mean",)  # the one "problem" of a benchmark known only by its mean


@dataclass(frozen=True)
class Short:
    """A run that never reached the budget (or has no score by then): not compared, named with why."""

    id: str
    name: str
    seed: Any
    why: str  # 'failed at 0.90 device-hours', 'still running, 0.40 device-hours so far', ...

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "seed": self.seed, "why": self.why}


@dataclass
class Side:
    name: str  # as printed: the method, the filter, or the run names
    runs: list[RunRecord]  # the ones compared: every run of the side that finished (or reached the budget)
    compared: tuple[str, ...]  # spec fields this side is defined by
    not_finished: list[Unfinished] = field(default_factory=list)  # its runs that did not finish: not compared
    short: list[Short] = field(default_factory=list)  # at a budget: its runs that never reached it
    past: list[Unfinished] = field(default_factory=list)  # at a budget: compared, reached it, did not finish since
    used: float | None = None  # at a budget: the mean device-hours behind its runs' scores

    @property
    def ran(self) -> int:
        return len(self.runs) + len(self.not_finished) + len(self.short)

    def who(self, run: Unfinished) -> str:
        """'seed 2', or the run's name where its seed does not tell it from the side's other runs."""
        seeds = [*(r.spec.get("seed") for r in self.runs), *(u.seed for u in (*self.not_finished, *self.short))]
        return who(run, seeds, "").strip()

    def lost_text(self) -> str | None:
        """'GRPO: 1 of 3 seeds diverged at step 120; the interval is over the 2 that finished' (None: none lost)."""
        if not self.not_finished:
            return None
        by_state: dict[str, list[Unfinished]] = defaultdict(list)
        for run in self.not_finished:
            by_state[run.state].append(run)
        lost = f"{len(self.not_finished)} of {self.ran} seeds"
        if len(by_state) == 1:
            ((state, runs),) = by_state.items()
            lost += f" {_how(state, runs)}"
        else:
            lost += " did not finish (" + ", ".join(f"{len(r)} {_how(s, r)}" for s, r in by_state.items()) + ")"
        return f"{self.name}: {lost}; the interval is over the {len(self.runs)} that finished"

    def short_text(self, budget: float) -> str | None:
        """'GRPO: 1 of 3 runs never reached 1.5 device-hours (seed 2 failed at 0.90 device-hours); the interval is
        over the 2 that did' (None: every run reached it or finished before it)."""
        if not self.short:
            return None
        named = "; ".join(f"{self.who(s)} {s.why}" for s in self.short)
        return (
            f"{self.name}: {len(self.short)} of {self.ran} runs never reached {hours_text(budget)} device-hours "
            f"({named}); the interval is over the {len(self.runs)} that did"
        )


@dataclass
class Result:
    a: Side
    b: Side
    source: str  # where the scores come from (scorer, metric, protocol)
    step: str  # "last (300)" or "200"
    comparisons: list[stats.Comparison]
    differences: list[tuple[str, list[str], list[str]]]  # (spec field, A's values, B's values)
    notes: list[str] = field(default_factory=list)
    budget: float | None = None  # device-hours the scores were read at (None: at a step)

    def lines(self) -> list[str]:
        """The compare lines, one per benchmark and overall, then one per side that lost seeds (the CLI
        adds the header and fields)."""
        return [c.text(self.a.name, self.b.name) for c in self.comparisons] + self.lost_lines()

    def lost_lines(self) -> list[str]:
        lost = [text for side in (self.a, self.b) if (text := side.lost_text())]
        if self.budget is not None:
            lost += [text for side in (self.a, self.b) if (text := side.short_text(self.budget))]
        return lost

    def header(self) -> list[str]:
        lines = [f"A: {_side_text(self.a)}", f"B: {_side_text(self.b)}", f"scores: {self.source}; step: {self.step}"]
        if self.budget is not None:
            lines.append(
                f"budget used: A {hours_text(self.a.used)}, B {hours_text(self.b.used)} device-hours "
                f"(mean over runs of the device-hours at the step each score is from; budget {hours_text(self.budget)})"
            )
        return lines

    def difference_text(self) -> list[str]:
        return [f"{path} (A: {', '.join(a)}; B: {', '.join(b)})" for path, a, b in self.differences]

    def to_json(self) -> str:
        doc = {
            "a": _side_dict(self.a),
            "b": _side_dict(self.b),
            "source": self.source,
            "step": self.step,
            "comparisons": [c.as_dict() for c in self.comparisons],
            "spec_differences": [{"field": p, "a": a, "b": b} for p, a, b in self.differences],
            "not_finished": self.lost_lines(),
            "notes": self.notes,
        }
        if self.budget is not None:
            doc["budget"] = {
                "device_hours": self.budget,
                "read": BUDGET_READ,
                "used": {"a": self.a.used, "b": self.b.used},
            }
        return json.dumps(doc, indent=2) + "\n"


def _side_dict(side: Side) -> dict[str, Any]:
    """A side as data: the runs compared (finished), how many ran, and the ones that did not finish."""
    return {
        "name": side.name,
        "runs": [r.name for r in side.runs],
        "finished": len(side.runs),
        "ran": side.ran,
        "not_finished": [run.as_dict() for run in side.not_finished],
        "never_reached_budget": [run.as_dict() for run in side.short],
    }


def _how(state: str, runs: list[Unfinished]) -> str:
    """'diverged at step 120', 'preempted at steps 40, 60', 'still running (step 37)'."""
    steps = sorted({r.step for r in runs if r.step is not None})
    at = ", ".join(map(str, steps))
    if state == RUNNING:
        return "still running" + (f" (step{'s' if len(steps) > 1 else ''} {at})" if steps else "")
    return f"{state} " + (f"at step{'s' if len(steps) > 1 else ''} {at}" if steps else "before a first step")


def _side_text(side: Side) -> str:
    seeds = sorted({str(r.spec.get("seed")) for r in side.runs})
    runs = f"{len(side.runs)} run" + ("s" if len(side.runs) != 1 else "")
    text = f"{side.name}, {runs} (seed{'s' if len(seeds) != 1 else ''} {', '.join(seeds)})"
    if side.not_finished:
        lost = "; ".join(f"{side.who(u)}, {u.text()}" for u in side.not_finished)
        text += f"; did not finish, not compared: {lost}"
    if side.short:
        text += "; never reached the budget, not compared: " + "; ".join(f"{side.who(s)}, {s.why}" for s in side.short)
    return text


def resolve_side(store: Store, ref: str, scope: list[RunRecord], letter: str) -> Side:
    """A side from what the user typed: a method name as the report prints it (case-insensitive), a
    spec filter FIELD=VALUE[&FIELD=VALUE...] (VALUE may be a comma list), or run ids/names/prefixes
    separated by commas. ReportError listing the methods in scope when nothing matches."""
    labels = method_labels({r.id: r.spec for r in scope})
    by_label = [r for r in scope if labels[r.id].lower() == ref.strip().lower()]
    if by_label:
        return Side(labels[by_label[0].id], by_label, METHOD_FIELDS)
    if "=" in ref:
        clauses = [c for c in ref.split("&") if c.strip()]
        filters = parse_where(clauses)
        matched = [r for r in scope if spec_matches(r.spec, filters)]
        if not matched:
            raise ReportError(
                f"{letter} ({ref}): no run in scope matches this filter; check the values with `rpg runs --where`"
            )
        return Side(ref, matched, tuple(path for path, _, _ in filters))
    in_scope = {r.id for r in scope}
    found: list[RunRecord] = []
    for part in (p.strip() for p in ref.split(",") if p.strip()):
        runs = [r for r in store.resolve(part) if r.id in in_scope]
        if not runs:
            found = []
            break
        found += [r for r in runs if r not in found]
    if found:
        return Side(ref if len(found) > 1 else found[0].name, found, ())
    methods = sorted(set(labels.values()))
    raise ReportError(
        f"{letter}: no method, run or filter {ref!r}; methods: {', '.join(methods) or 'none'} (or run ids, or FIELD=VALUE)"
    )


def _flat(spec: Any) -> dict[str, str]:
    """A spec's fields by dotted path, each value as text (JSON but for strings)."""
    from rpg_cli.spec import flatten

    return {p: v if isinstance(v, str) else json.dumps(v, sort_keys=True) for p, v in flatten(spec).items()}


def spec_differences(a: Side, b: Side) -> list[tuple[str, list[str], list[str]]]:
    """Every spec field (dotted paths into nested ones) whose values differ between the sides, other
    than the seed and the fields the sides are defined by."""
    compared = {"seed", *a.compared, *b.compared}
    flat_a, flat_b = [_flat(r.spec) for r in a.runs], [_flat(r.spec) for r in b.runs]
    paths = sorted({p for f in flat_a + flat_b for p in f})
    out = []
    for path in paths:
        if any(path == c or path.startswith(c + ".") for c in compared):
            continue
        va = sorted({f.get(path, "null") for f in flat_a})
        vb = sorted({f.get(path, "null") for f in flat_b})
        if va != vb:
            out.append((path, va, vb))
    return out


def _seeds(runs: list[RunRecord], offset: int) -> tuple[int, ...]:
    """Seed labels: the specs' seeds when distinct integers (then --pair-seeds can pair A and B by
    seed), else positions (offset apart, so that they never pair)."""
    seeds = [r.spec.get("seed") for r in runs]
    if all(isinstance(s, int) and not isinstance(s, bool) for s in seeds) and len(set(seeds)) == len(seeds):
        return tuple(seeds)
    return tuple(range(offset, offset + len(runs)))


def compare_groups(
    store: Store, a_ref: str, b_ref: str, options: CompareOptions | None = None, **fields: Any
) -> Result:
    """Compare B with A (module docstring). ReportError, one line, for an unknown or empty side, runs
    without scores, scores under different protocols or scorers, no common benchmark or problem."""
    options = given(CompareOptions, options, fields)
    filters = parse_where(options.where)
    scope = [r for r in select_runs(store, options.sweep) if spec_matches(r.spec, filters)]
    if not scope:
        raise ReportError(f"no run matches --where {' '.join(options.where)}")
    a, b = resolve_side(store, a_ref, scope, "A"), resolve_side(store, b_ref, scope, "B")
    timed: dict[str, Clock] = {}
    if options.budget is None:
        _set_aside_unfinished(store, a, b)
    else:
        timed = _set_aside_short(store, a, b, options.budget)
    runs = a.runs + [r for r in b.runs if r not in a.runs]
    result = scores(store, [r.id for r in runs], options.metric, options.scorer)
    _check_scored(result, a, b, options.metric)
    origins = {result.origins[r.id] for r in runs}
    if len(origins) > 1:
        oa, ob = (
            result.origins[a.runs[0].id],
            next(result.origins[r.id] for r in runs if result.origins[r.id] != result.origins[a.runs[0].id]),
        )
        raise ReportError(
            f"scores drawn differently never compare: {oa.text()} vs {ob.text()}; evaluate every run the same way (rpg eval ... --k/--temperature/--top-p/--max-tokens)"
        )
    (origin,) = origins
    if options.budget is not None and origin.protocol is None:
        raise ReportError(
            "--budget reads each run's score per evaluated step, and these runs' scores are only in metrics (a "
            "database from before validation was copied into evals); compare at a step (--step)"
        )
    evidence = Evidence(store, result)
    per_run = {r.id: result.values[r.id] for r in runs}
    common = set.intersection(*(set(v) for v in per_run.values()))
    if options.benchmarks:
        missing = [bench for bench in options.benchmarks if bench not in common]
        if missing:
            raise ReportError(
                f"benchmark {', '.join(missing)} is not scored for every run of A and B; common: {', '.join(sorted(common)) or 'none'}"
            )
        common = set(options.benchmarks)
    if not common:
        have_a = sorted({x for r in a.runs for x in per_run[r.id]})
        have_b = sorted({x for r in b.runs for x in per_run[r.id]})
        raise ReportError(
            f"no benchmark scored for every run of A and B (A: {', '.join(have_a)}; B: {', '.join(have_b)})"
        )
    benches = sorted(common, key=benchmark_sort_key)
    at_budget = _budget_picks(a, b, benches, evidence, per_run, timed, options.budget) if timed else {}

    blocks_a, blocks_b, ids, notes = {}, {}, {}, []
    steps_used: set[int] = set()
    for bench in benches:
        picks, values = [], []
        for r in a.runs + b.runs:  # A's rows, then B's (a run in both sides is in both)
            score = per_run[r.id][bench]
            if at_budget:
                step = at_budget[(r.id, bench)]
                picks.append((r.id, step))
                values.append(score.last if step == score.last_step else evidence.steps(r.id, bench)[step])
                continue
            if options.step is None:
                picks.append((r.id, score.last_step))
                values.append(score.last)
                continue
            logged = evidence.steps(r.id, bench)
            if options.step not in logged:
                raise ReportError(
                    f"run {r.name} has no {bench} score at step {options.step}; its steps: {', '.join(map(str, sorted(logged))) or 'none'}"
                )
            picks.append((r.id, options.step))
            values.append(logged[options.step])
        steps_used |= {s for _, s in picks}
        evidence.read(bench, wanted_steps(picks))  # only the compared steps' samples, in one query
        matrix = aligned([evidence.problems(run_id, s, bench) for run_id, s in picks])
        if matrix is None:
            if origin.evaluated:
                raise ReportError(
                    f"{bench}: A and B share no scored problem at this step; evaluate them on the same benchmark file"
                )
            notes.append(
                f"{bench}: benchmark means only (no rpg eval samples): intervals over seeds, problem sampling not included"
            )
            matrix = (np.array([[v] for v in values], dtype=float), _MEANS)
        scores_, ids[bench] = matrix
        blocks_a[bench], blocks_b[bench] = scores_[: len(a.runs)], scores_[len(a.runs) :]
    if any(r in a.runs for r in b.runs):
        notes.append("A and B share runs")
    for side in (a, b):
        if options.budget is not None and (past := [u for u in side.past if u.id in {r.id for r in side.runs}]):
            named = "; ".join(f"{side.who(u)} {u.text()}" for u in past)
            notes.append(f"{side.name}: compared at the score it had by the budget, though it did not finish: {named}")
    runs_a = stats.Runs(blocks_a, seeds=_seeds(a.runs, 0), problems=ids)
    runs_b = stats.Runs(blocks_b, seeds=_seeds(b.runs, 1_000_000), problems=ids)
    targets = [*benches, stats.OVERALL] if len(benches) > 1 else benches
    how = {"pair_seeds": options.pair_seeds, "fixed_problems": options.fixed_problems, "effect": options.effect}
    comparisons = [stats.compare(runs_a, runs_b, t, n_resamples=options.n_resamples, **how) for t in targets]
    if options.pair_seeds:
        notes.append(
            "seeds paired by label (--pair-seeds): right only when runs with the same seed share their randomness"
        )
    if cautioned := [c.benchmark for c in comparisons if c.difference.caution]:
        notes.append(f"caution, {', '.join(cautioned)}: {stats.CAUTION}")
    step_text = f"last ({', '.join(map(str, sorted(steps_used)))})" if options.step is None else str(options.step)
    if options.budget is not None:
        step_text = f"by {hours_text(options.budget)} device-hours, {BUDGET_READ} ({_steps_text(steps_used)})"
    source = origin.text()
    return Result(a, b, source, step_text, comparisons, spec_differences(a, b), notes, options.budget)


# How a score at a budget is read from a run's evaluations (said in the output and in --help).
BUDGET_READ = "each run's last evaluated step at or below it (a step function, no interpolation)"


def _steps_text(steps: set[int]) -> str:
    """'step 40', 'steps 20-60'."""
    low, high = min(steps), max(steps)
    return f"step {low}" if low == high else f"steps {low}-{high}"


def _set_aside_short(store: Store, a: Side, b: Side, budget: float) -> dict[str, Clock]:
    """At a budget: each side keeps its runs that reached it (their step times add up to it, whatever their state
    now) or finished before it, and names the others (Short); returns every run's Clock (one query). ReportError,
    one line, for a side none of whose runs is left."""
    if not budget > 0:
        raise ReportError(f"--budget {budget:g}: give device-hours above 0")
    runs = a.runs + [r for r in b.runs if r not in a.runs]
    timed = clocks(store, runs)
    lost = unfinished_runs(store, [r for r in runs if timed[r.id].total < budget])
    untimed = {r.id for r in runs if not timed[r.id].steps}  # no step time: where it stood at the budget is unknown
    for side, letter in ((a, "A"), (b, "B")):
        side.short = [
            Short(r.id, r.name, r.spec.get("seed"), _short_why(lost[r.id], timed[r.id]))
            if r.id in lost
            else Short(r.id, r.name, r.spec.get("seed"), f"logged no {STEP_TIME}: its device-hours are unknown")
            for r in side.runs
            if r.id in lost or r.id in untimed
        ]
        side.runs = [r for r in side.runs if r.id not in lost and r.id not in untimed]
        past = unfinished_runs(store, side.runs)  # they reached it: their score by then counts whatever came after
        side.past = [past[r.id] for r in side.runs if r.id in past]
        _check_left(side, letter, budget)
    return timed


def _short_why(run: Unfinished, clock: Clock) -> str:
    """'failed at step 40 (0.90 device-hours)', 'still running (0.40 device-hours so far)'."""
    hours = f"{hours_text(clock.total)} device-hours"
    if run.state == RUNNING:
        return f"still running ({hours} so far)"
    return f"{run.state} " + (f"at step {run.step} ({hours})" if run.step is not None else "before a first step")


def _check_left(side: Side, letter: str, budget: float) -> None:
    if side.runs:
        return
    named = "; ".join(f"{side.who(s)} {s.why}" for s in side.short[:3])
    more = f"; and {len(side.short) - 3} more" if len(side.short) > 3 else ""
    raise ReportError(
        f"{letter} ({side.name}): no run of it reached {hours_text(budget)} device-hours with a score by then "
        f"({named}{more}); lower --budget, or compare at a step (--step)"
    )


def _budget_picks(
    a: Side,
    b: Side,
    benches: list[str],
    evidence: Evidence,
    per_run: dict[str, Any],
    timed: dict[str, Clock],
    budget: float,
) -> dict[tuple[str, str], int]:
    """{(run id, benchmark): the step its score by the budget is from}: the run's last evaluated step at or below
    the budget, or for a run that finished before it, its final one. A run with no evaluation by then on some
    benchmark is set aside (Short); ReportError when a side has none left. Sets each side's `used`."""
    picks: dict[tuple[str, str], int] = {}
    for side, letter in ((a, "A"), (b, "B")):
        kept, used = [], []
        for r in side.runs:
            clock, mine = timed[r.id], {}
            for bench in benches:
                if clock.total < budget:  # finished before the budget: its final score, had by then
                    mine[bench] = per_run[r.id][bench].last_step
                    continue
                by_then = [step for step in evidence.steps(r.id, bench) if clock.at(step) <= budget]
                if by_then:
                    mine[bench] = max(by_then)
            if len(mine) < len(benches):
                first = min((step for x in benches for step in evidence.steps(r.id, x)), default=None)
                why = "no evaluation by then" + (
                    f" (first at step {first}, {hours_text(clock.at(first))} device-hours)" if first is not None else ""
                )
                side.short.append(Short(r.id, r.name, r.spec.get("seed"), why))
                continue
            kept.append(r)
            used.append(max(clock.at(step) for step in mine.values()))
            picks.update({(r.id, bench): step for bench, step in mine.items()})
        side.runs = kept
        _check_left(side, letter, budget)
        side.used = sum(used) / len(used)
    return picks


def _set_aside_unfinished(store: Store, a: Side, b: Side) -> None:
    """Each side keeps its finished runs and lists the others (no score of theirs is compared, whichever
    source); ReportError, one line, for a side none of whose runs finished."""
    lost = unfinished_runs(store, a.runs + [r for r in b.runs if r not in a.runs])
    for side, letter in ((a, "A"), (b, "B")):
        side.not_finished = [lost[r.id] for r in side.runs if r.id in lost]
        side.runs = [r for r in side.runs if r.id not in lost]
        if not side.runs:
            states = "; ".join(f"{side.who(u)} {u.text()}" for u in side.not_finished[:3])
            more = f"; and {len(side.not_finished) - 3} more" if len(side.not_finished) > 3 else ""
            raise ReportError(
                f"{letter} ({side.name}): no run of it finished ({states}{more}); "
                "only finished runs are compared: `rpg runs` shows where each one is"
            )


def _check_scored(result: Any, a: Side, b: Side, metric: str) -> None:
    for side, letter in ((a, "A"), (b, "B")):
        missing = [r for r in side.runs if r.id not in result.values]
        if not missing:
            continue
        names = ", ".join(r.name for r in missing[:3]) + (" ..." if len(missing) > 3 else "")
        other = [p for p, ids in result.other_protocols if any(r.id in ids for r in missing)]
        if other:
            shown = next(iter(result.origins.values()))
            raise ReportError(
                f"{letter}: {names} scored under {protocol_text(other[0])}, other runs under {shown.text()}: "
                "scores drawn differently never compare; evaluate them the same way"
            )
        raise ReportError(
            f"{letter}: no {metric} scores for {names}; run `rpg eval` on them (or train with validation on)"
        )
