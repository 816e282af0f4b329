"""The watchdog's rules: bounds on what a training step logs, and when a live run has stalled. Standard library
only; orchestration/watch.py applies them (stops and fails runs), `rpg runs` shows stalls.

A bound is a metric key, a max and/or a min, a grace (`after_step`: steps up to it are not checked) and what
crossing it means with the fix. The two defaults read verl 0.9.1's measures of how far vLLM's sampling
distribution is from the trainer's on the step's own response tokens. Both are logged every training step with
verl's default config (checked in its source):

- `training/rollout_probs_diff_mean`: the token mean of |p_trainer - p_vllm|, probabilities of the sampled
  tokens, in [0, 1] (utils/debug/metrics.py `calculate_debug_metrics`, called by trainer/ppo/v1/trainer_base.py
  `_compute_old_log_prob` when `rollout.calculate_log_probs`, true in verl's rollout.yaml).
- `rollout_corr/k3_kl`: the token mean of k3 = r - log r - 1, r = pi_trainer / pi_vllm: an estimate of
  KL(pi_vllm || pi_trainer) in nats per token, >= 0 (trainer/ppo/rollout_corr_helper.py
  `compute_offpolicy_metrics`, through `_compute_advantage` whenever `algorithm.rollout_correction` is set,
  as verl's default config sets it, and its bypass_mode is off, its default; rpg sets neither).

How the defaults were chosen: a healthy GPU run in bf16 must never be stopped, a corrupted sync must be.
- Measured on the CPU in fp32 (tests/e2e): synced, probs_diff <= 0.002 and k3 <= 1.4e-5; vLLM left on its initial
  weights, k3 7.8e-4, 1.1e-3, 2.2e-3 after 1, 2, 3 updates. fp32 is no guide to bf16 on GPUs: vLLM's bf16
  kernels and FSDP's differ far more than that.
- bf16 on GPUs: the mismatch KL starts near 1e-3 and can grow as training goes (sail-sg/Precision-RL issue #10
  on the FP16 paper's Fig. 3: "from a negligible ~1e-3" to ~1, in the long bf16 runs that paper found
  unstable); verl's own rollout-correction guide (docs/algo/rollout_corr.md, its health check) calls
  |rollout_corr/kl| > 0.1 "a significant off-policy gap". TRL #5312 (GPU, sleep mode dropped the synced
  weights): a mean log-prob gap of 0.015 healthy and 0.201 broken by step 3 (as issue 30 quotes it; the
  issue's own log ends at 0.81); since |p - q| <= |log p - log q| for probabilities, a healthy log-prob gap
  also bounds the mean probability difference.
- So: k3 max 0.1 (verl's alarm level, ~100x a bf16 start; garbled weights, verl #7904, give a gap of order 1),
  probs_diff max 0.05 (3x TRL's healthy gap, a quarter of its broken one). A vLLM on stale weights is caught
  once the policy has moved further than bf16 noise; the fp32 CPU e2e sets its own bound
  (`watch: {rollout_corr/k3_kl: {max: 3.0e-4}}`), as may any run whose noise floor is known, and a run that
  must go on through a drifting mismatch turns a bound off (null) or raises it.

A stall: a running run whose metrics have not advanced for `factor` x its median step time (`timing_s/step`, its
first step left out: warm-up), at least `floor_s`. Not before its attempt has logged a step (waiting for GPUs,
admission and loading the model take what they take) nor before a step time is known. Defaults: factor 10 (a
step that validates, or the save after a checkpoint step, takes a few times the median: Qwen3-4B's full
checkpoint is 64 GB to the shared filesystem, README section 5), floor 600 s (a toy run's 1 s steps would otherwise call a 30 s
validation a stall; and NCCL's own timeout in verl, `nccl_timeout`, is 600 s).
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rpg_cli import rundir

PROBS_DIFF = "training/rollout_probs_diff_mean"
K3_KL = "rollout_corr/k3_kl"
STALL = "stall"  # the watch block's stall settings; every other key of the block is a metric's bound
STALL_FACTOR = 10.0
STALL_FLOOR_S = 600.0
RETRY = "`rpg sweep SPEC --retry-failed` resumes it from its checkpoint"
_TAIL_BYTES = 16 << 10  # the last line of a log is in its last bytes
_LINE_CHARS = 200  # a last line shown, cut to this


@dataclass(frozen=True)
class Bound:
    """A bound on one metric: its steps after `after_step` must stay within [min, max] (None: no bound that
    side); `meaning` and `fix` make the failure reason's line."""

    key: str
    max: float | None = None
    min: float | None = None
    after_step: int = 0
    meaning: str = "a metric left the bound the spec's watch block sets"
    fix: str = f"change it, or turn it off (null), in the spec's watch block; {RETRY}"


