"""Metric names: the contract between the backends that write metrics.jsonl, the store and report that
read it, and the trackers that carry it as it is. Standard library only.

verl 0.9.1 names most of these (checked in its source: trainer/ppo/metric_utils.py, workers/utils/
losses.py, trainer/ppo/v1/trainer_base.py); the local backend writes the same names for the same
quantities, the verl plugin writes rpg's own (`actor/rpg_kl`), and `ref/*` come from the reference
schedule both backends run. Each metric has its meaning, when it is logged, and the range it cannot
leave (a plot's band is cut to it). A backend may log more (verl does); these are the ones promised.

`EMITTED_BY_BOTH` is what every training step's line carries on either backend, whatever the spec: a
test checks a metrics.jsonl against it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

EVERY_STEP = "every training step"


@dataclass(frozen=True)
class Metric:
    key: str
    meaning: str
    low: float | None = None  # the range the value cannot leave (None: unbounded that side)
    high: float | None = None
    when: str = EVERY_STEP  # when it is logged: every training step, or the condition
    label: str | None = None  # a plot's axis label (default: the key)

    @property
    def bounds(self) -> tuple[float | None, float | None]:
        return (self.low, self.high)


# the update (actor/*): token aggregates by the spec's loss_agg_mode, means over the step's mini-batches
PG_LOSS = "actor/pg_loss"
PPO_KL = "actor/ppo_kl"
CLIPFRAC = "actor/pg_clipfrac"
CLIPFRAC_DUAL = "actor/pg_clipfrac_lower"
ENTROPY = "actor/entropy"
GRAD_NORM = "actor/grad_norm"
LR = "actor/lr"
KL_LOSS = "actor/kl_loss"
RPG_KL = "actor/rpg_kl"
# the batch (critic/*, lengths)
REWARD = "critic/score/mean"
REWARDS = "critic/rewards/mean"
ADVANTAGES = "critic/advantages/mean"
RESPONSE_LENGTH = "response_length/mean"
RESPONSE_CLIPPED = "response_length/clip_ratio"
PROMPT_LENGTH = "prompt_length/mean"
# time and progress: verl's marked_timer names (timing_s/<phase>, trainer/ppo/v1/trainer_base.py and
# trainer_sync.py) and compute_throughout_metrics' (perf/*, trainer/ppo/metric_utils.py)
STEP_TIME = "timing_s/step"
GEN_TIME = "timing_s/gen"
OLD_LOG_PROB_TIME = "timing_s/old_log_prob"
REF_TIME = "timing_s/ref"
UPDATE_TIME = "timing_s/update_actor"
WEIGHT_SYNC_TIME = "timing_s/update_weights"
TESTING_TIME = "timing_s/testing"
THROUGHPUT = "perf/throughput"
TOKENS = "perf/total_num_tokens"
TIME_PER_STEP = "perf/time_per_step"
MFU = "perf/mfu/actor"
# verl's update worker logs perf/max_memory_allocated_gb (workers/engine_workers.py) and its trainer prefixes
# the update's metrics with actor/ (rename_dict in trainer/ppo/v1/trainer_base.py): this is the name it writes
PEAK_MEMORY = "actor/perf/max_memory_allocated_gb"
GLOBAL_STEP = "training/global_step"
EPOCH = "training/epoch"
# the reference schedule (ReferenceTracker)
REF_RESETS = "ref/resets"
REF_AGE = "ref/steps_since_reset"
REF_KL = "ref/kl"
REF_KL_EMA = "ref/kl_ema"

# a step's phases, in the order a step runs them: label -> key (rpg report --cost's shares)
PHASES: dict[str, str] = {
    "generation": GEN_TIME,
    "old log-prob": OLD_LOG_PROB_TIME,
    "reference": REF_TIME,
    "update": UPDATE_TIME,
    "weight sync": WEIGHT_SYNC_TIME,
    "validation": TESTING_TIME,
}
_ON_GPU = "a CUDA device (on CPU none: absent, not 0)"

_REFERENCE = "the reference is tracked: iterative or reset (every/kl_target), or a frozen one a loss reads"

METRICS: dict[str, Metric] = {
    m.key: m
    for m in (
        Metric(PG_LOSS, "the policy loss (rpg_cli.algorithms.policy_loss), the value minimised"),
        Metric(
            PPO_KL,
            "token mean of log pi_old - log pi_theta: k1 of KL(pi_old || pi_theta), can be < 0",
            label="KL(π_old ‖ π) (ppo_kl)",
        ),
        Metric(CLIPFRAC, "fraction of response tokens whose ratio was clipped (high or low)", 0.0, 1.0),
        Metric(CLIPFRAC_DUAL, "fraction of response tokens the dual clip (c) bounded", 0.0, 1.0),
        Metric(ENTROPY, "token mean of the policy's entropy on the step's responses", 0.0, label="entropy"),
        Metric(GRAD_NORM, "gradient norm before clipping (non-finite: the run diverged)", 0.0),
        Metric(LR, "the optimizer's learning rate", 0.0),
        Metric(
            KL_LOSS,
            "the separate KL loss toward pi_ref (spec kl_loss), before its coefficient; k1 can be < 0",
            when="the spec has a kl_loss (verl also logs it, at coefficient 0, when its ref worker runs)",
            label="KL loss",
        ),
        Metric(
            RPG_KL,
            "token mean of the KL term inside rpg's policy loss, before beta",
            when="the loss has a KL term (kl is not none)",
            label="KL term of the loss",
        ),
        Metric(
            REWARD,
            "mean sequence score of the step's rollouts: the scorer's +1/-1, overlong shaping subtracts",
            high=1.0,
            label="reward (mean score)",
        ),
        Metric(REWARDS, "mean sequence reward: the score less the KL-in-reward penalty (REINFORCE++)"),
        Metric(ADVANTAGES, "mean advantage over the response tokens"),
        Metric(RESPONSE_LENGTH, "mean response length in tokens", 0.0, label="response length (tokens)"),
        Metric(RESPONSE_CLIPPED, "fraction of responses cut at the response length", 0.0, 1.0),
        Metric(PROMPT_LENGTH, "mean prompt length in tokens", 0.0),
        Metric(STEP_TIME, "wall time of the step without its validation, seconds", 0.0, label="seconds per step"),
        Metric(GEN_TIME, "seconds sampling the step's responses (and scoring them on the local backend)", 0.0),
        Metric(OLD_LOG_PROB_TIME, "seconds computing log pi_old of the step's responses", 0.0),
        Metric(
            REF_TIME,
            "seconds computing log pi_ref of the step's responses",
            0.0,
            when="a separate reference model runs (frozen, or reset now and then)",
        ),
        Metric(UPDATE_TIME, "seconds of the policy update (every epoch and mini-batch)", 0.0),
        Metric(
            WEIGHT_SYNC_TIME,
            "seconds handing the updated weights to the rollout engine (vLLM)",
            0.0,
            when="verl only (the local backend samples with the model it trains)",
        ),
        Metric(
            TESTING_TIME,
            "seconds of validation, outside timing_s/step",
            0.0,
            when="validation steps (val.every, the last step; step 0 on the local backend logs none)",
        ),
        Metric(
            THROUGHPUT,
            "tokens (prompt and response) per second per device: perf/total_num_tokens / (timing_s/step x devices)",
            0.0,
            label="tokens/s per device",
        ),
        Metric(TOKENS, "tokens (prompt and response) of the step's batch", 0.0),
        Metric(TIME_PER_STEP, "timing_s/step again, as verl's throughput metrics carry it", 0.0),
        Metric(
            MFU,
            "model FLOPs utilisation of the update: its FLOPs / (its seconds x devices x the device's dense bf16 peak)",
            0.0,
            1.0,
            when="local backend: a CUDA device whose peak rpg_cli.cost knows; verl: always, by its own table "
            "(utils/flops_counter.py: a CPU at 448 GFLOP/s, 0 for a GPU it does not know)",
            label="MFU (update)",
        ),
        Metric(
            PEAK_MEMORY,
            "peak GPU memory allocated, GiB (local: during the step; verl: the update worker's since it started)",
            0.0,
            when=_ON_GPU,
            label="peak memory (GiB)",
        ),
        Metric(GLOBAL_STEP, "the training step", 1.0),
        Metric(EPOCH, "passes over the training data begun", 0.0),
        Metric(REF_RESETS, "times pi_ref was reset to the policy so far", 0.0, when=_REFERENCE),
        Metric(
            REF_AGE,
            "steps since pi_ref was reset (how far pi_old is ahead of it)",
            0.0,
            when=_REFERENCE,
            label="steps since the reference was reset",
        ),
        Metric(
            REF_KL,
            "token mean of k3(pi_ref / pi_old) on the step's batch; 0 for the iterative reference",
            0.0,
            when=_REFERENCE,
            label="KL(π_old ‖ π_ref), token mean of k3",
        ),
        Metric(REF_KL_EMA, "moving average of ref/kl (the kl_target trigger)", 0.0, when=_REFERENCE),
    )
}

# rpg_cli.algorithms.policy_loss's metrics -> their names here; its others go under actor/ as they are
_LOSS_NAMES = {"pg_loss": PG_LOSS, "ppo_kl": PPO_KL, "clipfrac": CLIPFRAC, "clipfrac_dual": CLIPFRAC_DUAL, "kl": RPG_KL}


def loss_metrics(values: dict[str, float]) -> dict[str, float]:
    """policy_loss's metrics under their logged names (both backends: the same names for the same values)."""
    return {_LOSS_NAMES.get(key, f"actor/{key}"): value for key, value in values.items()}


