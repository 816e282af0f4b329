"""The typed models of one run: `ExperimentSpec` and its parts (reference, data, validation, rollout, DAPO's
tricks, resources, the watchdog, trackers), its rules across fields, and its canonical spec. Elsewhere in
spec/: the algorithm's blocks (`algorithm_blocks.py`), the `verl` block (`verl_block.py`), contexts
(`contexts.py`), the run id and name the canonical spec gives (`identity.py`), fields by dotted path
(`fields.py`). What each algorithm takes is the algorithm table's (`rpg_cli.algorithms.table`), applied by
`algorithm_rules.py`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    create_model,
    model_serializer,
    model_validator,
)

from rpg_cli import watch as watchdog
from rpg_cli.algorithms import table
from rpg_cli.algorithms.defaults import OVERLONG_BUFFER, OVERLONG_PENALTY_FACTOR
from rpg_cli.backends import registry
from rpg_cli.benchmarks import SCORERS
from rpg_cli.spec import algorithm_rules, identity
from rpg_cli.spec.algorithm_blocks import (
    Clip,
    KLLoss,
    LossSettings,
    LossSource,
    LossTarget,
    RolloutCorrection,
    Sapo,
    with_loss_source,
)
from rpg_cli.spec.contexts import CONTEXT_LENGTHS, ContextTokens, context_label, context_lengths
from rpg_cli.spec.errors import SpecError
from rpg_cli.spec.frozen import _Frozen
from rpg_cli.spec.identity import without_empty
from rpg_cli.spec.verl_block import Verl
from rpg_cli.trackers import TRACKERS

# built from the table when this module is imported: an entry added to table.ALGORITHMS before is a spec algorithm
Algorithm = Literal[tuple(table.ALGORITHMS)]
KLVariant = Literal[(*table.KL_VARIANTS, "none")]
Advantage = Literal[tuple(table.ADVANTAGES)]
Context = Literal["2k", "4k", "8k"]
Optimizer = Literal["adamw", "schedule_free"]
LossAggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


# Bounds of sizes whose data is not known where the spec is read (inputs.py checks them against the data):
# far above any real run, low enough that a typo (1e9 prompts per step) never reaches a machine.
MAX_STEPS = 1_000_000
MAX_BATCH = 1_048_576
MAX_ROLLOUTS = 4096


# ---------------------------------------------------------------------------------------------
# The models


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

    buffer: int = Field(OVERLONG_BUFFER, ge=1)  # tokens before the response budget where the penalty starts
    penalty_factor: float = Field(OVERLONG_PENALTY_FACTOR, ge=0)


class Checkpoints(_Frozen):
    """What a run's checkpoints keep on disk. Resuming needs the newest full checkpoint only; `rpg eval` (and
    Best over steps) reads the Hugging Face weights at the steps it evaluates. Not in the run id: it changes
    no number a run computes."""

    # full checkpoints kept, the newest (sharded model, optimizer, reference; what a resume reads); null: all
    keep: int | None = Field(1, ge=1)
    # HF weights: "all" keeps them at every checkpoint (older ones thinned to their weights), "kept" only in
    # the full checkpoints kept
    weights: Literal["all", "kept"] = "all"


DEFAULT_GPU_MEMORY_GIB = 80.0  # the paper grids' GPUs (H100, A100-80GB): what the dry run's memory check assumes


class Resources(_Frozen):
    nodes: int = Field(1, ge=1)
    gpus_per_node: int = Field(ge=0)
    cpus: float = Field(gt=0)
    # each GPU's memory in GiB (an 80 GB H100 reports 79.6): the dry run checks a run's estimated per-GPU peak
    # against it; a fact of the cluster, not of the run (not in the run id)
    gpu_memory_gib: float = Field(DEFAULT_GPU_MEMORY_GIB, gt=0, le=4096)


class WatchBound(_Frozen):
    """A bound on one metric that the watchdog checks at every step it ingests (rpg_cli/watch.py): a step after
    `after_step` beyond max or below min stops the run and fails it with one line. For a default's key, the
    fields given change the default's (rollout_corr/k3_kl: {after_step: 5} keeps its max)."""

    max: float | None = None
    min: float | None = None
    after_step: int | None = Field(None, ge=0, le=MAX_STEPS)  # grace: steps up to it are not checked

    @model_validator(mode="after")
    def _ordered(self) -> WatchBound:
        if self.max is not None and self.min is not None and self.min > self.max:
            raise ValueError(f"min {self.min:g} is above max {self.max:g}; allowed: min <= max")
        return self

    @model_serializer(mode="wrap")
    def _drop_unset(self, handler: Any) -> dict[str, Any]:
        # what the spec sets, only: the default bound's own fields fill the rest (watch.bounds)
        return {k: v for k, v in handler(self).items() if v is not None}