_SYNC = "a broken weight sync (verl #7904, #7434): check the rollout settings (free_cache_engine, sleep mode) and vLLM"
# the values: the module docstring says how they were chosen (verl's docs/algo/rollout_corr.md health check,
# sail-sg/Precision-RL #10 for bf16's ~1e-3, TRL #5312 for a broken sync's gap, rpg's fp32 e2e)
DEFAULT_BOUNDS: dict[str, Bound] = {
    K3_KL: Bound(
        K3_KL,
        max=0.1,
        meaning="weights in vLLM differ from the trainer's",
        fix=f"{_SYNC}; a bound of its own: watch: {{{K3_KL}: {{max: X}}}} (null: off)",
    ),
    PROBS_DIFF: Bound(
        PROBS_DIFF,
        max=0.05,
        meaning="vLLM samples with other probabilities than the trainer computes",
        fix=f"{_SYNC}; a bound of its own: watch: {{{PROBS_DIFF}: {{max: X}}}} (null: off)",
    ),
}


def key_fault(key: Any) -> str | None:
    """Why `key` cannot name a metric of the watch block, else None."""
    if not isinstance(key, str) or not key.strip() or not key.isprintable():
        return f"{key!r} is not a metric name; allowed: a key metrics.jsonl logs (actor/entropy), or {STALL}"
    return None


def bounds(spec: Mapping[str, Any]) -> list[Bound]:
    """The bounds of a run, from its canonical spec: the defaults, each changed by the fields its key in the
    `watch` block gives or turned off by null, and the spec's own."""
    found = dict(DEFAULT_BOUNDS)
    for key, given in (spec.get("watch") or {}).items():
        if key == STALL:
            continue
        if given is None:
            found.pop(key, None)
            continue
        base = DEFAULT_BOUNDS.get(key, Bound(key))
        fields = {name: given[name] for name in ("max", "min", "after_step") if given.get(name) is not None}
        found[key] = Bound(**{**base.__dict__, **fields})
    return [b for b in found.values() if b.max is not None or b.min is not None]


def number(x: float) -> str:
    """A value as a line shows it: 3 significant digits, a short exponent (2.2e-5, 0.0022, 0.1)."""
    text = f"{x:.3g}"
    if "e" in text:
        mantissa, exponent = text.split("e")
        text = f"{mantissa}e{int(exponent)}"
    return text


def breach_line(bound: Bound, step: int, value: float) -> str:
    """The failure reason of a run whose step `step` logged `value` beyond `bound`: one line, metric, value, step,
    bound, what it means and the fix."""
    above = bound.max is not None and value > bound.max
    limit = f"bound {number(bound.max)}" if above else f"lower bound {number(bound.min)}"  # type: ignore[arg-type]
    return f"{bound.meaning}: {bound.key} {number(value)} at step {step}, {limit}; {bound.fix}"


# ------------------------------------------------------------------------------------------------ stalls


@dataclass(frozen=True)
class StallRule:
    factor: float = STALL_FACTOR
    floor_s: float = STALL_FLOOR_S