EMITTED_BY_BOTH: frozenset[str] = frozenset(k for k, m in METRICS.items() if m.when == EVERY_STEP)
# a run whose loss or gradient norm is logged non-finite has stopped learning: it fails, never "succeeds"
DIVERGED_KEYS = (PG_LOSS, GRAD_NORM)

# Validation, at validation steps: `val-core/<data source>/acc/mean@<n>` is the accuracy of n samples per
# problem (verl's core variable `acc` at its largest n), in [0, 1]; verl also logs maj@N/mean and best@N/mean,
# and val-aux/... (other variables, smaller N). Its best@N is a bootstrap estimate, biased low: never pass@k.
VAL_CORE = "val-core"
VAL_AUX = "val-aux"
VAL_KEY_RE = re.compile(r"^val-core/(?P<source>.+)/(?P<var>[^/]+)/(?P<stat>mean|maj)@(?P<k>\d+)(?:/mean)?$")
# VAL_KEY_RE: the mean@N and maj@N of any core variable (what the report reads). VAL_ACC_KEY_RE: every
# statistic verl logs of the accuracy `acc`, core and aux (mean@N, std@N; best@N, worst@N, maj@N with /mean
# or /std), as groups source, name (`best@16/mean`) and n (N): what the store keeps as the run's own evals
# (rpg_cli.store.ingest).
VAL_ACC_KEY_RE = re.compile(
    r"^val-(?:core|aux)/(?P<source>.+)/acc/(?P<name>(?:mean|std|best|worst|maj)@(?P<n>\d+)(?:/(?:mean|std))?)$"
)


