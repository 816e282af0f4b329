"""Typed experiment specs: one run (`ExperimentSpec`) and a grid of runs (`SweepSpec`).

A sweep YAML holds `name`, `base` (spec fields shared by every cell), `grid` (field -> list of values),
`include`/`exclude` (GitHub-Actions-matrix semantics) and `seeds`. Expansion merges base and cell,
collapses fields that do not apply to a cell when they come from `base` or a `grid` axis (the KL variant
of `grpo`, clip sub-fields of an unclipped run), validates every cell and drops cells that turn out
identical (same run id). A value written in a cell's own `include` entry (or in a single-run spec) is
explicit: where it has no effect it is an error, never silently dropped. So is a key given twice in a
YAML mapping.

Every invalid input raises `SpecError`, whose one-line message names the file, the field path and what
is allowed. Only pydantic and PyYAML are imported here (omegaconf only for files with `${...}`), so
`rpg sweep --dry-run` stays fast.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import itertools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from rpg_cli.benchmarks import SCORERS

if TYPE_CHECKING:
    from pydantic.fields import FieldInfo

Algorithm = Literal["grpo", "dapo", "reinforce_pp", "reinforce_pp_baseline", "rpg", "rpg_reinforce"]
KLVariant = Literal["fkl", "rkl", "ufkl", "urkl", "none"]
Context = Literal["2k", "4k", "8k"]
Optimizer = Literal["adamw", "schedule_free"]
LossAggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]

RPG_ALGORITHMS = ("rpg", "rpg_reinforce")
DAPO_TRICKS = ("dynamic_sampling", "overlong")  # DAPO's, allowed on every algorithm
KL_VARIANTS = ("fkl", "rkl", "ufkl", "urkl")

# context "Nk" -> (max_prompt_length, max_response_length) = (N x 1024, N x 1024): the paper's "maximum
# training and rollout length 4,096 tokens for a 2K context length and 8,192 for a 4K", the released
# scripts' 2048 + 2048. The only place these numbers live.
CONTEXT_LENGTHS: dict[str, tuple[int, int]] = {"2k": (2048, 2048), "4k": (4096, 4096), "8k": (8192, 8192)}
MAX_CONTEXT_TOKENS = 1_048_576  # an explicit budget's bound: far above any model, below a typo
# KL-loss estimators of the PPO-family runs (MATH.md section 4); verl's names: kl, mse, low_var_kl.
KLLossEstimator = Literal["k1", "k2", "k3"]
# algorithms whose loss is PPO's without a KL term of its own, so that a KL loss can be added
KL_LOSS_ALGORITHMS = ("reinforce_pp", "reinforce_pp_baseline")


# Bounds of sizes whose data is not known where the spec is read (inputs.py checks them against the data):
# far above any real run, low enough that a typo (1e9 prompts per step) never reaches a machine.
MAX_STEPS = 1_000_000
MAX_BATCH = 1_048_576
MAX_ROLLOUTS = 4096
MAX_SWEEP_NAME = 100
# aliases may share a fragment; a file whose aliases expand past this many values is refused (billion laughs)
MAX_YAML_VALUES = 100_000


class SpecError(Exception):
    """Bad spec input, reported as one line: `<file>: [<cell>] <field path>: <reason>`.

    Deliberately not a ValueError: raised inside a pydantic validator it propagates unchanged, so
    cross-field checks keep their own field path.
    """

    def __init__(self, reason: str, path: str = "", source: str = "", where: str = ""):
        self.reason, self.path, self.source, self.where = reason, path, source, where
        super().__init__(self.message)

    @property
    def message(self) -> str:
        place = " ".join(p for p in (self.where, self.path) if p)
        return ": ".join(p for p in (self.source, place, self.reason) if p)

    def within(self, source: str = "", where: str = "", prefix: str = "") -> SpecError:
        """The same problem seen from further out (a file, a grid cell, an enclosing field)."""
        path = _join_path(prefix, self.path)
        return SpecError(self.reason, path, source or self.source, where or self.where)


# ---------------------------------------------------------------------------------------------
# The models


class _Frozen(BaseModel):
    # strict: a YAML typo like `rollout_n: "16"` or `clip: yes` is an error, not a silent coercion;
    # no float field takes .inf or .nan (a NaN loss trains nothing and still "succeeds")
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)


class Clip(_Frozen):
    eps_low: float = Field(gt=0, lt=1)  # the ratio's lower bound 1 - eps_low must stay positive
    eps_high: float = Field(gt=0, lt=1)
    c: float = Field(10.0, gt=1)  # dual-clip bound for negative advantages (paper gives none; reference code: 10)
    clipped_weight_in_sg: bool = False  # Remark F.2: the clipped weight inside stop-gradient


DEFAULT_KL_EMA = 0.1  # rpg's choice (the paper gives none): the average forgets over about 10 steps


class Every(_Frozen):
    """A reference that is reset to the current policy (pi_ref <- pi_theta) now and then: every K steps,
    when an exponential moving average of the KL to it exceeds kl_target, or whichever comes first.
    `ReferenceTracker` defines exactly when (the same in both backends)."""

    every: int | None = Field(None, ge=1)  # reset after K steps with the same reference
    kl_target: float | None = Field(None, gt=0)  # reset once the KL average exceeds this (kappa)
    ema: float | None = Field(None, gt=0, le=1)  # weight of the newest step's KL in the average (alpha)

    @model_validator(mode="before")
    @classmethod
    def _ema_default(cls, data: Any) -> Any:
        # a KL target always carries its average's weight, so the canonical spec (and run id) spells it out
        if isinstance(data, dict) and data.get("kl_target") is not None and data.get("ema") is None:
            data = {**data, "ema": DEFAULT_KL_EMA}
        return data

    @model_validator(mode="after")
    def _one_trigger(self) -> Every:
        if self.every is None and self.kl_target is None:
            raise ValueError(f"got {self._given()}; allowed: {REFERENCE_FORMS}")
        if self.ema is not None and self.kl_target is None:
            raise ValueError(f"got {self._given()}: ema is the KL average's weight; allowed: ema with kl_target")
        return self

    @model_serializer(mode="wrap")
    def _drop_unset(self, handler: Any) -> dict[str, Any]:
        # {every: K} stays {"every": K} in spec.json, so run ids of existing every-K runs do not change
        return {k: v for k, v in handler(self).items() if v is not None}

    def _given(self) -> dict[str, Any]:
        return {
            k: v for k, v in (("every", self.every), ("kl_target", self.kl_target), ("ema", self.ema)) if v is not None
        }


class Data(_Frozen):
    train_files: list[str] = Field(min_length=1)
    val_files: list[str] = Field(default_factory=list)


class Val(_Frozen):
    """Validation: val.n samples per problem (evaluation files hold one row per problem), every `every` steps."""

    n: int = Field(32, ge=1, le=MAX_ROLLOUTS)  # k of accuracy@k: the paper's Mean@32
    every: int = Field(10, ge=1)  # test_freq, in steps (the scripts)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)  # the scripts


class Rollout(_Frozen):
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    engine: Literal["vllm", "hf"] = "vllm"


class DynamicSampling(_Frozen):
    """DAPO's dynamic sampling, on any algorithm: drop prompt groups whose accuracy (`acc`, before any
    length penalty) is the same for every response, keep groups of one, sample more until the batch is full."""

    gen_batches: int = Field(3, ge=1)  # prompts sampled per round, in train_batch_size units (scripts: 3 x 512)
    max_num_gen_batches: int = Field(20, ge=0)  # rounds per step at most; 0 = until the batch is full


class Overlong(_Frozen):
    """DAPO's overlong reward shaping, on any algorithm: min(-(L - (Lmax - buffer)) / buffer, 0) * factor."""

    buffer: int = Field(512, ge=1)  # tokens before the response budget where the penalty starts
    penalty_factor: float = Field(1.0, ge=0)