@dataclass(frozen=True)
class Stall:
    """A live run whose metrics stopped advancing: at `step`, for `idle_s`, beyond `limit_s`."""

    step: int | None
    idle_s: float
    limit_s: float
    median_s: float
    rule: StallRule


def stall_rule(spec: Mapping[str, Any]) -> StallRule:
    given = (spec.get("watch") or {}).get(STALL) or {}
    return StallRule(**{k: float(v) for k, v in given.items() if k in ("factor", "floor_s") and v is not None})


def step_median(step_times: Sequence[float]) -> float | None:
    """The median step time, the first step (warm-up) left out when others are known; None before any."""
    times = list(step_times[1:]) or list(step_times)
    return statistics.median(times) if times else None


def stalled(
    spec: Mapping[str, Any],
    run_dir: Path,
    step: int | None,
    advanced_at: datetime | None,
    step_times: Sequence[float],
    now: datetime,
) -> Stall | None:
    """The stall of a live run (module docstring), else None. `advanced_at`: when the store saw its attempt's
    metrics last advance (naive UTC; None: not yet in this attempt); `step_times`: its timing_s/step in step
    order. The metrics file's modification time counts too: a store nobody ingests into (a detached sweep)
    does not make a run that is writing look stalled."""
    median = step_median(step_times)
    if advanced_at is None or median is None:
        return None
    rule = stall_rule(spec)
    limit = max(rule.floor_s, rule.factor * median)
    last = max(advanced_at, _mtime(rundir.metrics_path(run_dir)) or advanced_at)
    idle = (now - last).total_seconds()
    return Stall(step, idle, limit, median, rule) if idle > limit else None


def duration(seconds: float) -> str:
    """0.5 s, 45 s, 12 min, 3.5 h."""
    if seconds < 10:
        return f"{seconds:.2g} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def stall_line(stall: Stall, timeout_s: float) -> str:
    """The failure reason of a run stopped for its stall by `rpg sweep --stall-timeout`."""
    at = "before its first step" if stall.step is None else f"at step {stall.step}"
    rule = stall.rule
    return (
        f"stalled {at} for {duration(stall.idle_s)}: no new metrics for {rule.factor:g} x its median step "
        f"({duration(stall.median_s)}), at least {duration(rule.floor_s)} (spec watch.stall), and --stall-timeout "
        f"{timeout_s:g} s more; stopped (`rpg logs RUN` shows where it hung); {RETRY}"
    )


def last_line(run_dir: Path) -> str | None:
    """The last line of the run's output: job.log's when it is newer than metrics.jsonl (a live run's job.log is
    an earlier attempt's), else the last line of its metrics; cut to one short line. None: neither file."""
    files = [p for p in (rundir.job_log_path(run_dir), rundir.metrics_path(run_dir)) if _mtime(p) is not None]
    for path in sorted(files, key=lambda p: _mtime(p) or datetime.min, reverse=True):
        if line := _tail_line(path):
            line = f"{path.name}: {line}"
            return line if len(line) <= _LINE_CHARS else line[: _LINE_CHARS - 1] + "…"
    return None


def _mtime(path: Path) -> datetime | None:
    """When the file was last written (naive UTC), without following a link; None: none there."""
    try:
        stamp = os.lstat(path).st_mtime
    except OSError:
        return None
    return datetime.fromtimestamp(stamp, timezone.utc).replace(tzinfo=None)


def _tail_line(path: Path) -> str:
    """The last non-blank line of a file rpg keeps in a run directory ('' when none or unreadable)."""
    try:
        with os.fdopen(rundir.open_owned(path, os.O_RDONLY | os.O_NONBLOCK, anyone=True), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - _TAIL_BYTES))
            text = f.read(_TAIL_BYTES).decode("utf-8", "replace")
    except OSError:
        return ""
    return rundir.last_lines(text)