def val_key(source: str, n: int, var: str = "acc", section: str = VAL_CORE) -> str:
    """`<section>/<data source>/<var>/mean@<n>`: the mean over n samples per problem, as verl names it."""
    return f"{section}/{source}/{var}/mean@{n}"


def bounds(key: str) -> tuple[float | None, float | None]:
    """The range a logged value cannot leave: the contract's, [0, 1] for a validation accuracy (every
    statistic verl logs of `acc`, core and aux: means, best/worst/maj and the std of 0/1 values)."""
    stat = VAL_KEY_RE.match(key)
    if (stat is not None and stat["var"] == "acc") or VAL_ACC_KEY_RE.match(key):
        return (0.0, 1.0)
    metric = METRICS.get(key)
    return metric.bounds if metric is not None else (None, None)


# What the store accepts from a job's metrics.jsonl (store/ingest.py): a validation accuracy in [0, 1], up to
# float rounding (a mean of 0/1 values in float64). A training metric's range (`bounds`) cuts a plot's band
# but is not enforced on the file: GPU arithmetic (bf16 logits) lands a little outside it, and what the
# trainer logged is the evidence; only its type is checked.
ACCURACY_SLACK = 1e-9


def accepted_range(key: str) -> tuple[float, float]:
    """The range the store accepts a value logged under `key` in: [0, 1] (and the slack) for a validation
    accuracy, else every float (-inf, inf)."""
    if key.startswith("val-") and bounds(key) == (0.0, 1.0):
        return (-ACCURACY_SLACK, 1.0 + ACCURACY_SLACK)
    return (-math.inf, math.inf)


def out_of_range(key: str, value: float) -> str | None:
    """Why `value`, logged under `key`, cannot be what the key means (outside `accepted_range(key)`), else
    None. NaN is no value (the store keeps it as NULL: a diverged step, an empty validation set)."""
    low, high = accepted_range(key)
    if value != value or low <= value <= high:
        return None
    return f"{key} is {value:g}, outside its range [0, 1]"


def axis_label(key: str) -> str:
    """A plot's axis label for `key` (the key itself when the contract has none)."""
    metric = METRICS.get(key)
    return metric.label or key if metric is not None else key