class KLLoss(_Frozen):
    """A KL loss toward the run's reference, added to the policy loss (MATH.md section 4): REINFORCE++ as the
    released scripts ran it (k1, 1e-4, toward the iterative reference pi_old)."""

    estimator: KLLossEstimator
    coef: float = Field(gt=0)


class ContextTokens(_Frozen):
    """Explicit prompt and response token budgets, beside the paper's Nk: for tests, tiny models, ablations."""

    prompt: int = Field(ge=1, le=MAX_CONTEXT_TOKENS)
    response: int = Field(ge=1, le=MAX_CONTEXT_TOKENS)


def context_lengths(context: str | dict[str, Any] | ContextTokens) -> tuple[int, int]:
    """(prompt, response) tokens of a context: "Nk", {prompt, response} (as in spec.json) or ContextTokens."""
    if isinstance(context, ContextTokens):
        return context.prompt, context.response
    if isinstance(context, dict):
        return int(context["prompt"]), int(context["response"])
    return CONTEXT_LENGTHS[context]


def context_label(context: str | dict[str, Any] | ContextTokens) -> str:
    """A context as run names and tables write it: "2k", or "64+32" for explicit budgets."""
    if isinstance(context, str):
        return context
    prompt, response = context_lengths(context)
    return f"{prompt}+{response}"


class Verl(_Frozen):
    """What a verl run needs beyond the spec's fields: extra Hydra overrides of verl's ppo_trainer config and
    environment variables for its processes. `overrides` may change what a run computes, so they are part
    of the run id, and may replace an override rpg generates; `site` overrides and `env` say how a run
    executes on a cluster (rollout.gpu_memory_utilization, NCCL variables, a test harness's modules), are
    not part of the run id, and may not replace what rpg generates from the spec."""

    overrides: list[str] = Field(default_factory=list)
    site: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("overrides", "site")
    @classmethod
    def _key_value(cls, items: list[str]) -> list[str]:
        for item in items:
            if not re.fullmatch(r"(\+\+|\+|~)?[A-Za-z_][\w.\-@/]*=.*", item, re.S):
                raise ValueError(f"got {item!r}; allowed: Hydra overrides key=value, +key=value or ++key=value")
        keys = [override_key(item) for item in items]
        if len(set(keys)) < len(keys):
            twice = sorted({k for k in keys if keys.count(k) > 1})
            raise ValueError(f"{', '.join(twice)} given twice; allowed: each key once")
        return items

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for name in env:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"{name!r} is not an environment variable name; allowed: letters, digits, _")
            if name in RESERVED_ENV:
                raise ValueError(f"{name} is rpg's own (the run's metrics file); allowed: any other name")
            if _CREDENTIAL.search(name):
                raise ValueError(
                    f"{name} looks like a credential, and env travels in the job's metadata (Ray's jobs API shows "
                    "it); allowed: settings only (give credentials to the nodes' environment)"
                )
        return env


# set by rpg for every verl run; VERL_USE_EXTERNAL_MODULES may be given (loaded before rpg's plugin)
RESERVED_ENV = ("VERL_FILE_LOGGER_PATH",)
_CREDENTIAL = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL", re.I)


def override_key(override: str) -> str:
    """The config key a Hydra override sets: `+a.b=1` -> `a.b`."""
    return override.split("=", 1)[0].lstrip("+~")


class Resources(_Frozen):
    nodes: int = Field(1, ge=1)
    gpus_per_node: int = Field(ge=0)
    cpus: float = Field(gt=0)


TRACKER_NAMES = ("wandb", "tensorboard", "mlflow")


class WandbTracker(_Frozen):
    entity: str | None = None  # default: WANDB_ENTITY where the run runs, else the account's default
    mode: Literal["online", "offline"] | None = None  # default: WANDB_MODE where the run runs, else online


class TensorBoardTracker(_Frozen):
    dir: str | None = None  # log root, a run at <dir>/<sweep>/<run name>; default: <runs dir>/tensorboard


class MlflowTracker(_Frozen):
    # default: MLFLOW_TRACKING_URI where the run runs, else sqlite:///<runs dir>/mlflow.db
    tracking_uri: str | None = None

    @field_validator("tracking_uri")
    @classmethod
    def _no_credentials(cls, uri: str | None) -> str | None:
        from urllib.parse import urlsplit

        if uri and "://" in uri and (urlsplit(uri).password or urlsplit(uri).username):
            raise ValueError(
                "credentials in the URI would be written to spec.json and the store; allowed: a URI "
                "without user:password@ (set MLFLOW_TRACKING_USERNAME/PASSWORD or MLFLOW_TRACKING_TOKEN "
                "where the run runs)"
            )
        return uri


