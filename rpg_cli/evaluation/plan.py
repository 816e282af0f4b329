"""What an `rpg eval` will do: which runs and checkpoints, on which problems, sampled how.

Everything a user can get wrong (a missing checkpoint, an unknown benchmark, a data file that is not
there or not verl's format) is found here, before any model is loaded or any job is submitted, and
reported as one line. Pure Python plus pyarrow: no torch.

RUN_OR_CHECKPOINT is, in this order of trial:
  a path: a run directory (spec.json, checkpoints/), one checkpoint of a run (checkpoints/step_N of
          the local backend; checkpoints/global_step_N[/actor[/huggingface]] of verl), or any HF model
          directory (config.json; evaluated as step 0 of a run of its own in the sweep "checkpoints");
  a reference to the results store: a run id, a unique id prefix, a run name, or a sweep (all its runs).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rpg_cli import rundir
from rpg_cli.benchmarks import NoScorerError, benchmark_name, problem_key, problem_messages, scorer_for
from rpg_cli.evaluation.options import EvalError, EvalOptions, parse_steps

PLAIN_SWEEP = rundir.PLAIN_SWEEP  # the sweep under which models that belong to no run are recorded


@dataclass(frozen=True)
class Sampling:
    k: int
    temperature: float
    top_p: float
    max_tokens: int
    seed: int
    # the run's spec's: prompts are tokenized as the run trained (not part of the protocol: a run has one)
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict, hash=False)

    def describe(self) -> dict[str, Any]:
        return {
            "k": self.k,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
            "seed": self.seed,
        }

    @property
    def protocol(self) -> dict[str, Any]:
        """The store's identity of scores sampled this way (store/schema.py): n = k samples per problem."""
        return {
            "n": self.k,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
            "seed": self.seed,
        }


@dataclass(frozen=True)
class Problem:
    messages: tuple[dict[str, str], ...]  # the chat prompt, as stored in the parquet row
    ground_truth: str
    data_source: str

    @property
    def key(self) -> str:
        """Identifies the problem's content (prompt and ground truth; rpg_cli.benchmarks.problem_key, as the dry
        run and the local trainer count problems): the store's `problem` of its samples, the key of its cached
        responses."""
        return problem_key(self.messages, self.ground_truth)


@dataclass(frozen=True)
class Benchmark:
    name: str  # what the store records: the data source's benchmark name (rpg_cli/benchmarks.py)
    path: Path
    problems: tuple[Problem, ...]  # unique problems, in order of first appearance in the file
    rows: int  # rows in its file (problems x repeats, all data sources)


@dataclass(frozen=True)
class Checkpoint:
    step: int
    path: Path  # an HF model directory (config, tokenizer, weights)


@dataclass(frozen=True)
class Target:
    """One run (or stand-alone model) and the checkpoints of it to evaluate."""

    run_id: str
    name: str
    sweep: str
    run_dir: Path  # where eval/ (cached responses) goes
    spec: dict[str, Any] | None  # the run's canonical spec; None for a stand-alone model
    checkpoints: tuple[Checkpoint, ...]
    sampling: Sampling
    known: bool  # already recorded in the store

    @property
    def metrics_path(self) -> Path:
        return rundir.metrics_path(self.run_dir)


@dataclass(frozen=True)
class EvalPlan:
    options: EvalOptions
    targets: tuple[Target, ...]
    benchmarks: tuple[Benchmark, ...]
    skipped: tuple[str, ...] = field(default=())  # runs of a sweep without checkpoints, with why

    def scorer_for(self, target: Target, bench: Benchmark) -> str:
        """--scorer when given, else the run's spec's `scorers` override, else the table's (rpg_cli/benchmarks.py)."""
        return self.options.scorer or scorer_for(bench.problems[0].data_source, (target.spec or {}).get("scorers"))

    def cells(self) -> Iterator[tuple[Target, int, Benchmark, str]]:
        """Every (run, checkpoint step, benchmark) the plan scores, with the scorer that judges it."""
        for target in self.targets:
            for checkpoint in target.checkpoints:
                for bench in self.benchmarks:
                    yield target, checkpoint.step, bench, self.scorer_for(target, bench)

    @property
    def total_samples(self) -> int:
        problems = sum(len(b.problems) for b in self.benchmarks)
        return sum(len(t.checkpoints) * t.sampling.k * problems for t in self.targets)