class StallWatch(_Frozen):
    """When `rpg runs` shows a running run stalled, and `rpg sweep --stall-timeout` counts from: no new metrics
    for `factor` x its median step time, at least `floor_s` seconds (rpg_cli/watch.py says why these defaults)."""

    factor: float = Field(watchdog.STALL_FACTOR, ge=1)
    floor_s: float = Field(watchdog.STALL_FLOOR_S, gt=0)


BOUND_FORMS = "{max: X}, {min: X}, both, each with after_step: N; or null (turns a default off)"


def _bound_form(value: Any) -> Any:
    # a bare number or a typo'd field: one line naming what a bound takes
    if value is None or isinstance(value, WatchBound):
        return value
    if not isinstance(value, dict):
        raise ValueError(f"got {value!r}; allowed: {BOUND_FORMS}")
    if unknown := [k for k in value if k not in WatchBound.model_fields]:
        raise ValueError(f"unknown field {unknown[0]!r}; allowed: {', '.join(WatchBound.model_fields)}")
    return value


class Watch(_Frozen):
    """The watchdog (rpg_cli/watch.py): `stall` settings, and a bound per metric key. The defaults watch
    training/rollout_probs_diff_mean and rollout_corr/k3_kl (a broken weight sync to vLLM); a key changes a
    default's fields or adds a bound of the spec's own (actor/entropy: {min: 0.05}); null turns a default off.
    Not in the run id: it stops runs, and changes no number a run computes."""

    model_config = ConfigDict(frozen=True, extra="allow", strict=True, allow_inf_nan=False)
    __pydantic_extra__: dict[str, Annotated[WatchBound | None, BeforeValidator(_bound_form)]] = Field(init=False)
    stall: StallWatch | None = None

    @model_validator(mode="after")
    def _bounds_something(self) -> Watch:
        for key, bound in (self.model_extra or {}).items():
            if why := watchdog.key_fault(key):  # a ValueError: pydantic places it (watch, or base.watch in a sweep)
                raise ValueError(why)
            if bound is not None and bound.max is None and bound.min is None and key not in watchdog.DEFAULT_BOUNDS:
                raise ValueError(f"{key} bounds nothing; allowed: {BOUND_FORMS}")
        return self


# One optional field per registered tracker (rpg_cli.trackers.TRACKERS), its settings model: a new
# tracker needs no edit here.
TRACKER_NAMES = tuple(TRACKERS)


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


class _TrackersBlock(_Frozen):
    """Where a run's metrics are reported (W&B, TensorBoard, MLflow): never what it computes, so not in its id."""

    project: str = Field("rpg", min_length=1)  # W&B project, MLflow experiment (verl: trainer.project_name)
    group: str | None = None  # default: the run's cell (its spec less the seed), so seeds band together
    tags: list[str] = Field(default_factory=list)  # besides the sweep and the values of its varying axes


# then `<name>: <its settings model> | None` per registered tracker (None: off)
Trackers = create_model(
    "Trackers",
    __base__=_TrackersBlock,
    __module__=__name__,
    __doc__=_TrackersBlock.__doc__,
    **{name: (tracker.settings | None, None) for name, tracker in TRACKERS.items()},
)


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