def _trackers_form(value: Any) -> Any:
    # `trackers: [wandb, mlflow]` (or one name) is every named tracker with its defaults; `wandb: true` likewise
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        if unknown := [v for v in value if v not in TRACKER_NAMES]:
            raise ValueError(f"got {unknown[0]!r}; allowed: {', '.join(TRACKER_NAMES)}")
        value = dict.fromkeys(value, {})
    if isinstance(value, dict):
        value = {k: ({} if v is True else None if v is False else v) for k, v in value.items()}
    return value


class Trackers(_Frozen):
    """Where a run's metrics are reported (W&B, TensorBoard, MLflow): never what it computes, so not in its id."""

    project: str = Field("rpg", min_length=1)  # W&B project, MLflow experiment (verl: trainer.project_name)
    group: str | None = None  # default: the run's cell (its spec less the seed), so seeds band together
    tags: list[str] = Field(default_factory=list)  # besides the sweep and the values of its varying axes
    wandb: WandbTracker | None = None
    tensorboard: TensorBoardTracker | None = None
    mlflow: MlflowTracker | None = None


TrackersSetting = Annotated[Trackers | None, BeforeValidator(_trackers_form)]


def _clip_off(value: Any) -> Any:
    # YAML `clip: off` parses as False; "off"/"none" strings are accepted too
    if value is False or (isinstance(value, str) and value.lower() in ("off", "none", "null")):
        return None
    return value


REFERENCE_FORMS = "iterative, frozen, {every: K}, {kl_target: kappa, ema: alpha}, or both every and kl_target"


def _reference_form(value: Any) -> Any:
    # a mapping goes on to `Every`, whose errors name the sub-field (reference.kl_target: ...)
    if (isinstance(value, str) and value not in ("iterative", "frozen")) or not isinstance(value, (str, dict, Every)):
        raise ValueError(f"got {value!r}; allowed: {REFERENCE_FORMS}")
    return value


def _switch(value: Any) -> Any:
    # `dynamic_sampling: true` turns a trick on with its defaults; false/off/none turns it off
    if value is True:
        return {}
    return _clip_off(value)


ClipSetting = Annotated[Clip | None, BeforeValidator(_clip_off)]
DynamicSamplingSetting = Annotated[DynamicSampling | None, BeforeValidator(_switch)]
OverlongSetting = Annotated[Overlong | None, BeforeValidator(_switch)]
# Every first: for a mapping, pydantic's first error is then Every's own, with the sub-field's path
Reference = Annotated[Every | Literal["iterative", "frozen"], BeforeValidator(_reference_form)]


class ReferenceTracker:
    """When pi_ref is reset to the current policy, and the `ref/*` metrics: one schedule for both backends.

    The paper's iterative reference (section 4; MATH.md section 1, "With a separate reference pi_ref"):
    pi_ref <- pi_theta every K steps, or when a moving average of the token-level KL to pi_ref exceeds a
    target kappa. Precisely, for training step t = 1, 2, ... (one rollout batch and its updates):

    1. `begin_step(t)`, before step t's reference log-probs; True means: copy the current policy (the one
       that sampled step t, so pi_ref = pi_old of step t) into the reference now. It is True when
         - the reference is `iterative` and t > 1 (pi_ref = pi_old every step, i.e. `every: 1`),
         - `every: K` and t - born >= K (the reference has served K steps: resets before steps 1+K, 1+2K, ...
           unless a KL reset moved born),
         - `kl_target: kappa` and ema > kappa (the average after step t-1's KL),
       and a reset sets born = t, resets += 1, ema = 0 (the KL to a fresh reference is 0). Step 1's
       reference is the initial model, which is pi_old at step 1: born = 1 without a reset. `frozen`
       never resets.
    2. `observe(kl)`: kl is step t's KL to its reference, `rpg_cli.algorithms.kl.reference_kl`: the
       token-mean over the batch's response tokens of k3(pi_ref/pi_old), from the log-probs the step
       trains on (an estimate of KL(pi_old || pi_ref); 0 for `iterative`, which has no separate
       reference). ema <- (1 - alpha) * ema + alpha * kl, alpha = `ema` of the spec (DEFAULT_KL_EMA
       where the spec sets no KL target: the average is then only reported).
    3. `metrics(t)`: `ref/resets` (resets so far, step t's included), `ref/steps_since_reset` (t - born:
       how many steps' updates pi_old is ahead of pi_ref), `ref/kl`, `ref/kl_ema` (after step t's kl).

    `state_dict()` is what a checkpoint keeps so that a resumed run continues the same schedule.
    """

    def __init__(self, reference: str | Every):
        self.reference = reference
        every = reference if isinstance(reference, Every) else None
        self.every = 1 if reference == "iterative" else (every.every if every else None)
        self.kl_target = every.kl_target if every else None
        self.alpha = every.ema if every is not None and every.ema is not None else DEFAULT_KL_EMA
        self.resets, self.born, self.ema, self.kl = 0, 1, 0.0, 0.0

    def begin_step(self, step: int) -> bool:
        due = self.every is not None and step - self.born >= self.every
        drifted = self.kl_target is not None and self.ema > self.kl_target
        if not (due or drifted):
            return False
        self.resets, self.born, self.ema = self.resets + 1, step, 0.0
        return True

    def observe(self, kl: float) -> None:
        self.kl = float(kl)
        self.ema = (1 - self.alpha) * self.ema + self.alpha * self.kl

    def metrics(self, step: int) -> dict[str, float]:
        return {
            "ref/resets": float(self.resets),
            "ref/steps_since_reset": float(step - self.born),
            "ref/kl": self.kl,
            "ref/kl_ema": self.ema,
        }

    def state_dict(self) -> dict[str, float]:
        return {"resets": self.resets, "born": self.born, "ema": self.ema, "kl": self.kl}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.resets, self.born = int(state["resets"]), int(state["born"])
        self.ema, self.kl = float(state["ema"]), float(state["kl"])


# Where metrics are reported and how a run executes, not what it computes: spec.json records these fields
# (dotted: a field of a block), the run id ignores them.
NOT_IN_RUN_ID = ("trackers", "verl.site", "verl.env")
# Added after run ids were published: left out of the canonical spec while empty, so older ids stand.
OMITTED_WHEN_EMPTY = ("chat_template_kwargs", "scorers", "verl")


