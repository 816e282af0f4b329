"""A benchmark's one name, its place in tables, the one table of which scorer judges it, and a problem's identity.

Names: what `rpg eval` records, what training validation is stored under, and what the report's
columns say. verl names a validation set by its rows' data_source; the paper's files use the data
sources below, which the report has always shown under the paper's names.

Scorers: `SCORER_BY_BENCHMARK` is read by verl's reward function (`rpg_cli.rewards.compute_score`), the
local backend and `rpg eval` alike, so a benchmark is judged by the same rule wherever it is scored. A
spec's `scorers:` or `rpg eval --scorer` overrides it.

Problems: `problem_key` says which rows of a data file are the same problem (its chat prompt and ground truth),
for the dry run's count (`rpg_cli.inputs`), the local trainer's validation set and `rpg eval` (the store's
`samples.problem`) alike, so they count the same problems. Standard library only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from rpg_cli.file_facts import remembered

SCORERS = ("dapo", "math_verify")  # rpg_cli.rewards implements them
BENCHMARK_ALIASES = {
    "math_dapo": "aime24",  # DAPO's AIME 2024 file keeps the training set's data_source
    "aime2024": "aime24",
    "aime_2024": "aime24",
    "aime-2024": "aime24",
    "aime2025": "aime25",
    "aime_2025": "aime25",
    "aime-2025": "aime25",
    "amc_23": "amc23",
    "amc2023": "amc23",
    "amc-23": "amc23",
    "minerva": "minerva_math",  # Table 7's benchmarks: rpg prepare-data's data_source is the paper's name
    "minerva-math": "minerva_math",  # the paper's verl fork's name
    "olympiad_bench": "olympiadbench",
}

# The paper's choices (its verl fork's `default_compute_score`): the "Answer:" rule for the AIME/AMC/DAPO
# files, math-verify for Minerva-Math and OlympiadBench. The toy task is scored as the local backend always
# scored it. `math_dapo` (the training set) is named aime24 by the alias above, so it gets dapo too.
SCORER_BY_BENCHMARK = {
    "aime24": "dapo",
    "aime25": "dapo",
    "amc23": "dapo",
    "minerva_math": "math_verify",
    "olympiadbench": "math_verify",
    "toy_add": "dapo",
}
HOLDOUT_SUFFIX = "_holdout"  # prepare-data --holdout: a slice of a set, judged as the set is

# The paper's tables' column order; other benchmarks follow, by name
BENCHMARK_ORDER = {"aime24": 0, "aime25": 1, "amc23": 2, "minerva_math": 3, "olympiadbench": 4}


class NoScorerError(ValueError):
    """A benchmark with no scorer in the table and none given; the message says how to give one."""


def benchmark_name(data_source: str) -> str:
    """The name of the benchmark whose rows carry `data_source` (the paper's name where it has one)."""
    return BENCHMARK_ALIASES.get(data_source, data_source)


def benchmark_sort_key(name: str) -> tuple[int, str]:
    """Where a benchmark goes in tables, plots and comparisons: the paper's order, then the others by name."""
    return BENCHMARK_ORDER.get(name, len(BENCHMARK_ORDER)), name


def problem_messages(prompt: Iterable[Mapping]) -> tuple[dict[str, str], ...]:
    """A row's chat prompt as a problem holds it: each message's role (user where it has none) and content."""
    return tuple({"role": m.get("role") or "user", "content": m.get("content")} for m in prompt)


def problem_key(prompt: Iterable[Mapping], ground_truth: object) -> str:
    """A problem's identity: 16 hex digits of the SHA-256 of its messages (`problem_messages`) and ground truth
    (as text). Rows with the same key are one problem wherever problems are counted or sampled, whatever their
    data_source. The store's `samples.problem`: its bytes must never change (tests/test_problem_identity.py)."""
    messages = list(problem_messages(prompt))
    text = json.dumps([messages, str(ground_truth)], sort_keys=True, ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def scorer_for(data_source: str, overrides: Mapping[str, str] | None = None) -> str:
    """The scorer of rows with `data_source`: an override named by the data source or its benchmark
    name, else the table's (a held-out slice gets its set's); NoScorerError when there is none."""
    source = str(data_source)
    overrides = overrides or {}
    names = [source, benchmark_name(source)]
    if source.endswith(HOLDOUT_SUFFIX):
        base = source[: -len(HOLDOUT_SUFFIX)]
        names += [base, benchmark_name(base)]
    for name in names:
        if name in overrides:
            return overrides[name]
    for name in names:
        if name in SCORER_BY_BENCHMARK:
            return SCORER_BY_BENCHMARK[name]
    raise NoScorerError(
        f"no scorer for benchmark {benchmark_name(source)!r} (data_source {source!r}): rpg knows "
        f"{', '.join(SCORER_BY_BENCHMARK)}; give one, e.g. `scorers: {{{benchmark_name(source)}: dapo}}` in the "
        "spec or `rpg eval --scorer dapo` (scorers: dapo, math_verify)"
    )


def data_sources(path: str) -> list[str] | None:
    """The distinct data_source values of a local parquet file, in first-seen order; None when it cannot be
    read here (a URL, a file not written yet). pyarrow is imported only here."""
    if "://" in path:
        return None
    file = Path(path).expanduser()
    try:
        stat = file.stat()
    except OSError:
        return None
    # the file as it is now: the same name in another directory, or rewritten, is another file
    return _data_sources(str(file.resolve()), stat.st_mtime_ns, stat.st_size)


@remembered("data-sources", decode=lambda v: [str(x) for x in v])  # a dry run asks once per run, of the same files
def _data_sources(path: str, mtime_ns: int, size: int) -> list[str] | None:
    try:
        import pyarrow.parquet as pq

        with pq.ParquetFile(path) as parquet:  # pq.read_table goes through pyarrow.dataset, which imports pandas
            column = parquet.read(columns=["data_source"]).column("data_source")
        return [str(v) for v in dict.fromkeys(column.to_pylist())]
    except Exception:  # noqa: BLE001 - any unreadable file: its benchmarks are just not listed
        return None


def describe_scorers(spec: Mapping) -> str:
    """Which scorer judges each benchmark of a (canonical) spec's data files, for `rpg sweep --dry-run`:
    `aime24 dapo, minerva_math dapo (spec)`; a benchmark without one says so and how to give one."""
    overrides = spec.get("scorers") or {}
    data = spec.get("data") or {}
    shown: dict[str, str] = {}
    unread = 0
    for path in [*data.get("train_files", []), *data.get("val_files", [])]:
        sources = data_sources(path)
        unread += sources is None
        for source in sources or []:
            name = benchmark_name(source)
            try:
                scorer = scorer_for(source, overrides)
            except NoScorerError:
                shown[name] = f"{name} NONE (give one: `scorers: {{{name}: dapo}}`)"
                continue
            try:
                by_table = scorer_for(source)
            except NoScorerError:
                by_table = None
            shown[name] = f"{name} {scorer}" + (" (spec)" if scorer != by_table else "")
    if unread:
        table = ", ".join(f"{k} {v}" for k, v in {**SCORER_BY_BENCHMARK, **overrides}.items())
        shown["?"] = f"{unread} file(s) not readable here, judged by: {table}"
    return ", ".join(shown.values())
