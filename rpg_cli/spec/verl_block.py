"""A verl run's `verl` block: what it may say beyond the spec's fields, and what it may not.

`overrides` (in the run id) may change what a run computes; `site` (not in the run id) only how it executes on a
cluster, so every key it sets is in SITE_KEYS, each with its reason; no list may set where a run writes
(UNSETTABLE) or carry a credential, by name or by value (credential_in, also read by `rpg slurm`). Keys are
compared as Hydra reads them (read_override). README, "Specs and sweeps", says the same for users.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import urllib.parse
from typing import Any

from pydantic import Field, ValidationInfo, field_validator, model_validator

from rpg_cli.spec.frozen import _Frozen


class Verl(_Frozen):
    """What a verl run needs beyond the spec's fields: extra Hydra overrides of verl's ppo_trainer config and
    environment variables for its processes. `overrides` may change what a run computes, so they are part of
    the run id, and may replace an override rpg generates. `site` says how a run executes on a cluster and
    nothing else: every key it sets is one of SITE_KEYS (memory, parallelism, offload, kernels, worker counts,
    timeouts), which may replace a generated value; `env` sets its processes' environment. Neither is part of
    the run id. No list may set where a run writes or Ray's runtime env (UNSETTABLE: a run's outputs stay in its
    run directory), and nothing in the block may be a credential: the block travels in the job's metadata (Ray's
    jobs API), spec.json and the store. Keys are compared as Hydra reads them (`+`, `++`, `~`, a dict value
    setting children), parents and children included."""

    overrides: list[str] = Field(default_factory=list)
    site: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("overrides", "site", mode="before")
    @classmethod
    def _no_credential_in_overrides(cls, items: Any) -> Any:
        # before the type check, whose error would print the item
        for i, item in enumerate(items if isinstance(items, list) else ()):
            if not isinstance(item, str):
                raise ValueError(f"item {i} is not text ({type(item).__name__}); allowed: a Hydra override, key=value")
            if why := credential_in(item) or _database_url_in(item):
                raise ValueError(f"{override_key(item)[:100]} holds {why}; {_NO_CREDENTIALS}")
        return items

    @field_validator("overrides", "site")
    @classmethod
    def _hydra_overrides(cls, items: list[str], info: ValidationInfo) -> list[str]:
        keys = []
        for item in items:
            override = read_override(item)
            for path in override.paths:
                if why := unsettable(path):
                    raise ValueError(f"{why}; allowed: any other key")
            for path, value in override.leaves:
                if _CREDENTIAL_SETTING.search(path.rsplit(".", 1)[-1]) and value not in (None, ""):
                    raise ValueError(f"{path} names a credential; {_NO_CREDENTIALS}")
            if info.field_name == "site":
                _check_site(override)
            keys.append(override.key)
        if len(set(keys)) < len(keys):
            twice = sorted({k for k in keys if keys.count(k) > 1})
            raise ValueError(f"{', '.join(twice)} given twice; allowed: each key once")
        return items

    @field_validator("env", mode="before")
    @classmethod
    def _env_settings_only(cls, env: Any) -> Any:
        # before the type check, whose error would print a value
        for name, value in env.items() if isinstance(env, dict) else ():
            if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(
                    f"{str(name)[:100]!r} is not an environment variable name; allowed: letters, digits, _"
                )
            if name in RESERVED_ENV:
                raise ValueError(f"{name} is rpg's own ({RESERVED_ENV[name]}); allowed: any other name")
            if credential_name(name):
                raise ValueError(f"{name} names a credential; {_NO_CREDENTIALS}")
            if isinstance(value, str) and (why := credential_in(value) or _database_url_in(value)):
                raise ValueError(f"{name} holds {why}; {_NO_CREDENTIALS}")
        return env

    @model_validator(mode="after")
    def _one_list_per_key(self) -> Verl:
        overridden = {read_override(item).key for item in self.overrides}
        if both := sorted(overridden & {read_override(item).key for item in self.site}):
            raise ValueError(f"{', '.join(both)} given in both overrides and site; allowed: one of them")
        return self


# set by rpg for every verl run, or rpg's alone; VERL_USE_EXTERNAL_MODULES may be given (loaded before rpg's plugin)
RESERVED_ENV = {
    "VERL_FILE_LOGGER_PATH": "the run's metrics file",
    "RPG_DB": "the store's URL (store/url.py DB_ENVVAR): rpg's process reads the store, a job never opens it",
}
_NO_CREDENTIALS = (
    "allowed: settings only; credentials go in the nodes' own environment (or their ~/.netrc), never in the spec, "
    "whose verl block travels in Ray's jobs API, spec.json and the store"
)


def override_key(override: str) -> str:
    """The config key a Hydra override sets: `+a.b=1` -> `a.b`."""
    return override.split("=", 1)[0].lstrip("+~")


# ---------------------------------------------------------------------------------------------
# The verl block's keys, checked against verl 0.9.1's config (verl/trainer/config/ppo_trainer.yaml and the group
# files it composes; tests/test_verl_block.py composes it with every key below)

_ROLLOUT, _ACTOR, _REF, _MODEL = (f"actor_rollout_ref.{part}" for part in ("rollout", "actor", "ref", "model"))

# verl.site's allow-list: keys that say only how a run executes on a cluster, each with what it changes. The same
# numbers come out (up to kernels' rounding) and vLLM samples from the same distribution, so a cell keeps its run id
# from one cluster to the next. The token budgets split a batch into micro-batches only: verl 0.9.1 normalizes the
# loss over the whole mini-batch (batch_num_tokens, global_batch_size, the batch's padded response width:
# workers/utils/losses.py, rpg's plugin likewise), so no gradient changes; diagnostics averaged per micro-batch
# (pg_clipfrac) may. Left out on purpose: dtypes (bf16 and fp32 are other numbers), use_remove_padding, and
# everything rpg's spec fields say.
SITE_KEYS: dict[str, str] = {
    # vLLM, the rollout: its memory, its replicas and how it schedules
    f"{_ROLLOUT}.gpu_memory_utilization": "vLLM's share of each GPU (its weights and KV cache)",
    f"{_ROLLOUT}.tensor_model_parallel_size": "GPUs per vLLM replica (rpg generates 2 on even GPU counts, else 1)",
    f"{_ROLLOUT}.max_num_batched_tokens": "tokens vLLM schedules per step (rpg generates max(8192, context))",
    f"{_ROLLOUT}.max_num_seqs": "sequences vLLM runs at once",
    f"{_ROLLOUT}.enable_chunked_prefill": "vLLM prefills long prompts in chunks",
    f"{_ROLLOUT}.enable_prefix_caching": "vLLM reuses a shared prompt's KV cache",
    f"{_ROLLOUT}.enforce_eager": "vLLM without CUDA graphs",
    f"{_ROLLOUT}.cudagraph_capture_sizes": "the batch sizes vLLM captures CUDA graphs for",
    f"{_ROLLOUT}.free_cache_engine": "vLLM frees its KV cache while the trainer runs",
    f"{_ROLLOUT}.enable_sleep_mode": "vLLM sleeps (offloads) while the trainer runs (+key: not in verl's yaml)",
    f"{_ROLLOUT}.layered_summon": "FSDP gathers the weights for vLLM layer by layer",
    f"{_ROLLOUT}.checkpoint_engine.update_weights_bucket_megabytes": "the size of each weight transfer to vLLM",
    f"{_ROLLOUT}.agent.num_workers": "agent-loop workers sending vLLM its requests",
    # the trainer's passes (FSDP): how a batch is split, sharded, recomputed and offloaded
    f"{_ACTOR}.ppo_max_token_len_per_gpu": "tokens per micro-batch of the update (rpg generates two sequences' worth)",
    f"{_ROLLOUT}.log_prob_max_token_len_per_gpu": "tokens per micro-batch of the old log-probs' pass (forward only)",
    f"{_REF}.log_prob_max_token_len_per_gpu": "tokens per micro-batch of the reference's pass (forward only)",
    f"{_ACTOR}.ulysses_sequence_parallel_size": "GPUs one sequence is split over (Ulysses)",
    f"{_REF}.ulysses_sequence_parallel_size": "GPUs one sequence is split over in the reference's pass",
    f"{_ACTOR}.fsdp_config.param_offload": "the actor's weights in CPU memory between passes",
    f"{_ACTOR}.fsdp_config.optimizer_offload": "the optimizer's state in CPU memory between steps",
    f"{_ACTOR}.fsdp_config.offload_policy": "FSDP2's CPU offload of weights, gradients and optimizer",
    f"{_ACTOR}.fsdp_config.reshard_after_forward": "FSDP frees gathered weights after the forward pass",
    f"{_ACTOR}.fsdp_config.forward_prefetch": "FSDP gathers the next unit's weights early",
    f"{_ACTOR}.fsdp_config.wrap_policy.min_num_params": "the size of FSDP's units",
    f"{_REF}.fsdp_config.param_offload": "the reference's weights in CPU memory between passes",
    f"{_REF}.fsdp_config.reshard_after_forward": "FSDP frees the reference's gathered weights after its pass",
    f"{_REF}.fsdp_config.forward_prefetch": "FSDP gathers the reference's next unit early",
    f"{_REF}.fsdp_config.wrap_policy.min_num_params": "the size of the reference's FSDP units",
    f"{_ACTOR}.entropy_from_logits_with_chunking": "entropy computed over chunks of the logits",
    f"{_ACTOR}.entropy_from_logits_chunk_size": "the chunks' size",
    f"{_ACTOR}.entropy_checkpointing": "entropy recomputed in the backward pass instead of kept",
    f"{_REF}.entropy_from_logits_with_chunking": "the reference's pass over chunks of the logits",
    f"{_REF}.entropy_from_logits_chunk_size": "the reference's chunks' size",
    f"{_MODEL}.enable_gradient_checkpointing": "activations recomputed in the backward pass (rpg generates true)",
    f"{_MODEL}.enable_activation_offload": "activations kept in CPU memory",
    f"{_MODEL}.use_fused_kernels": "log-probs and entropy from a fused kernel, without the whole logits",
    f"{_MODEL}.fused_kernel_options.impl_backend": "the fused kernel's implementation (torch, triton)",
    # the attention of the trainer's model (not vLLM's): one of SITE_VALUES' kernels, the same attention over packed
    # sequences (transformers 5 masks sdpa's and eager's per sequence from the position ids, as flash-attn's varlen
    # kernel does); verl's default flash_attention_2 needs flash-attn on the node (`rpg doctor`)
    f"{_MODEL}.override_config.attn_implementation": "the attention kernel of the trainer's model (+key)",
    # processes and timeouts
    "reward.num_workers": "processes scoring responses",
    "data.dataloader_num_workers": "processes loading batches (their order is the seeded sampler's)",
    "data.filter_overlong_prompts_workers": "processes filtering overlong prompts",
    "transfer_queue.backend.SimpleStorage.num_data_storage_units": "TransferQueue's storage actors",
    "actor_rollout_ref.nccl_timeout": "seconds NCCL waits for a collective",
    "trainer.ray_wait_register_center_timeout": "seconds verl waits for its workers to register",
}
# site keys that take some values only
SITE_VALUES: dict[str, tuple[Any, ...]] = {
    f"{_MODEL}.override_config.attn_implementation": ("flash_attention_2", "flash_attention_3", "sdpa", "eager"),
}

_WRITTEN = "written outside the run directory"
_PROFILER = f"profiler traces (save_path), {_WRITTEN}, and a command run after profiling"
# Keys no verl list may set, nor a parent or child of them: where a run writes (a run's outputs stay in its run
# directory, runs/<sweep>/<run>/; rpg sets the checkpoints' and the metrics' place, where resume, `rpg eval` and
# the store look), Ray's runtime env (env vars and an interpreter for every worker: a way around verl.env's
# checks), rollouts replayed from a dump, and Hydra's own settings.
UNSETTABLE: dict[str, str] = {
    "trainer.default_local_dir": "where checkpoints go; rpg keeps them in the run directory, where resume and rpg "
    "eval read them",
    "trainer.default_hdfs_dir": f"a copy of every checkpoint, {_WRITTEN}",
    "trainer.rollout_data_dir": f"rollout dumps, {_WRITTEN}",
    "trainer.validation_data_dir": f"validation dumps, {_WRITTEN}",
    "trainer.logger": "where metrics go; rpg sets them: its file logger (what the store ingests) and the spec's "
    "trackers block",
    "global_profiler": _PROFILER,
    f"{_ACTOR}.profiler": _PROFILER,
    f"{_REF}.profiler": _PROFILER,
    f"{_ROLLOUT}.profiler": _PROFILER,
    "critic.profiler": _PROFILER,
    f"{_ROLLOUT}.prometheus": f"a Prometheus config file, {_WRITTEN}",
    f"{_ROLLOUT}.trace": "rollout traces, sent to a tracker outside the run directory",
    "skip": f"rollout dumps, {_WRITTEN} and replayed by later runs",
    "ray_kwargs": "Ray's runtime env of every worker (env vars, an interpreter): a way around verl.env's checks; "
    "rpg sets the run's Ray namespace there",
    "hydra": f"Hydra's output directory and logs, {_WRITTEN}",
}
# the same wherever they sit (another role's profiler, another engine's files)
_UNSETTABLE_NAMES = {
    **dict.fromkeys(("profiler", "global_profiler", "npu_profile", "finish_hook_cmd"), _PROFILER),
    **dict.fromkeys(
        ("save_path", "dump_dir", "timeline_json_file", "record_file", "rollout_data_dir", "validation_data_dir"),
        f"a file or directory {_WRITTEN}",
    ),
    **dict.fromkeys(("default_local_dir", "default_hdfs_dir"), UNSETTABLE["trainer.default_local_dir"]),
    "runtime_env": UNSETTABLE["ray_kwargs"],
}


def unsettable(path: str) -> str | None:
    """Why no verl list may set `path` (a dotted key of verl's config; "" for its root), in words naming it, or
    None: it is, holds, or sits under a key of UNSETTABLE, or a name of _UNSETTABLE_NAMES is in it."""
    if not path:
        return "a config group placed at the config's root (_global_) may set any key, outputs included"
    for key, why in UNSETTABLE.items():
        if path == key:
            return f"{key} is {why}"
        if path.startswith(f"{key}.") or key.startswith(f"{path}."):
            return f"{path} {'is under' if path.startswith(key) else 'holds'} {key}: {why}"
    for name in path.split("."):
        if name in _UNSETTABLE_NAMES:
            return f"{path}: {name} is {_UNSETTABLE_NAMES[name]}"
    return None


@dataclasses.dataclass(frozen=True)
class HydraOverride:
    """One override as Hydra reads it."""

    key: str  # without `+`, `++`, `~` and `@package`
    delete: bool  # ~key
    group: bool  # picks a config group's file (a/b=..., key@package=...), which replaces the node it lands in
    leaves: tuple[tuple[str, Any], ...]  # (path, value) of every leaf it sets: a dict value sets children
    paths: tuple[str, ...]  # every key of verl's config it sets, replaces or deletes


@functools.lru_cache(maxsize=4096)
def read_override(text: str) -> HydraOverride:
    """`text` parsed by Hydra's own override parser (ValueError, one line, if it cannot be, or if it sweeps)."""
    key = override_key(text)[:100]
    try:
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from hydra.core.override_parser.types import OverrideType, ValueType
    except ImportError:
        raise ValueError(
            f"{key}: reading Hydra overrides needs hydra-core; allowed: pip install -e '.[verl]' in rpg's clone"
        ) from None
    try:
        parsed = OverridesParser.create().parse_override(text)
    except Exception as e:  # Hydra's grammar errors (HydraException, ParseCancellationException)
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise ValueError(
            f"{key}: not an override Hydra reads ({reason}); allowed: key=value, +key=value, ++key=value, ~key"
        ) from None
    key = parsed.key_or_group
    if parsed.value_type not in (None, ValueType.ELEMENT):
        raise ValueError(
            f"{key}: a sweep (a,b, range(), glob()) runs several configs; allowed: one value (a grid: the sweep file)"
        )
    delete = parsed.type == OverrideType.DEL
    value = None if parsed.value_type is None else parsed.value()
    group = "/" in key or parsed.package is not None
    if group:  # a config group's file replaces the node it lands in whole
        package = parsed.package
        if package is not None and package.split(".")[0] == "_global_":
            package = package.removeprefix("_global_").lstrip(".")
        paths = tuple(p for p in (key.replace("/", "."), package) if p is not None)
        return HydraOverride(key, delete, True, tuple((p, value) for p in paths), paths)
    leaves = tuple(_leaves(key, value)) if not delete else ((key, None),)
    return HydraOverride(key, delete, False, leaves, tuple(path for path, _ in leaves))


def _leaves(path: str, value: Any) -> list[tuple[str, Any]]:
    """(path, value) of every leaf a value sets at `path`: a non-empty dict sets its children, anything else `path`."""
    if isinstance(value, dict) and value:
        return [leaf for k, v in value.items() for leaf in _leaves(f"{path}.{k}", v)]
    return [(path, value)]


def _check_site(override: HydraOverride) -> None:
    """ValueError (one line) unless `override` sets keys of SITE_KEYS only, to plain values."""
    into = "or this override in verl.overrides (part of the run id)"
    if override.delete:
        raise ValueError(f"~{override.key}: site sets values and deletes none; allowed: key=value of a site key")
    if override.group:
        raise ValueError(f"{override.key}: a config group swaps a whole part of verl's config; allowed: {into[3:]}")
    for path, value in override.leaves:
        if path not in SITE_KEYS:
            raise ValueError(
                f"{path} may change what a run computes, and site is not in the run id; allowed: a key of the site "
                f"table (memory, parallelism, offload, kernels, worker counts, timeouts: README, verl block), {into}"
            )
        if isinstance(value, dict) or (isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value)):
            raise ValueError(f"{path}: a mapping sets keys the site table does not hold; allowed: a value or a list")
        if "${" in str(value):
            raise ValueError(f"{path}: an interpolation reads other keys or the environment; allowed: a plain value")
        if path in SITE_VALUES and value not in SITE_VALUES[path]:
            allowed = ", ".join(map(str, SITE_VALUES[path]))
            raise ValueError(f"{path}={value!r}: not a kernel of the same attention; allowed: {allowed}")