def without_empty(spec: dict[str, Any]) -> dict[str, Any]:
    """`spec` less the OMITTED_WHEN_EMPTY fields that hold nothing (a block: nothing in any of its fields)."""

    def empty(value: Any) -> bool:
        # None or an empty container: a false or zero value is a setting ({enable_thinking: false})
        if isinstance(value, dict):
            return all(empty(v) for v in value.values())
        return value is None or value == "" or value == []

    return {k: v for k, v in spec.items() if k not in OMITTED_WHEN_EMPTY or not empty(v)}


def run_identity(spec: dict[str, Any]) -> dict[str, Any]:
    """A canonical spec less NOT_IN_RUN_ID: what a run's id hashes (and, less the seed, its cell's)."""
    identity = copy.deepcopy(dict(spec))
    for path in NOT_IN_RUN_ID:
        *parents, last = path.split(".")
        node: Any = identity
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return without_empty(identity)


class ExperimentSpec(_Frozen):
    """One run, fully typed. Its canonical JSON (defaults included) defines its id."""

    algorithm: Algorithm
    kl: KLVariant = "none"
    kl_correction: bool = False  # grpo only: weight GRPO's k3 term by w (loss `grpo_corrected`)
    kl_clamp: bool = True  # grpo only: its k3 as verl's low_var_kl (clamped), as the paper ran it; false: exact
    kl_loss: KLLoss | None = None  # reinforce_pp(_baseline) only: a KL loss toward the reference
    beta: float = Field(ge=0)
    clip: ClipSetting
    optimizer: Optimizer
    context: Context | ContextTokens
    reference: Reference = "iterative"
    model: str = Field(min_length=1)
    model_max_length: int | None = Field(None, ge=1)
    # the tokenizer's chat-template arguments ({enable_thinking: false}: Qwen3 without thinking), applied alike
    # by verl (data.apply_chat_template_kwargs), the local backend and `rpg eval`
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    data: Data
    # benchmark (or data_source) -> scorer, over rpg_cli.benchmarks.SCORER_BY_BENCHMARK (the paper's choices)
    scorers: dict[Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")], Literal[SCORERS]] = Field(
        default_factory=dict
    )
    train_batch_size: int = Field(ge=1, le=MAX_BATCH)  # prompts per step (at most the training rows: inputs.py)
    rollout_n: int = Field(ge=1, le=MAX_ROLLOUTS)  # responses per prompt
    ppo_mini_batch_size: int = Field(ge=1)  # prompts per mini-batch (verl semantics)
    ppo_epochs: int = Field(1, ge=1)
    lr: float = Field(gt=0)
    lr_warmup_steps: int = Field(0, ge=0)
    weight_decay: float = Field(0.01, ge=0)  # verl's actor default
    grad_clip: float = Field(1.0, gt=0)
    steps: int = Field(ge=1, le=MAX_STEPS)
    seed: int = Field(ge=0, le=2**32 - 1)  # numpy's seeds are 32-bit
    val: Val = Field(default_factory=Val)
    rollout: Rollout = Field(default_factory=Rollout)
    loss_agg_mode: LossAggMode = "token-mean"
    entropy_coeff: float = 0.0
    dynamic_sampling: DynamicSamplingSetting = None  # on by default for dapo
    overlong: OverlongSetting = None  # on by default for dapo
    save_every: int = Field(ge=1)
    backend: Literal["verl", "local"]
    resources: Resources
    trackers: TrackersSetting = None
    verl: Verl = Field(default_factory=Verl)  # backend verl only: extra overrides and env (see Verl)

    @model_validator(mode="before")
    @classmethod
    def _dapo_defaults(cls, data: Any) -> Any:
        # dapo has its tricks unless a spec turns them off; the canonical spec (and run id) spells them out
        if isinstance(data, dict) and data.get("algorithm") == "dapo":
            data = {**{trick: {} for trick in DAPO_TRICKS}, **data}
        return data

    @model_validator(mode="after")
    def _combinations(self) -> ExperimentSpec:
        alg = self.algorithm
        if alg in RPG_ALGORITHMS and self.kl == "none":
            raise SpecError(f"{alg} needs a KL variant; allowed: {', '.join(KL_VARIANTS)}", "kl")
        if alg not in RPG_ALGORITHMS and self.kl != "none":
            raise SpecError(
                f"{alg} has no KL variant (got {self.kl!r}); allowed: none "
                f"({', '.join(KL_VARIANTS)} exist for {' and '.join(RPG_ALGORITHMS)} only)",
                "kl",
            )
        if self.kl_correction and alg != "grpo":
            raise SpecError(f"only grpo has a KL correction (got {alg}); allowed: false", "kl_correction")
        if not self.kl_clamp and alg != "grpo":
            raise SpecError(f"only grpo clamps its KL term (got {alg}); allowed: true", "kl_clamp")
        if self.kl_loss is not None and alg not in KL_LOSS_ALGORITHMS:
            why = "has its KL term in the loss already (beta)" if alg != "dapo" else "has no KL term"
            raise SpecError(f"{alg} {why}; allowed: null (a KL loss is for {', '.join(KL_LOSS_ALGORITHMS)})", "kl_loss")
        if self.clip is not None and self.clip.clipped_weight_in_sg and alg != "rpg_reinforce":
            raise SpecError(
                f"the clipped weight inside stop-gradient (Remark F.2) is rpg_reinforce's (got {alg}); allowed: false",
                "clip.clipped_weight_in_sg",
            )
        if self.clip is None and alg not in RPG_ALGORITHMS:
            raise SpecError(
                f"{alg} needs a clip; allowed: {{eps_low, eps_high, c}} (off only for rpg, rpg_reinforce)", "clip"
            )
        if alg == "dapo" and self.beta != 0:
            raise SpecError(f"dapo has no KL term (got {self.beta!r}); allowed: 0", "beta")
        if alg == "dapo" and self.reference != "iterative":
            raise SpecError(
                f"dapo has no KL term, so no reference model (got {self.reference!r}); "
                "allowed: iterative (the default, which loads nothing)",
                "reference",
            )
        if self.backend != "verl" and self.verl != Verl():
            raise SpecError(
                f"verl settings have no effect on the {self.backend} backend; allowed: {{}} (or backend verl)", "verl"
            )
        if self.train_batch_size % self.ppo_mini_batch_size:
            raise SpecError(
                f"{self.ppo_mini_batch_size} does not divide train_batch_size {self.train_batch_size}; "
                "allowed: a divisor of train_batch_size",
                "ppo_mini_batch_size",
            )
        if self.model_max_length is not None:
            prompt, response = context_lengths(self.context)
            if prompt + response > self.model_max_length:
                fits = [c for c, (p, r) in CONTEXT_LENGTHS.items() if p + r <= self.model_max_length]
                allowed = ", ".join(fits) if fits else "none (raise model_max_length or use a longer-context model)"
                raise SpecError(
                    f"{context_label(self.context)} needs {prompt}+{response} tokens but {self.model} takes "
                    f"{self.model_max_length} (model_max_length); allowed: {allowed}",
                    "context",
                )
        return self

    # -- derived, pure python --------------------------------------------------------------

    @property
    def max_prompt_length(self) -> int:
        return context_lengths(self.context)[0]

    @property
    def max_response_length(self) -> int:
        return context_lengths(self.context)[1]

    @property
    def loss_name(self) -> str:
        """The `rpg_cli.algorithms.losses.policy_loss` name of this run."""
        if self.algorithm == "rpg":
            return f"rpg_{self.kl}"
        if self.algorithm == "rpg_reinforce":
            return f"rpg_reinforce_{self.kl}"
        if self.algorithm == "grpo":
            return "grpo_corrected" if self.kl_correction else "grpo"
        return "ppo"

    @property
    def advantage_estimator(self) -> str:
        return {
            "grpo": "grpo",
            "dapo": "grpo",
            "rpg": "rpg",
            "rpg_reinforce": "rpg",
            "reinforce_pp": "reinforce_pp",
            "reinforce_pp_baseline": "reinforce_pp_baseline",
        }[self.algorithm]

    def canonical(self) -> dict[str, Any]:
        """The JSON-ready spec, defaults included: what spec.json holds (the run id hashes canonical_json)."""
        return without_empty(self.model_dump(mode="json"))

    def canonical_json(self) -> str:
        """What the run id hashes: the canonical spec less NOT_IN_RUN_ID."""
        identity = run_identity(self.canonical())
        # sorted keys, no whitespace; json renders floats with repr, so 1e-4 and 0.0001 agree
        return json.dumps(identity, sort_keys=True, separators=(",", ":"), ensure_ascii=True)

    @property
    def run_id(self) -> str:
        return hashlib.sha256(self.canonical_json().encode("utf-8")).hexdigest()[:8]

    @property
    def run_name(self) -> str:
        """Readable and unique: rpg_reinforce-urkl-clip0.2_0.28-adamw-4k-s0-1a2b3c4d."""
        return f"{_label(self.canonical())}-{self.run_id}"