# ------------------------------------------------------------------------------------------ planning


def plan_eval(options: EvalOptions, resolved: list[Target] | None = None) -> EvalPlan:
    """Resolve and check everything `options` names; raises EvalError (one line) on bad input. With
    `resolved` (an evaluation job: the targets `rpg eval` resolved), nothing is looked up in the store."""
    targets, skipped = (list(resolved), []) if resolved is not None else _resolve_targets(options)
    benchmarks = tuple(
        b for name in dict.fromkeys(options.benchmarks) for b in load_benchmark(name, Path(options.data_dir))
    )
    names = [b.name for b in benchmarks]
    if twice := sorted({n for n in names if names.count(n) > 1}):
        files = ", ".join(str(b.path) for b in benchmarks if b.name in twice)
        raise EvalError(
            f"benchmark {twice[0]} is in more than one of the files ({files}): its rows' data_source names it; "
            "evaluate one of them, or give one file another data_source (`rpg prepare-data --input --data-source`)"
        )
    plan = EvalPlan(options, tuple(targets), benchmarks, tuple(skipped))
    for target in plan.targets:
        for bench in benchmarks:
            try:
                plan.scorer_for(target, bench)
            except NoScorerError as e:
                raise EvalError(f"{bench.path}: {e}") from None
    return plan


def _resolve_targets(options: EvalOptions) -> tuple[list[Target], list[str]]:
    path = Path(options.ref)
    if path.exists():
        return [_target_from_path(path, options)], []
    records = _lookup(options.ref, options.db)
    if not records:
        raise EvalError(
            f"{options.ref!r} is not a checkpoint, run directory or model directory, nor a run or sweep in "
            f"the results store ({options.db}); give a path, or a run id/name from `rpg runs`"
        )
    targets, skipped = [], []
    for record in records:
        try:
            targets.append(
                _target(
                    record.id,
                    record.name,
                    record.sweep,
                    Path(record.run_dir),
                    record.spec,
                    _select(Path(record.run_dir), options.steps),
                    options,
                    known=True,
                )
            )
        except EvalError as e:
            if len(records) == 1:
                raise
            skipped.append(f"{record.name}: {e}")
    if not targets:
        raise EvalError(f"no run of {options.ref!r} has a checkpoint to evaluate ({skipped[0]})")
    return targets, skipped


def _lookup(ref: str, db: str) -> list:
    from rpg_cli.store import NoStoreError, open_store

    try:
        store = open_store(db, create=False)
    except NoStoreError:  # no database, or one without rpg's tables: nothing recorded in it
        return []
    try:
        return store.resolve(ref)
    finally:
        store.close()


def _target_from_path(path: Path, options: EvalOptions) -> Target:
    path = Path(os.path.abspath(path))  # no link resolved: a run directory planted as a link must be seen
    checkpoint = rundir.as_checkpoint(path)
    if checkpoint is not None:
        step, step_dir, run_dir = checkpoint
        model_dir = rundir.model_dir(step_dir)
        if model_dir is None:
            raise EvalError(_no_weights(step_dir))
        if options.steps not in ("last",):
            raise EvalError(
                f"--steps {options.steps} applies to runs; {path} is one checkpoint (step {step}): "
                "give the run directory to choose steps"
            )
        if run_dir is not None and rundir.spec_path(run_dir).is_file():
            return _run_dir_target(run_dir, [Checkpoint(step, model_dir)], options)
        return _plain_target(model_dir, step, options, run_dir=run_dir)
    if rundir.spec_path(path).is_file() or rundir.checkpoints_dir(path).is_dir():
        return _run_dir_target(path, _select(path, options.steps), options)
    if (path / "config.json").is_file():
        if not rundir.has_weights(path):
            raise EvalError(f"{path} has a config.json but no weights (*.safetensors, pytorch_model*.bin)")
        return _plain_target(path, 0, options)
    raise EvalError(
        f"{path} is not a run directory (spec.json, checkpoints/), a checkpoint (step_N, global_step_N) "
        "or an HF model directory (config.json)"
    )