# ---------------------------------------------------------------------------------------------
# Credentials: refused in the verl block (and in `rpg slurm`'s sbatch options), by name and by value

# names of an environment variable (or an --export) that hold one: keys, tokens (not TOKENIZERS_...), secrets,
# passwords (DB_PASS, PGPASSFILE), MYSQL_PWD, credentials, auth, NETRC, cookies, GitHub's PAT
_CREDENTIAL_NAME = re.compile(r"KEY|TOKEN(?!IZER)|SECRET|PASS|PWD|CREDENTIAL|AUTH|NETRC|COOKIE|(?:^|_)PAT(?:_|$)", re.I)
# the last name of a config key that holds one (prompt_key, tokenizer_path are settings)
_CREDENTIAL_SETTING = re.compile(
    r"(?i)^(?:\w*_)?(?:password|passwd|pass|pwd|secret|token|api_?key|access_?key|private_?key|credentials?|cookie)$"
)
# in a value: a URL's user or password (scheme://user@, scheme://user:password@), a secret parameter
# (?password=, &token=, libpq's password=, Azure's sig=), a token of a known shape, a private key
_URL_USERINFO = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/@'\"<>?#]+@")
_SECRET_PARAM = re.compile(
    r"(?i)(?:^|[?&;\s,'\"({])[\w.-]*(?:pass(?:word|wd)?|pwd|secret|token|api[_-]?key|access[_-]?key|private[_-]?key"
    r"|accountkey|sig|signature|credentials?)\s*[=:]\s*(?!(?:true|false|null|none)\b)[^&;\s'\"}]"
)
_TOKEN_SHAPE = re.compile(
    r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_\w{20,}|glpat-[\w-]{20,}|hf_[A-Za-z0-9]{30,}|xox[abprs]-[\w-]{10,}"
    r"|AKIA[0-9A-Z]{16}|sk-[\w-]{20,}|eyJ[\w-]{10,}\.eyJ[\w-]{10,}\.[\w-]+)|-----BEGIN [A-Z ]*PRIVATE KEY-----"
)
# a database server's URL (the store's or another's): rpg's process reads the store, a job never opens one
_DATABASE_URL = re.compile(r"(?i)\b(?:postgres(?:ql)?|mysql|mariadb|mssql|oracle|cockroachdb)(?:\+\w+)?://")