def _label(spec: dict[str, Any]) -> str:
    """The readable part of a run name, from a (possibly not yet valid) spec dict."""
    alg = spec.get("algorithm", "?")
    parts = [f"{alg}_corrected" if alg == "grpo" and spec.get("kl_correction") is True else str(alg)]
    if spec.get("kl") not in (None, "none"):
        parts.append(str(spec["kl"]))
    clip = spec.get("clip")
    if isinstance(clip, dict):
        parts.append(f"clip{_num(clip.get('eps_low'))}_{_num(clip.get('eps_high'))}")
    elif clip is None and "clip" in spec and alg in RPG_ALGORITHMS:
        parts.append("noclip")
    parts += [str(spec["optimizer"])] if "optimizer" in spec else []
    parts += [_context_part(spec["context"])] if "context" in spec else []
    if "seed" in spec:
        parts.append(f"s{spec['seed']}")
    return "-".join(parts)


def _context_part(context: Any) -> str:
    """A run name's context part: "2k", or "64+32" (a value that is not yet valid as it was written)."""
    try:
        return context_label(context)
    except (KeyError, TypeError, ValueError):
        return str(context)


def _num(x: Any) -> str:
    return f"{x:g}" if isinstance(x, (int, float)) and not isinstance(x, bool) else str(x)


# ---------------------------------------------------------------------------------------------
# What validation costs (the dry run states it before a GPU is paid for)

# files above this size are not read at plan time (their problems stay uncounted)
MAX_COUNTED_FILE_BYTES = 64 * 2**20


@dataclass(frozen=True)
class ProblemCount:
    rows: int
    problems: int  # distinct (prompt, ground truth) pairs: what `rpg eval` and the local backend sample


@dataclass(frozen=True)
class ValidationCost:
    samples_per_problem: int  # val.n
    validations: int  # per run: before training, every val.every steps, and at the last step
    problems: int | None  # distinct problems over data.val_files; None when a file cannot be counted here

    @property
    def generations(self) -> int | None:
        """Responses generated at each validation."""
        return None if self.problems is None else self.problems * self.samples_per_problem

    def as_dict(self) -> dict[str, int | None]:
        return {
            "problems": self.problems,
            "samples_per_problem": self.samples_per_problem,
            "generations_per_validation": self.generations,
            "validations_per_run": self.validations,
        }


def validation_cost(spec: ExperimentSpec | dict[str, Any]) -> ValidationCost | None:
    """What one run's validation generates (None: the run does not validate); `spec` may be canonical JSON.
    Problems are counted where the files are local and small; both backends sample val.n responses per
    distinct problem (verl refuses a file that repeats problems, the local backend and `rpg eval` group
    the copies)."""
    if isinstance(spec, dict):
        spec = ExperimentSpec.model_validate(spec)
    if not spec.data.val_files:
        return None
    counts = [count_problems(f) for f in spec.data.val_files]
    problems = None if any(c is None for c in counts) else sum(c.problems for c in counts)
    validations = 1 + spec.steps // spec.val.every + (1 if spec.steps % spec.val.every else 0)
    return ValidationCost(spec.val.n, validations, problems)


def count_problems(path: str | Path) -> ProblemCount | None:
    """Rows and distinct problems of a local verl-format parquet; None for a file that is not there, not
    readable as one, or too big to read at plan time (pyarrow is imported only when there is a file)."""
    p = Path(path)
    try:
        stat = p.stat()
    except (OSError, ValueError):
        return None
    if "://" in str(path) or not p.is_file() or stat.st_size > MAX_COUNTED_FILE_BYTES:
        return None
    return _count_problems(str(p.resolve()), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=64)