def _no_weights(step_dir: Path) -> str:
    return (
        f"{step_dir} holds no HF model weights; for verl runs set actor_rollout_ref.actor.checkpoint.save_contents "
        "to include hf_model, or merge the checkpoint with `python -m verl.model_merger merge`"
    )


def _select(run_dir: Path, steps: str) -> list[Checkpoint]:
    found = rundir.find_checkpoints(run_dir)
    usable = {s: p for s, p in found.items() if p is not None}
    if not found:
        raise EvalError(f"{run_dir} has no checkpoints yet (checkpoints/step_N or checkpoints/global_step_N)")
    wanted = parse_steps(steps)
    if wanted == "all":
        if not usable:
            raise EvalError(_no_weights(rundir.checkpoint_dir(run_dir, max(found))))
        return [Checkpoint(s, p) for s, p in usable.items()]
    if wanted == "last":
        wanted = [max(found)]
    missing = [s for s in wanted if s not in found]
    if missing:
        raise EvalError(
            f"{run_dir} has no checkpoint for step {', '.join(map(str, missing))}; "
            f"its steps: {', '.join(map(str, found))}"
        )
    for s in wanted:
        if found[s] is None:
            raise EvalError(_no_weights(rundir.checkpoint_dir(run_dir, s)))
    return [Checkpoint(s, usable[s]) for s in wanted]