def credential_name(name: str) -> bool:
    """Whether an environment variable's name says it holds a credential (DB_PASS, MYSQL_PWD, GITHUB_PAT, NETRC)."""
    return bool(_CREDENTIAL_NAME.search(name))


def credential_in(text: str) -> str | None:
    """What credential `text` holds, in words that do not repeat it (None: none found), read as written and
    percent-decoded (`?%70assword=` is `?password=` to a server): a URL with a user or password, a secret
    parameter, a token of a known shape (GitHub, Hugging Face, AWS, Slack, OpenAI, a JWT) or a private key."""
    for form in {text, _percent_decoded(text)}:
        if _URL_USERINFO.search(form):
            return "a URL with a user or password in it (user@ or user:password@)"
        if _SECRET_PARAM.search(form):
            return "a password, token, key or secret parameter"
        if _TOKEN_SHAPE.search(form):
            return "a token or private key"
    return None


def _database_url_in(text: str) -> str | None:
    return (
        "a database server's URL (rpg's process reads the store; a job never opens a database)"
        if (_DATABASE_URL.search(text) or _DATABASE_URL.search(_percent_decoded(text)))
        else None
    )


def _percent_decoded(text: str) -> str:
    """`text` percent-decoded until it no longer changes (a few rounds: %2570 is p twice decoded)."""
    for _ in range(4):
        plain = urllib.parse.unquote(text)
        if plain == text:
            break
        text = plain
    return text