def _count_problems(path: str, mtime_ns: int, size: int) -> ProblemCount | None:
    try:
        import pyarrow.parquet as pq

        table = pq.ParquetFile(path).read(columns=["prompt", "reward_model"])  # read_table would import pandas
        keys = {
            json.dumps([row["prompt"], (row["reward_model"] or {}).get("ground_truth")], sort_keys=True)
            for row in table.to_pylist()
        }
    except Exception:  # not a verl parquet: the run's own checks say so; here it is just not counted
        return None
    return ProblemCount(table.num_rows, len(keys))


# ---------------------------------------------------------------------------------------------
# Sweeps


class SweepSpec(_Frozen):
    """A grid of runs. `include`/`exclude` follow GitHub Actions' matrix rules (see `expand_sweep`)."""

    # a directory name under runs/ (file systems take 255 bytes; run names are added below it)
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=MAX_SWEEP_NAME)
    base: dict[str, Any] = Field(default_factory=dict)
    grid: dict[str, list[Any]] = Field(default_factory=dict)
    include: list[dict[str, Any]] = Field(default_factory=list)
    exclude: list[dict[str, Any]] = Field(default_factory=list)
    seeds: list[int] | None = None
    _source: str = PrivateAttr("")  # the file it came from, for error messages

    @property
    def source(self) -> str:
        return self._source or f"sweep {self.name}"

    def expand(self, backend: str | None = None) -> list[ExperimentSpec]:
        return expand_sweep(self, backend=backend)


def load_spec(path: str | Path) -> ExperimentSpec:
    """One run from a YAML file (interpolations resolved)."""
    data = _read_yaml(Path(path))
    try:
        return _validate(ExperimentSpec, data)
    except SpecError as e:
        raise e.within(source=str(path)) from None


def load_sweep(path: str | Path) -> SweepSpec:
    """A sweep from a YAML file; every fragment (base, grid values, include/exclude) is checked here."""
    data = _read_yaml(Path(path))
    try:
        sweep = _validate(SweepSpec, data)
        _check_fragments(sweep)
    except SpecError as e:
        raise e.within(source=str(path)) from None
    sweep._source = str(path)
    return sweep


def expand_sweep(sweep: SweepSpec, backend: str | None = None) -> list[ExperimentSpec]:
    """Cells of the sweep as validated specs, in grid order, identical cells (same run id) once.

    Matrix rules (GitHub Actions): the grid's cartesian product; `exclude` drops every combination
    that matches all of an entry's key/values; each `include` entry is added to every combination
    whose grid values it does not contradict (it may add fields and overwrite what earlier includes
    added, never a grid value), and becomes a combination of its own if it fits none. `seeds` then
    replicates every cell. A mapping value matches when each key it gives matches (so
    `clip: {eps_low: 0.1}` matches any clip with eps_low 0.1). `backend` overrides every cell's backend.
    """
    _check_fragments(sweep)
    cells = _cells(sweep)
    if not cells:
        raise SpecError(
            "removes every grid combination and nothing is included; allowed: a sweep with runs",
            "exclude",
            sweep.source,
        )
    specs: dict[str, ExperimentSpec] = {}
    for index, (cell, explicit) in enumerate(cells, start=1):
        data, skipped = _merge(sweep.base, cell)
        where = f"cell {index} ({_label(data)})"
        for key in skipped:
            if key in explicit:
                raise SpecError(
                    f"sets {key.partition('.')[2]} of a {key.partition('.')[0]} that is off in this "
                    f"cell (set in {explicit[key][1]}); allowed: drop it, or turn "
                    f"{key.partition('.')[0]} on",
                    key,
                    sweep.source,
                    where,
                )
        if backend is not None:
            data["backend"] = backend
        data = _collapse(data, keep=lambda path, explicit=explicit: _written(explicit, path) is not None)
        try:
            spec = _validate(ExperimentSpec, data)
        except SpecError as e:
            origin = _written(explicit, e.path)
            if origin is not None:
                e = SpecError(f"{e.reason} (set in {origin})", e.path)
            raise e.within(source=sweep.source, where=where) from None
        specs.setdefault(spec.run_id, spec)
    return list(specs.values())


# (value, where it was written) of each field a cell's own include entry sets
Explicit = dict[str, tuple[Any, str]]


def _cells(sweep: SweepSpec) -> list[tuple[dict[str, Any], Explicit]]:
    """Each cell's fields, and which of them its include entries wrote (explicit, never collapsed)."""
    axes = list(sweep.grid)
    combos = [dict(zip(axes, values)) for values in itertools.product(*sweep.grid.values())] if axes else []
    combos = [c for c in combos if not any(_matches(c, entry) for entry in sweep.exclude)]
    cells: list[tuple[dict[str, Any], Explicit]] = [(dict(c), {}) for c in combos]
    for i, entry in enumerate(sweep.include):
        fitted = False
        for original, (cell, explicit) in zip(combos, cells):
            if all(_same(original[k], v) for k, v in entry.items() if k in original):
                added = {k: v for k, v in entry.items() if k not in original}
                cell.update(added)
                explicit.update({k: (v, f"include[{i}].{k}") for k, v in added.items()})
                fitted = True
        if not fitted:  # a combination of its own; later includes do not extend it
            cells.append((dict(entry), {k: (v, f"include[{i}].{k}") for k, v in entry.items()}))
    if not axes and not sweep.include:
        cells = [({}, {})]  # no grid at all: the base is the one cell
    if sweep.seeds is not None:
        cells = [({**cell, "seed": seed}, explicit) for cell, explicit in cells for seed in sweep.seeds]
    return cells


def _written(explicit: Explicit, path: str) -> str | None:
    """Where a cell's include entry wrote the (dotted) field `path`, or None when it did not."""
    for key, (value, where) in explicit.items():
        if path == key or key.startswith(path + "."):
            return where
        if path.startswith(key + "."):
            rest = path[len(key) + 1 :].split(".")
            for part in rest:
                if not isinstance(value, dict) or part not in value:
                    break
                value = value[part]
            else:
                return ".".join([where, *rest])
    return None


def _matches(combo: dict[str, Any], entry: dict[str, Any]) -> bool:
    return all(k in combo and _same(combo[k], v) for k, v in entry.items())