def _run_dir_target(run_dir: Path, checkpoints: list[Checkpoint], options: EvalOptions) -> Target:
    spec_path = rundir.spec_path(run_dir)
    if not spec_path.is_file():
        return _plain_target(checkpoints[0].path, checkpoints[0].step, options, checkpoints, run_dir)
    try:
        spec = json.loads(spec_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise EvalError(f"{spec_path}: not a readable spec ({e}); rewrite it with `rpg sweep`") from None
    from rpg_cli.spec import ExperimentSpec, SpecError

    try:
        validated = ExperimentSpec.model_validate(spec)
    except (SpecError, ValueError) as e:
        raise EvalError(f"{spec_path}: not a valid run spec ({str(e).splitlines()[0]})") from None
    run_id = validated.run_id
    records = _lookup(run_id, options.db)
    if records and records[0].id == run_id:
        r = records[0]
        return _target(r.id, r.name, r.sweep, Path(r.run_dir), r.spec, checkpoints, options, known=True)
    return _target(
        run_id,
        validated.run_name,
        run_dir.parent.name,
        run_dir,
        validated.canonical(),
        checkpoints,
        options,
        known=False,
    )


def _plain_target(
    model_dir: Path,
    step: int,
    options: EvalOptions,
    checkpoints: list[Checkpoint] | None = None,
    run_dir: Path | None = None,
) -> Target:
    """A model that belongs to no known run: recorded as a run of its own, named after its directory."""
    origin = run_dir or model_dir
    run_id = "hf-" + hashlib.sha256(str(origin).encode()).hexdigest()[:8]
    name = f"{origin.name}-{run_id[3:]}"
    known = bool(_lookup(run_id, options.db))
    home = run_dir or Path(options.runs_dir).resolve() / PLAIN_SWEEP / name
    return _target(run_id, name, PLAIN_SWEEP, home, None, checkpoints or [Checkpoint(step, model_dir)], options, known)


def _target(
    run_id: str,
    name: str,
    sweep: str,
    run_dir: Path,
    spec: dict[str, Any] | None,
    checkpoints: list[Checkpoint],
    options: EvalOptions,
    known: bool,
) -> Target:
    return Target(run_id, name, sweep, run_dir, spec, tuple(checkpoints), sampling_for(spec, options), known)


def sampling_for(spec: dict[str, Any] | None, options: EvalOptions) -> Sampling:
    """The run's validation sampling (val.n, val.temperature, val.top_p, its response length), with the
    user's overrides; the spec's defaults (val.n = 32: Mean@32) for a model without a spec."""
    from rpg_cli.spec import val_sampling

    val = val_sampling(spec)
    return Sampling(
        k=options.k if options.k is not None else val["n"],
        temperature=options.temperature if options.temperature is not None else val["temperature"],
        top_p=options.top_p if options.top_p is not None else val["top_p"],
        max_tokens=options.max_tokens if options.max_tokens is not None else val["max_tokens"],
        seed=options.seed,
        chat_template_kwargs=dict((spec or {}).get("chat_template_kwargs") or {}),
    )


# ---------------------------------------------------------------------------------------- benchmarks


def benchmark_files() -> dict[str, str]:
    """Benchmark name -> the file `rpg prepare-data` writes for it (the evaluation presets)."""
    from rpg_cli.datasets.sources import PRESETS

    return {name: preset.filename for name, preset in PRESETS.items() if not preset.train}


def load_benchmark(name: str, data_dir: Path) -> list[Benchmark]:
    """The benchmarks of a preset name (its file in `data_dir`) or a path to any prepared parquet: one
    per data_source of its rows, named as training validation names it (rpg_cli/benchmarks.py)."""
    files = benchmark_files()
    if name in files:
        path = Path(data_dir) / files[name]
        if not path.is_file():
            raise EvalError(
                f"no {path} for benchmark {name}: write it with `rpg prepare-data {name}` "
                f"(or pass --data-dir DIR where it is)"
            )
    elif name.endswith(".parquet") or "/" in name:
        path = Path(name)
        if not path.is_file():
            raise EvalError(f"benchmark file {path} does not exist; write it with `rpg prepare-data --input FILE`")
    else:
        raise EvalError(f"unknown benchmark {name!r}; choose from {', '.join(files)}, or give a prepared .parquet file")
    problems, rows = read_problems(path)
    by_source: dict[str, list[Problem]] = {}
    for problem in problems:
        by_source.setdefault(benchmark_name(problem.data_source), []).append(problem)
    return [Benchmark(bench, path.resolve(), tuple(found), rows) for bench, found in by_source.items()]


def read_problems(path: Path) -> tuple[tuple[Problem, ...], int]:
    """The unique problems of a verl-format parquet: one row each, or (older files, the paper's) k copies
    each, grouped here so that k samples of a problem stay one problem's for pass@k."""
    import pyarrow.parquet as pq

    try:
        records = pq.read_table(path, columns=["prompt", "reward_model", "data_source"]).to_pylist()
    except Exception as e:  # pyarrow raises several types for missing columns and bad files
        raise EvalError(
            f"{path}: not a verl-format parquet with prompt, reward_model, data_source "
            f"({type(e).__name__}); write it with `rpg prepare-data`"
        ) from None
    unique: dict[str, Problem] = {}
    for row, record in enumerate(records):
        messages, reward = record["prompt"], record["reward_model"] or {}
        if not messages or not all(isinstance(m, dict) and m.get("content") for m in messages):
            raise EvalError(f"{path}: row {row} has no prompt messages; rewrite the file with `rpg prepare-data`")
        if reward.get("ground_truth") in (None, ""):
            raise EvalError(
                f"{path}: row {row} has no reward_model.ground_truth; rewrite the file with `rpg prepare-data`"
            )
        problem = Problem(problem_messages(messages), str(reward["ground_truth"]), str(record["data_source"]))
        unique.setdefault(problem.key, problem)
    if not unique:
        raise EvalError(f"{path} has no rows; write it with `rpg prepare-data`")
    return tuple(unique.values()), len(records)