class ExperimentSpec(_Frozen):
    """One run, fully typed. Its canonical JSON (defaults included) defines its id."""

    algorithm: Algorithm
    kl: KLVariant = "none"
    # Which algorithm takes which of the fields up to `advantage` is the table's (table.NEUTRAL, `applies`)
    kl_correction: bool = False  # grpo: weight GRPO's k3 term by w (loss `grpo_corrected`)
    kl_clamp: bool = True  # grpo: its k3 as verl's low_var_kl (clamped), as the paper ran it; false: exact
    kl_loss: KLLoss | None = None  # PPO-family losses without a KL term of their own: a KL loss toward the reference
    beta: float = Field(ge=0)
    clip: ClipSetting
    sapo: Sapo | None = None  # sapo: its gate's temperatures (the table's default: {})
    loss: LossTarget | None = None  # custom: package.module:function, called per token (MATH.md section 11)
    loss_settings: LossSettings = Field(default_factory=dict)  # custom: handed to the loss as `settings`
    loss_source: LossSource | None = None  # custom: the hash of the loss module's source, filled in (in the run id)
    advantage: Advantage | None = None  # custom: its advantage estimator (the table's default: grpo)
    # verl's algorithm.rollout_correction (MATH.md section 10), on every algorithm
    rollout_correction: RolloutCorrection | None = None
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
    checkpoints: Checkpoints = Field(default_factory=Checkpoints)  # what they keep on disk (not in the run id)
    backend: Annotated[str, BeforeValidator(registry.registered)]  # read from the registry at validation time
    resources: Resources
    trackers: TrackersSetting = None
    verl: Verl = Field(default_factory=Verl)  # backend verl only: extra overrides and env (see Verl)
    watch: Watch | None = None  # the watchdog's bounds and stall settings (None: its defaults; not in the run id)

    @model_validator(mode="before")
    @classmethod
    def _table_defaults(cls, data: Any) -> Any:
        # the algorithm's defaults (dapo's tricks, gspo's clip, ...) where the spec gives none, and a custom loss's
        # source hash; the canonical spec (and run id) spells them out
        data = algorithm_rules.with_defaults(data)
        alg = algorithm_rules.entry(data.get("algorithm")) if isinstance(data, dict) else None
        return with_loss_source(data, takes_loss=alg is not None and alg.takes("loss"))

    @model_validator(mode="after")
    def _combinations(self) -> ExperimentSpec:
        algorithm_rules.check(self)  # what the algorithm takes: the table's
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
    def entry(self) -> table.Algorithm:
        """The algorithm table's entry of this run's algorithm."""
        return table.algorithm(self.algorithm)

    @property
    def loss_name(self) -> str:
        """The `rpg_cli.algorithms.losses.policy_loss` name of this run (the table's; "custom" for a custom loss)."""
        name = self.entry.loss_name(self.kl)
        return f"{name}_corrected" if self.kl_correction else name  # only grpo takes kl_correction

    @property
    def advantage_estimator(self) -> str:
        """A key of table.ADVANTAGES: the spec's `advantage` where the algorithm takes one (custom), else the table's
        estimator."""
        return self.advantage if self.entry.takes("advantage") and self.advantage else self.entry.advantage

    @property
    def kl_in_reward(self) -> bool:
        """Whether beta weighs a k1 penalty folded into each response's reward (the table's `beta_in`, a nonzero
        beta): verl's algorithm.use_kl_in_reward, the local trainer's reward penalty. The one place it is decided."""
        return self.entry.beta_in == "reward" and self.beta > 0

    def canonical(self) -> dict[str, Any]:
        """The JSON-ready spec, defaults included: what spec.json holds (the run id hashes canonical_json)."""
        spec = self.model_dump(mode="json")
        if spec.get("watch") is None:  # the defaults: spec.json and the store as before the watch block
            spec.pop("watch", None)
        return without_empty(spec)

    def canonical_json(self) -> str:
        """What the run id hashes: the canonical spec less NOT_IN_RUN_ID (spec/identity.py)."""
        return identity.canonical_json(self.canonical())

    @property
    def run_id(self) -> str:
        return identity.run_id(self.canonical())

    @property
    def run_name(self) -> str:
        """Readable and unique: rpg_reinforce-urkl-clip0.2_0.28-adamw-4k-s0-1a2b3c4d."""
        return identity.run_name(self.canonical())


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