def _same(have: Any, want: Any) -> bool:
    if isinstance(want, dict):
        return isinstance(have, dict) and all(k in have and _same(have[k], v) for k, v in want.items())
    if isinstance(have, bool) or isinstance(want, bool):
        return have is want
    return have == want


def _merge(base: dict[str, Any], cell: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Base overlaid with a cell: mappings merge key by key, other values replace. Dotted keys
    (`clip.c`) set one nested field and are applied last; on a field that is off they do not apply
    (the dotted keys skipped so are returned)."""
    out = copy.deepcopy(base)
    skipped = []
    for key, value in sorted(cell.items(), key=lambda kv: "." in kv[0]):
        *parents, leaf = key.split(".")
        target = out
        for p in parents:
            if p in target and _clip_off(target[p]) is None:
                skipped.append(key)  # e.g. `clip.c` on an unclipped run (clip: off): the axis collapses
                break
            target = target.setdefault(p, {})
            if not isinstance(target, dict):
                break
        else:
            target[leaf] = _overlay(target.get(leaf), value)
    return out, skipped


def _overlay(old: Any, new: Any) -> Any:
    if isinstance(old, dict) and isinstance(new, dict):
        return {**old, **{k: _overlay(old.get(k), v) for k, v in new.items()}}
    return copy.deepcopy(new)


def _collapse(data: dict[str, Any], keep: Any = lambda path: False) -> dict[str, Any]:
    """Fields that do not apply to a cell's algorithm take their neutral value, so e.g. a kl axis
    crossed with `grpo` yields one grpo run, not four (identical cells are merged by run id). Fields
    `keep(path)` names (written explicitly) stay as they are, for validation to reject."""
    alg = data.get("algorithm")

    def neutral(path: str, value: Any) -> None:
        if path in data and not keep(path):
            data[path] = value

    if alg not in RPG_ALGORITHMS:
        neutral("kl", "none")
    if alg != "grpo":
        neutral("kl_correction", False)
        neutral("kl_clamp", True)
    if alg not in KL_LOSS_ALGORITHMS:
        neutral("kl_loss", None)
    clip = data.get("clip")
    if (
        alg != "rpg_reinforce"
        and isinstance(clip, dict)
        and "clipped_weight_in_sg" in clip
        and not keep("clip.clipped_weight_in_sg")
    ):
        data["clip"] = {k: v for k, v in clip.items() if k != "clipped_weight_in_sg"}
    if alg == "dapo":
        neutral("beta", 0.0)
        neutral("reference", "iterative")
    if data.get("backend") == "local":
        neutral("verl", {})
    return data


# ---------------------------------------------------------------------------------------------
# Fragment checks: each value of base/grid/include/exclude against its field's type


def _check_fragments(sweep: SweepSpec) -> None:
    for key, value in sweep.base.items():
        _check_field(key, value, f"base.{key}")
    axes = set(sweep.grid)
    for key, values in sweep.grid.items():
        if not values:
            raise SpecError("empty axis; allowed: a non-empty list of values", f"grid.{key}")
        for i, value in enumerate(values):
            _check_field(key, value, f"grid.{key}[{i}]")
    if sweep.seeds is not None:
        if "seed" in axes:
            raise SpecError("the grid already has a seed axis; allowed: seeds or grid.seed, not both", "seeds")
        if not sweep.seeds:
            raise SpecError("empty; allowed: a non-empty list of integers >= 0", "seeds")
        for i, seed in enumerate(sweep.seeds):
            _check_field("seed", seed, f"seeds[{i}]")
    for i, entry in enumerate(sweep.include):
        for key, value in entry.items():
            _check_field(key, value, f"include[{i}].{key}")
    for i, entry in enumerate(sweep.exclude):
        for key, value in entry.items():
            if key not in axes:
                allowed = ", ".join(sweep.grid) or "none (the grid is empty)"
                raise SpecError(f"not a grid axis; allowed: {allowed}", f"exclude[{i}].{key}")
            _check_field(key, value, f"exclude[{i}].{key}")  # a mapping may be partial


_ADAPTERS: dict[str, TypeAdapter] = {}


def _check_field(key: str, value: Any, where: str) -> None:
    """Validate one (possibly dotted) field alone; missing sub-fields are fine (the cell fills them)."""
    if key not in _ADAPTERS:
        info = _field_info(key)
        if info is None:
            raise SpecError(f"unknown field; allowed: {', '.join(_field_names(key))}", where)
        annotation = info.rebuild_annotation()
        is_model = isinstance(annotation, type) and issubclass(annotation, BaseModel)  # has its own config
        config = None if is_model else ConfigDict(strict=True, allow_inf_nan=False)
        _ADAPTERS[key] = TypeAdapter(annotation, config=config)
    try:
        _ADAPTERS[key].validate_python(value)
    except ValidationError as e:
        problems = [err for err in e.errors() if err["type"] != "missing"]
        if problems:
            raise _from_pydantic(problems[0], _model_at(key)).within(prefix=where) from None
    except SpecError as e:
        raise e.within(prefix=where) from None


def _model_at(dotted: str) -> type[BaseModel] | None:
    """The model whose fields a value of `dotted` holds (for listing allowed sub-fields)."""
    info = _field_info(dotted)
    return _model_in(info.annotation) if info is not None else None


def _field_info(dotted: str) -> FieldInfo | None:
    model: type[BaseModel] | None = ExperimentSpec
    info = None
    for part in dotted.split("."):
        if model is None or part not in model.model_fields:
            return None
        info = model.model_fields[part]
        model = _model_in(info.annotation)
    return info


def _field_names(dotted: str) -> list[str]:
    parent = dotted.rpartition(".")[0]
    model = _model_at(parent) if parent else ExperimentSpec
    return list(model.model_fields) if model is not None else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


# ---------------------------------------------------------------------------------------------
# Validation errors -> one line


def _validate(model: type[BaseModel], data: Any) -> Any:
    if not isinstance(data, dict):
        got = "an empty file" if data is None else type(data).__name__
        raise SpecError(f"expected a mapping of {model.__name__} fields, got {got}")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise _from_pydantic(e.errors()[0], model) from None


def _from_pydantic(err: dict[str, Any], root: type[BaseModel] | None) -> SpecError:
    loc = tuple(err["loc"])
    path = _loc_path(loc)
    kind, got = err["type"], err.get("input")
    ctx = err.get("ctx") or {}
    if kind == "extra_forbidden":
        owner = _owner_model(root, loc[:-1])
        fields = ", ".join(owner.model_fields) if owner is not None else "?"
        return SpecError(f"unknown field; allowed: {fields}", path)
    if kind == "missing":
        return SpecError("required field is missing", path)
    if kind == "literal_error":
        return SpecError(f"got {got!r}; allowed: {ctx.get('expected', '?')}", path)
    if kind == "value_error":
        return SpecError(str(ctx.get("error", err["msg"])), path)
    bounds = {
        "greater_than": "> {gt}",
        "greater_than_equal": ">= {ge}",
        "less_than": "< {lt}",
        "less_than_equal": "<= {le}",
        "too_short": "at least {min_length} item(s)",
        "string_too_long": "at most {max_length} characters",
        "string_pattern_mismatch": "text matching {pattern}",
    }
    if kind in bounds:
        limits = {k: _num(v) if isinstance(v, float) else v for k, v in ctx.items()}  # 1048576, not 1.04858e+06
        return SpecError(f"got {got!r}; allowed: {bounds[kind].format(**limits)}", path)
    message = err["msg"].removeprefix("Input should be ")
    return SpecError(f"got {got!r} ({type(got).__name__}); allowed: {message}", path)


def _owner_model(root: type[BaseModel] | None, loc: tuple) -> type[BaseModel] | None:
    model = root
    for part in loc:
        if model is None:
            return None
        if isinstance(part, str) and part in model.model_fields:
            model = _model_in(model.model_fields[part].annotation)
        elif isinstance(part, str) and isinstance(model, type) and part == model.__name__:
            continue  # pydantic names the union member it tried
    return model


def _loc_path(loc: tuple) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in ("Clip", "Every", "DynamicSampling", "Overlong", "KLLoss") or part.startswith(
            ("literal[", "function-")
        ):
            continue  # union-member tags, not fields
        else:
            path = _join_path(path, part)
    return path


def _join_path(prefix: str, path: str) -> str:
    if not prefix or not path:
        return prefix or path
    return prefix + path if path.startswith("[") else f"{prefix}.{path}"


# ---------------------------------------------------------------------------------------------
# YAML


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(
            "no such file; pass the path of a spec YAML (the paper's are in experiments/)", source=str(path)
        ) from None
    except OSError as e:
        raise SpecError(f"cannot read: {e.strerror}", source=str(path)) from None
    except UnicodeDecodeError as e:
        raise SpecError(
            f"not a text file (byte {e.start} is not UTF-8); pass the path of a spec YAML", source=str(path)
        ) from None
    import yaml

    try:
        data = yaml.load(text, Loader=_loader())
    except _DuplicateKey as e:
        raise SpecError(
            f"line {e.problem_mark.line + 1}: {e.problem}; allowed: each key once per mapping", source=str(path)
        ) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SpecError(f"{where}invalid YAML ({problem})", source=str(path)) from None
    if _expanded_size(data) > MAX_YAML_VALUES:
        raise SpecError(
            f"its aliases (*name) expand to more than {MAX_YAML_VALUES:,} values; allowed: a spec whose "
            "anchors are reused a bounded number of times",
            source=str(path),
        )
    if "${" in text:  # omegaconf is slow to import; only files that interpolate pay for it
        data = _resolve_interpolations(data, path)
    return data


def _expanded_size(data: Any) -> int:
    """How many values `data` holds with every alias expanded, counted without expanding: PyYAML shares an
    aliased fragment, but deep copies, validation and JSON would each expand it (nested aliases: 10^9)."""
    sizes: dict[int, int] = {}

    def size(node: Any) -> int:
        if not isinstance(node, (dict, list)):
            return 1
        if id(node) not in sizes:
            sizes[id(node)] = MAX_YAML_VALUES + 1  # a fragment that holds itself expands without end
            children = [*node.keys(), *node.values()] if isinstance(node, dict) else node
            sizes[id(node)] = min(1 + sum(size(c) for c in children), MAX_YAML_VALUES + 1)
        return sizes[id(node)]

    return size(data)


def _resolve_interpolations(data: Any, path: Path) -> Any:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        return OmegaConf.to_container(OmegaConf.create(data), resolve=True)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", "") or ""
        raise SpecError(f"interpolation failed: {str(e).splitlines()[0]}", str(key), str(path)) from None


_LOADER: type | None = None
_DuplicateKey: type = type("_DuplicateKey", (Exception,), {})  # replaced by a yaml.YAMLError subclass in _loader


def _loader() -> type:
    """PyYAML's safe loader that also reads `1e-4` as a float (YAML 1.1 wants `1.0e-4`), as omegaconf does,
    and rejects a key given twice in one mapping (PyYAML keeps the last silently). Keys merged in with
    `<<: *anchor` may be overridden: only a mapping's own keys must be distinct."""
    global _LOADER, _DuplicateKey
    if _LOADER is None:
        import yaml

        class DuplicateKey(yaml.constructor.ConstructorError):
            pass

        def construct_map(loader, node):
            seen: dict[str, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                    continue
                if key_node.value in seen:
                    raise DuplicateKey(
                        None,
                        None,
                        f"duplicate key {key_node.value!r} (first on line {seen[key_node.value]})",
                        key_node.start_mark,
                    )
                seen[key_node.value] = key_node.start_mark.line + 1
            yield from yaml.constructor.SafeConstructor.construct_yaml_map(loader, node)

        base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        _LOADER = type("SpecLoader", (base,), {})
        _DuplicateKey = DuplicateKey
        _LOADER.add_implicit_resolver(
            "tag:yaml.org,2002:float",
            re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
            list("-+0123456789."),
        )
        _LOADER.add_constructor("tag:yaml.org,2002:map", construct_map)
    return _LOADER


def val_sampling(spec: dict[str, Any] | None) -> dict[str, Any]:
    """How a run's validation samples: n per problem, temperature, top_p, and max_tokens (its response
    length), from its canonical spec as a dict; the defaults where it says nothing (None: no spec)."""
    spec = spec or {}
    val = {**Val().model_dump(), **(spec.get("val") or {})}
    lengths = context_lengths(spec.get("context", "4k"))
    return {
        "n": int(val["n"]),
        "temperature": float(val["temperature"]),
        "top_p": float(val["top_p"]),
        "max_tokens": lengths[1],
    }
