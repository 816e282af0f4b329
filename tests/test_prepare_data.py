"""`rpg prepare-data`: raw problems from files (or the hub) -> verl parquet, with an honest report.

The CLI runs for real, in process (CliRunner) or as a subprocess, on files each test writes, and
on the paper's own evaluation files in ../shared/data when they are present.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from rpg_cli.cli import app
from rpg_cli.datasets import SourceOptions, pipeline, prepare, resolve_sources
from rpg_cli.datasets.clean import answer_text, foreign_script_share, is_english, question_text
from rpg_cli.datasets.pipeline import collect

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("RPG_SHARED_DATA") or REPO.parent / "shared" / "data")
REFERENCE = {  # preset -> (the paper's file, rows, data_source)
    "aime24": ("aime-2024.parquet", 960, "math_dapo"),
    "aime25": ("aime25.parquet", 960, "aime2025"),
    "amc23": ("amc-23.parquet", 1280, "amc_23"),
}
needs_reference = pytest.mark.skipif(
    not all((SHARED_DATA / f).exists() for f, _, _ in REFERENCE.values()),
    reason="the paper's evaluation files (../shared/data) are not on this machine",
)

# Written out here, not imported, so that a change to the package's template fails these tests.
PAPER_PROMPT = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)

PROBLEMS = [
    ("What is $1+1$?", 2, "2"),
    ("Compute $\\frac{1}{2}+\\frac{1}{4}$ as a fraction.", "\\frac{3}{4}", "\\frac{3}{4}"),
    ("Find $x$ if $2x = 1$.", "0.50", "0.50"),  # must stay "0.50": no number guessing on text
]

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, ["prepare-data", *args], env={"COLUMNS": "250"})


def rows_of(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def dapo_row(problem: str, answer: str, uid: str) -> dict:
    """A row as DAPO-Math-17k stores it: prompt already templated, answer inside reward_model."""
    return {
        "data_source": "math_dapo",
        "prompt": [{"content": PAPER_PROMPT.format(problem), "role": "user"}],
        "ability": "MATH",
        "reward_model": {"ground_truth": answer, "style": "rule-lighteval/MATH_v2"},
        "extra_info": {"index": uid},
    }


# --- local files of every kind --------------------------------------------------------------------


@pytest.fixture
def three_formats(tmp_path: Path) -> dict[str, tuple[Path, list[str]]]:
    """The same three problems as JSONL, CSV (own column names) and parquet, with the flags each needs."""
    jsonl = write_jsonl(tmp_path / "set.jsonl", [{"problem": p, "answer": a} for p, a, _ in PROBLEMS])
    csv_path = tmp_path / "set.csv"
    with csv_path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "q", "a"])
        writer.writerows([i, p, a] for i, (p, a, _) in enumerate(PROBLEMS))
    parquet = tmp_path / "set.parquet"
    pq.write_table(
        pa.table({"question": [p for p, _, _ in PROBLEMS], "final_answer": [str(a) for _, a, _ in PROBLEMS]}), parquet
    )
    return {
        "jsonl": (jsonl, []),
        "csv": (csv_path, ["--question-field", "q", "--answer-field", "a"]),
        "parquet": (parquet, []),  # fields auto-detected
    }


@pytest.mark.parametrize("kind", ["jsonl", "csv", "parquet"])
def test_any_local_file_becomes_verl_rows_one_per_problem(kind, three_formats, tmp_path):
    source, flags = three_formats[kind]
    result = run("--input", str(source), "--name", "mine", "--out", str(tmp_path / "out"), *flags)
    assert result.exit_code == 0, result.output
    rows = rows_of(tmp_path / "out" / "mine.parquet")
    expected = [
        {
            "data_source": "mine",
            "prompt": [{"content": PAPER_PROMPT.format(problem), "role": "user"}],
            "ability": "MATH",
            "reward_model": {"ground_truth": truth, "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": position, "raw_problem": problem, "split": None, "raw_answer": None},
        }
        for position, (problem, _, truth) in enumerate(PROBLEMS)
    ]
    assert rows == expected
    assert re.search(r"│ mine .*│\s+3 │ -\s+│\s+3 │ ", result.stdout)  # read, dropped, problems


def test_default_run_writes_the_four_paper_files_with_the_paper_data_sources(tmp_path, monkeypatch):
    dapo = tmp_path / "dapo.parquet"
    pq.write_table(
        pa.Table.from_pylist([dapo_row("Train on $1+2$.", "3", "u1"), dapo_row("And $2+2$.", "4", "u2")]), dapo
    )
    aime = write_jsonl(
        tmp_path / "aime.jsonl", [{"problem": "Hard $n$?", "answer": "7"}, {"problem": "Next?", "answer": "8"}]
    )
    monkeypatch.chdir(tmp_path)
    result = run(f"dapo-math-17k={dapo}", f"aime24={aime}", f"aime25={aime}", f"amc23={aime}")
    assert result.exit_code == 0, result.output
    files = {p.name: rows_of(p) for p in (tmp_path / "data").iterdir()}
    assert sorted(files) == ["aime-2024.parquet", "aime-2025.parquet", "amc-2023.parquet", "dapo-math-17k-eng.parquet"]
    sources = {name: {r["data_source"] for r in rows} for name, rows in files.items()}
    assert sources == {
        "dapo-math-17k-eng.parquet": {"math_dapo"},
        "aime-2024.parquet": {"math_dapo"},
        "aime-2025.parquet": {"aime2025"},
        "amc-2023.parquet": {"amc_23"},
    }
    # Every set: one row per problem, numbered by position (the k samples of accuracy@k come from the
    # sampler); templated prompts unwrapped to the raw problem (not templated twice).
    assert [r["extra_info"]["index"] for r in files["amc-2023.parquet"]] == [0, 1]
    train = files["dapo-math-17k-eng.parquet"]
    assert [(r["extra_info"]["index"], r["extra_info"]["raw_problem"]) for r in train] == [
        (0, "Train on $1+2$."),
        (1, "And $2+2$."),
    ]
    assert train[0]["prompt"][0]["content"] == PAPER_PROMPT.format("Train on $1+2$.")


def test_from_option_equals_preset_equals_file(tmp_path):
    aime = write_jsonl(tmp_path / "aime.jsonl", [{"Problem": "Hard $n$?", "Answer": 12}])  # capitalized fields
    a = run("aime25", "--from", str(aime), "--out", str(tmp_path / "a"))
    b = run(f"aime25={aime}", "--out", str(tmp_path / "b"))
    assert a.exit_code == 0 and b.exit_code == 0, a.output + b.output
    rows = rows_of(tmp_path / "a" / "aime-2025.parquet")
    assert rows == rows_of(tmp_path / "b" / "aime-2025.parquet")
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["12"]


def test_repeat_is_gone_files_hold_one_row_per_problem(tmp_path):
    aime = write_jsonl(tmp_path / "aime.jsonl", [{"problem": "Hard $n$?", "answer": "7"}])
    result = run(f"aime24={aime}", "--repeat", "5", "--out", str(tmp_path))
    assert result.exit_code == 2 and "--repeat" in result.output and not (tmp_path / "aime-2024.parquet").exists()


def test_appendix_benchmarks_and_the_papers_training_file_from_local_copies(tmp_path):
    """Minerva-Math and OlympiadBench (Table 7) with the paper's data_source names, and the English DAPO file
    (verl rows, as the paper's repository ships it): read from local files shaped like their hub copies."""
    minerva = write_jsonl(
        tmp_path / "minerva.jsonl",
        [{"question": "Mass of $X$ in kg?", "answer": "3.5"}, {"question": "Speed?", "answer": "12"}],
    )
    olympiad = tmp_path / "olympiad.parquet"
    pq.write_table(
        pa.Table.from_pylist(
            [
                {"question": "Find all $n$.", "final_answer": ["$1$", "$2$"]},
                {"question": "Find $x$.", "final_answer": ["$7$"]},
            ]
        ),
        olympiad,
    )
    english = tmp_path / "dapo-math-17k-eng.parquet"
    rows = [dapo_row(p, str(i), f"u{i}") for i, p in enumerate(["Add $1$ and $2$.", "Square $3$.", "求 $x$ 的值。"])]
    pq.write_table(pa.Table.from_pylist(rows), english)
    result = run(
        f"minerva_math={minerva}",
        f"olympiadbench={olympiad}",
        f"dapo-math-17k={english}",
        "--out",
        str(tmp_path / "data"),
    )
    assert result.exit_code == 0, result.output
    written = {p.name: rows_of(p) for p in (tmp_path / "data").iterdir()}
    assert {r["data_source"] for r in written["minerva-math.parquet"]} == {"minerva_math"}
    assert [r["reward_model"]["ground_truth"] for r in written["olympiadbench.parquet"]] == ["1, 2", "7"]
    assert {r["data_source"] for r in written["olympiadbench.parquet"]} == {"olympiadbench"}
    # the English filter stays on as a fallback (the original DAPO-Math-17k has Chinese problems)
    assert [r["extra_info"]["raw_problem"] for r in written["dapo-math-17k-eng.parquet"]] == [
        "Add $1$ and $2$.",
        "Square $3$.",
    ]
    assert re.search(r"│ dapo-math-17k .*│\s+3 │ 1 non-English\s+│\s+2 │", result.stdout)  # problems it holds
    # rpg eval knows them as benchmarks, by the names the paper's Table 7 uses
    from rpg_cli.evaluation.plan import benchmark_files, load_benchmark

    assert {"minerva_math", "olympiadbench"} <= set(benchmark_files()) and "dapo-math-17k" not in benchmark_files()
    (olympiad_bench,) = load_benchmark("olympiadbench", tmp_path / "data")  # one per data_source
    assert (olympiad_bench.name, len(olympiad_bench.problems)) == ("olympiadbench", 2)


def test_prepared_file_prepares_to_itself(three_formats, tmp_path):
    source, _ = three_formats["jsonl"]
    assert run("--input", str(source), "--name", "x", "--out", str(tmp_path / "one")).exit_code == 0
    first = tmp_path / "one" / "x.parquet"
    result = run("--input", str(first), "--name", "x", "--out", str(tmp_path / "two"))
    assert result.exit_code == 0, result.output
    assert rows_of(tmp_path / "two" / "x.parquet") == rows_of(first)


# --- the paper's own files --------------------------------------------------------------------------


def _comparable(row: dict) -> tuple:
    """Everything of a row except extra_info.index, whose meaning differs between the paper's files."""
    return (
        row["data_source"],
        tuple((m["role"], m["content"]) for m in row["prompt"]),
        row["ability"],
        row["reward_model"]["ground_truth"],
        row["reward_model"]["style"],
        row["extra_info"]["raw_problem"],
        row["extra_info"]["split"],
    )


@needs_reference
def test_re_preparing_the_paper_files_reproduces_them(tmp_path):
    args = [f"{preset}={SHARED_DATA / name}" for preset, (name, _, _) in REFERENCE.items()]
    result = run(*args, "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    outputs = {"aime24": "aime-2024.parquet", "aime25": "aime-2025.parquet", "amc23": "amc-2023.parquet"}
    for preset, (name, n_rows, data_source) in REFERENCE.items():
        reference = pq.read_table(SHARED_DATA / name)
        ours = pq.read_table(tmp_path / outputs[preset])
        # the paper's 32 copies of each problem become one row per problem, numbered by position
        assert ours.num_rows == n_rows // 32
        assert set(map(_comparable, ours.to_pylist())) == set(map(_comparable, reference.to_pylist()))
        assert {r["data_source"] for r in ours.to_pylist()} == {data_source}
        assert [r["extra_info"]["index"] for r in ours.to_pylist()] == list(range(n_rows // 32))
        # Read -> all but one copy of each problem dropped as duplicates -> one row per problem written.
        assert re.search(rf"│ {preset} .*│\s+{n_rows:,} │ {n_rows - n_rows // 32:,} duplicate", result.stdout)


@needs_reference
def test_output_schema_is_exactly_the_paper_schema(three_formats, tmp_path):
    source, _ = three_formats["jsonl"]
    assert run("--input", str(source), "--out", str(tmp_path)).exit_code == 0
    ours = pq.read_schema(tmp_path / "set.parquet").remove_metadata()
    for name, _, _ in REFERENCE.values():
        reference = pq.read_schema(SHARED_DATA / name).remove_metadata()
        columns = [f for f in reference if not f.name.startswith("__index_level")]  # pandas' saved index
        # the paper's columns, plus extra_info.raw_answer (the source's answer where rpg normalized it)
        extra = pa.struct([*columns[-1].type, pa.field("raw_answer", pa.string())])
        assert pa.schema([*columns[:-1], pa.field("extra_info", extra)]).equals(ours), name


@needs_reference
def test_the_paper_eval_problems_count_as_english():
    problems = {
        r["extra_info"]["raw_problem"]
        for name, _, _ in REFERENCE.values()
        for r in pq.read_table(SHARED_DATA / name).to_pylist()
    }
    assert len(problems) == 100
    assert all(is_english(p) for p in problems)


# --- malformed rows ------------------------------------------------------------------------------------


@pytest.fixture
def broken_jsonl(tmp_path: Path) -> Path:
    return write_jsonl(
        tmp_path / "broken.jsonl",
        [
            {"problem": "Good $1$?", "answer": "1"},
            {"problem": "   ", "answer": "2"},  # line 2: empty question
            "{not json",  # line 3
            {"problem": "No answer here?"},  # line 4: missing answer
            {"problem": "Null answer?", "answer": None},  # line 5
            "[1, 2]",  # line 6: not an object
            {"problem": "Good $2$?", "answer": 2},
        ],
    )


def test_malformed_rows_are_skipped_and_reported_by_line(broken_jsonl, tmp_path):
    result = run("--input", str(broken_jsonl), "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    reported = re.findall(r"line (\d+): (.+)", result.stderr)
    assert [(int(n), why.split(" (")[0]) for n, why in reported] == [
        (2, "empty question"),
        (3, "invalid JSON"),
        (4, "missing answer"),
        (5, "missing answer"),
        (6, "not a JSON object"),
    ]
    rows = rows_of(tmp_path / "out" / "broken.parquet")
    assert [r["extra_info"]["raw_problem"] for r in rows] == ["Good $1$?", "Good $2$?"]
    assert re.search(r"│\s+7 │ 2 unreadable", result.stdout)


def test_csv_malformed_rows_report_file_lines(tmp_path):
    path = tmp_path / "set.csv"
    path.write_text('problem,answer\n"Fine?",3\n"Multi\nline?",\n,5\n')
    result = run("--input", str(path), "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    assert re.findall(r"line (\d+): (\w+ \w+)", result.stderr) == [("4", "missing answer"), ("5", "empty question")]


def test_strict_makes_malformed_rows_fatal_and_writes_nothing(broken_jsonl, tmp_path):
    good = write_jsonl(tmp_path / "good.jsonl", [{"problem": "Fine?", "answer": "1"}])
    out = tmp_path / "out"
    result = run(f"aime24={good}", "--input", str(broken_jsonl), "--strict", "--out", str(out))
    assert result.exit_code == 2
    assert not out.exists()  # not even the good source was written
    errors = [line for line in result.stderr.splitlines() if "--strict" in line]
    assert len(errors) == 1 and "5 malformed" in errors[0] and "line 2" in errors[0]


# --- the hub, offline -------------------------------------------------------------------------------------


def test_unreachable_hub_fails_in_one_line_naming_the_local_file_option(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "rpg_cli", "prepare-data", "amc23", "--out", str(tmp_path / "out")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "math-ai/amc23" in lines[0] and "rpg prepare-data amc23=FILE" in lines[0]
    assert not (tmp_path / "out").exists()


def test_hub_source_is_read_through_datasets(tmp_path):
    """`hf:OWNER/NAME` goes through `datasets.load_dataset`, which also resolves a local dataset folder."""
    pytest.importorskip("datasets")
    folder = tmp_path / "someone" / "aime"
    folder.mkdir(parents=True)
    write_jsonl(folder / "train.jsonl", [{"problem": "P1?", "answer": 1}, {"problem": "P2?", "answer": "2"}])
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "COLUMNS": "250"}

    def rpg(*args):
        return subprocess.run(
            [sys.executable, "-m", "rpg_cli", "prepare-data", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    one_split = rpg("aime24=hf:someone/aime", "--out", "out")
    assert one_split.returncode == 0, one_split.stderr
    rows = rows_of(tmp_path / "out" / "aime-2024.parquet")
    assert [(r["extra_info"]["raw_problem"], r["reward_model"]["ground_truth"]) for r in rows] == [
        ("P1?", "1"),
        ("P2?", "2"),
    ]

    write_jsonl(folder / "test.jsonl", [{"problem": "T?", "answer": "3"}])
    two_splits = rpg("aime24=hf:someone/aime", "--out", "out2")
    assert (
        two_splits.returncode == 2 and "has splits train, test; pick one as hf:someone/aime@SPLIT" in two_splits.stderr
    )
    chosen = rpg("aime24=hf:someone/aime@test", "--out", "out3")
    assert chosen.returncode == 0, chosen.stderr
    assert [r["extra_info"]["raw_problem"] for r in rows_of(tmp_path / "out3" / "aime-2024.parquet")] == ["T?"]


def test_hub_errors_of_any_kind_become_one_line(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")

    def refuse(*args, **kwargs):
        raise RuntimeError("connection reset\nby peer")  # multi-line on purpose

    monkeypatch.setattr(datasets, "load_dataset", refuse)
    result = run("aime24", "--out", str(tmp_path))
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "connection reset by peer" in result.stderr
    assert "aime24=FILE" in result.stderr


def test_missing_datasets_package_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    result = run("aime25", "--out", str(tmp_path))
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert "pip install datasets" in result.stderr and "aime25=FILE" in result.stderr


# --- English filter and duplicates ---------------------------------------------------------------------


@pytest.fixture
def dapo_like(tmp_path: Path) -> Path:
    """A small DAPO-Math-17k: verbatim repeats, near-duplicates, and Chinese/Russian problems."""
    english = [f"Let $n={i}$. Find the number of divisors of $n^2+1$." for i in range(5)]
    rows = [
        dapo_row(p, str(i), f"u{i}-{copy}") for copy in range(3) for i, p in enumerate(english)
    ]  # 10 verbatim repeats
    rows.append(dapo_row("  let $N=0$.  find the number of DIVISORS of $n^2+1$.", "0", "case"))  # same as problem 0
    rows.append(dapo_row(english[1], "999", "conflict"))  # same problem, other answer
    chinese = [
        "已知 $x^2+\\frac{1}{x^2}=7$，求 $x+\\frac{1}{x}$ 的正值。",
        "设 $a,b$ 为正整数，且 $a+b=10$，求 $ab$ 的最大值。",
    ]
    rows += [
        dapo_row(p, "3", f"zh{i}-{copy}") for copy in range(2) for i, p in enumerate(chinese)
    ]  # 2 problems + 2 repeats
    rows.append(dapo_row("Найдите сумму всех целых $x$, для которых $x^2<10$.", "0", "ru"))
    rows.append(dapo_row("Li Hua (李华) has $3$ apples and eats $1$. How many apples are left?", "2", "name"))
    path = tmp_path / "dapo.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_english_filter_and_dedup_counts(dapo_like, tmp_path):
    spec = resolve_sources([f"dapo-math-17k={dapo_like}"], out_dir=tmp_path)[0]
    report = collect(spec).report
    assert report.read == 15 + 1 + 1 + 4 + 1 + 1
    assert report.dropped == {"non-English": 3, "duplicate": 10 + 1 + 2, "duplicate, other answer": 1}
    assert report.problems == 5 + 1  # five English problems and the one quoting a Chinese name
    assert report.malformed == []

    result = run(f"dapo-math-17k={dapo_like}", "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    assert all(s in result.stdout for s in ("3 non-English", "13 duplicate", "1 duplicate, other answer"))
    rows = rows_of(tmp_path / "out" / "dapo-math-17k-eng.parquet")
    assert len(rows) == 6 and rows[1]["reward_model"]["ground_truth"] == "1"  # first answer kept


def test_filters_can_be_switched_off(dapo_like, tmp_path):
    options = SourceOptions(english_only=False)
    assert (
        collect(resolve_sources([f"dapo-math-17k={dapo_like}"], out_dir=tmp_path, options=options)[0]).report.problems
        == 9
    )
    options = SourceOptions(dedup=False)
    report = collect(resolve_sources([f"dapo-math-17k={dapo_like}"], out_dir=tmp_path, options=options)[0]).report
    assert report.dropped == {"non-English": 5} and report.problems == 23 - 5


# --- a held-out selection set ------------------------------------------------------------------------------


def test_holdout_splits_the_training_set_into_disjoint_files_the_same_way_every_time(dapo_like, tmp_path):
    out = tmp_path / "out"
    result = run(f"dapo-math-17k={dapo_like}", "--holdout", "2", "--out", str(out))
    assert result.exit_code == 0, result.output
    train, held = rows_of(out / "dapo-math-17k-eng.parquet"), rows_of(out / "dapo-math-17k-eng-holdout.parquet")
    assert (len(train), len(held)) == (4, 2)  # 6 problems: 2 held out, never trained on
    assert {r["data_source"] for r in train} == {"math_dapo"} and {r["data_source"] for r in held} == {
        "math_dapo_holdout"  # its own benchmark name: `rpg report --select-on math_dapo_holdout`
    }
    problems = [r["prompt"][0]["content"] for r in train + held]
    assert len(set(problems)) == 6  # disjoint, and together the whole set
    assert [r["extra_info"]["index"] for r in held] == [0, 1]
    assert "dapo-math-17k (held out)" in result.stdout and "2 of its problems" in result.stdout
    again = tmp_path / "again"
    assert run(f"dapo-math-17k={dapo_like}", "--holdout", "2", "--out", str(again)).exit_code == 0
    assert rows_of(again / "dapo-math-17k-eng-holdout.parquet") == held  # a fixed seed: the same split


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["aime24=X", "--holdout", "5"], "--holdout holds problems of the training set out of it: name dapo-math-17k"),
        (["dapo-math-17k=X", "--holdout", "-1"], "--holdout -1: give a number of problems >= 0"),
        (["dapo-math-17k=X", "--holdout", "6"], "--holdout 6: dapo-math-17k has 6 problems, none would be left"),
    ],
)
def test_a_holdout_that_cannot_be_made_is_one_line_and_writes_nothing(args, message, dapo_like, tmp_path):
    out = tmp_path / "out"
    result = run(*[a.replace("=X", f"={dapo_like}") for a in args], "--out", str(out))
    assert result.exit_code == 2 and result.output.count("\n") == 1 and message in result.output, result.output
    assert not out.exists()


def test_a_failure_mid_write_leaves_the_old_file_and_no_partial_one(three_formats, tmp_path, monkeypatch):
    source, _ = three_formats["jsonl"]
    out = tmp_path / "out"
    assert run("--input", str(source), "--name", "x", "--out", str(out)).exit_code == 0
    before = (out / "x.parquet").read_bytes()

    real = pipeline.rows_to_batch
    calls = []

    def fail_on_second_group(rows):
        calls.append(len(rows))
        if len(calls) == 2:
            raise RuntimeError("disk on fire")
        return real(rows)

    monkeypatch.setattr(pipeline, "ROWS_PER_GROUP", 2)  # 3 problems: groups of 2 and 1
    monkeypatch.setattr(pipeline, "rows_to_batch", fail_on_second_group)
    result = run("--input", str(source), "--name", "x", "--out", str(out))
    assert isinstance(result.exception, RuntimeError)
    assert calls == [2, 1]  # the first group had been written to the temporary file
    assert (out / "x.parquet").read_bytes() == before
    assert sorted(p.name for p in out.iterdir()) == ["x.parquet"]  # no temporary file left behind


def test_prepare_api_writes_nothing_when_a_later_source_is_bad(three_formats, tmp_path):
    source, _ = three_formats["jsonl"]
    specs = resolve_sources([f"aime24={source}", f"amc23={tmp_path / 'missing.jsonl'}"], out_dir=tmp_path / "out")
    with pytest.raises(Exception, match="file not found"):
        prepare(specs)
    assert not (tmp_path / "out").exists()


# --- usage errors -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["aime2024"], "unknown source 'aime2024': choose from dapo-math-17k, aime24, aime25, amc23"),
        (["my.jsonl"], "--input my.jsonl"),
        (["aime24", "aime25", "--from", "x.jsonl"], "--from replaces the origin of exactly one preset"),
        (["aime24=nowhere.jsonl"], "file not found: nowhere.jsonl"),
        (["aime24=hf:justaname"], "bad hub dataset"),
        (["--name", "x"], "--name applies to --input only"),
        (["aime24=a.jsonl", "aime24=b.jsonl"], "would both write"),
    ],
)
def test_usage_errors_are_one_line_with_exit_2(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run(*args)
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr
    assert not (tmp_path / "data").exists()


def test_unknown_field_lists_the_fields(three_formats, tmp_path):
    source, _ = three_formats["csv"]
    result = run("--input", str(source), "--question-field", "question", "--out", str(tmp_path))
    assert result.exit_code == 2
    assert "no field 'question' (fields: id, q, a)" in result.stderr and "--question-field" in result.stderr
    undetectable = run("--input", str(source), "--out", str(tmp_path))
    assert undetectable.exit_code == 2 and "cannot tell which field holds the question" in undetectable.stderr


def test_help_teaches_by_example():
    result = run("--help")
    assert result.exit_code == 0
    for text in (
        "dapo-math-17k",
        "aime24",
        "amc23",
        "minerva_math",
        "olympiadbench",
        "--question-field",
        "--strict",
        "rpg prepare-data aime24=aime24.jsonl",
        "hf:BytedTsinghua-SIA/DAPO-Math-17k@train",
    ):
        assert text in result.stdout


# --- values ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (27, "27"),
        (27.0, "27"),
        (0.5, "0.5"),
        ("  336^\\circ ", "336^\\circ"),
        (["5"], "5"),
        ("0.50", "0.50"),
        (None, None),
        (float("nan"), None),
        ("  ", None),
        (True, None),
        ([1, 2], "1, 2"),
        (["$3$", " 5 "], "3, 5"),  # OlympiadBench's final_answer: math delimiters dropped per element
        (["$\\frac{1}{2}$"], "\\frac{1}{2}"),
        (["\\(x\\)", "$a$ and $b$"], "x, $a$ and $b$"),
        ([1, None], None),
        ([[1], 2], None),
    ],
)
def test_answer_text(value, text):
    assert answer_text(value) == text


def test_question_text_reads_chat_prompts_and_unwraps_the_template():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PAPER_PROMPT.format("P?")}]
    assert question_text(messages) == "P?"
    assert question_text(PAPER_PROMPT.format(" spaced ")) == " spaced "  # kept verbatim
    assert question_text("Plain?") == "Plain?"
    assert question_text(PAPER_PROMPT.format("  ")) is None
    assert question_text(7) is None


def test_foreign_script_share_ignores_latex_and_greek():
    assert foreign_script_share("Let $\\alpha\\beta$ be π and ℝ; café.") == 0.0
    assert foreign_script_share("求 $x$") == pytest.approx(1 / 2)
    assert foreign_script_share("\\frac\\sqrt\\left\\right 求") == 1.0  # command names are not letters


# --- answers as the Hub stores them ---------------------------------------------------------------------------


def hub_shaped_sources(tmp: Path) -> dict[str, Path]:
    """One file per preset with its Hub copy's column names and answer types (no network)."""
    aime24 = write_jsonl(  # HuggingFaceH4/aime_2024: id, problem, solution, answer (text), url, year
        tmp / "aime_2024.jsonl",
        [
            {"id": 60, "problem": "Find $m+n$.", "solution": "...", "answer": "033", "url": "u", "year": 2024},
            {"id": 61, "problem": "Find $k$.", "solution": "...", "answer": "204", "url": "u", "year": 2024},
        ],
    )
    aime25 = write_jsonl(tmp / "aime25.jsonl", [{"problem": "Find $p$.", "answer": "070", "id": "0"}])  # math-ai/aime25
    amc23 = tmp / "amc23.parquet"  # math-ai/amc23: answers as floats
    pq.write_table(
        pa.table({"id": [0, 1], "question": ["How many $a$?", "What is $b$?"], "answer": [27.0, 0.5]}), amc23
    )
    minerva = tmp / "minervamath.parquet"  # math-ai/minervamath: question, answer (text)
    pq.write_table(pa.table({"question": ["Mass of $X$ in kg?"], "answer": ["3.5"]}), minerva)
    olympiad = tmp / "olympiadbench.parquet"  # math-ai/olympiadbench: final_answer a list of $...$ strings
    pq.write_table(
        pa.Table.from_pylist(
            [
                {"id": 1, "question": "Find all $n$.", "final_answer": ["$1$", "$2$"], "is_multiple_answer": True},
                {"id": 2, "question": "Find $x$.", "final_answer": ["$\\frac{1}{2}$"], "is_multiple_answer": False},
            ]
        ),
        olympiad,
    )
    return {"aime24": aime24, "aime25": aime25, "amc23": amc23, "minerva_math": minerva, "olympiadbench": olympiad}


def test_hub_shaped_answers_are_written_as_the_scorers_expect_and_the_originals_kept(tmp_path):
    sources = hub_shaped_sources(tmp_path)
    result = run(*(f"{name}={path}" for name, path in sources.items()), "--out", str(tmp_path / "data"))
    assert result.exit_code == 0, result.output
    truths = {
        name: [(r["reward_model"]["ground_truth"], r["extra_info"]["raw_answer"]) for r in rows_of(path)]
        for name, path in (
            ("aime24", tmp_path / "data" / "aime-2024.parquet"),
            ("aime25", tmp_path / "data" / "aime-2025.parquet"),
            ("amc23", tmp_path / "data" / "amc-2023.parquet"),
            ("minerva_math", tmp_path / "data" / "minerva-math.parquet"),
            ("olympiadbench", tmp_path / "data" / "olympiadbench.parquet"),
        )
    }
    assert truths == {
        "aime24": [("33", "033"), ("204", None)],  # AIME answers are integers 0-999
        "aime25": [("70", "070")],
        "amc23": [("27", None), ("0.5", None)],  # floats read as the numbers they are
        "minerva_math": [("3.5", None)],  # no integer rule outside the integer-answer sets
        "olympiadbench": [("1, 2", '["$1$", "$2$"]'), ("\\frac{1}{2}", '["$\\\\frac{1}{2}$"]')],
    }
    line = " ".join(result.stdout.split())
    assert "answers normalized: 1 (extra_info.raw_answer)" in line  # aime24's, among others
    # the right answers now score right with each benchmark's scorer (before: 33 vs 033 and 1, 2 vs $1$, $2$ were wrong)
    from rpg_cli.rewards import compute_score

    for path in (tmp_path / "data").glob("*.parquet"):
        for row in rows_of(path):
            truth = row["reward_model"]["ground_truth"]
            assert compute_score(row["data_source"], f"So.\nAnswer: {truth}", truth)["acc"] is True, (path, truth)
    assert compute_score("aime24", "Answer: 33", "33")["acc"] and compute_score("amc_23", "Answer: 27", "27")["acc"]
    assert compute_score("olympiadbench", "Answer: 2, 1", "1, 2")["acc"] is True
    assert compute_score("olympiadbench", "Answer: 1", "1, 2")["acc"] is False


def test_prepared_table7_benchmarks_evaluate_with_their_scorers_end_to_end(tmp_path):
    """`rpg prepare-data minerva_math olympiadbench` (local copies), then `rpg eval`'s pipeline with a stand-in
    generator answering right, and one answering wrong: each benchmark scored by math-verify, as the table says."""
    from rpg_cli.evaluation.generation import Response
    from rpg_cli.evaluation.options import EvalOptions
    from rpg_cli.evaluation.pipeline import run_eval
    from rpg_cli.evaluation.plan import plan_eval
    from rpg_cli.store import open_store

    sources = hub_shaped_sources(tmp_path)
    args = [f"{name}={sources[name]}" for name in ("minerva_math", "olympiadbench")]
    assert run(*args, "--out", str(tmp_path / "data")).exit_code == 0
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"")
    # right answers as a model writes them: with a unit, the set in another order, 0.5 for 1/2
    right = {"Mass of $X$ in kg?": "3.5 kg", "Find all $n$.": "2, 1", "Find $x$.": "0.5"}

    class Answering:
        def __init__(self, wrong: bool):
            self.wrong = wrong

        def generate(self, problems, seeds, sampling):
            def text(problem):
                raw = problem.messages[0]["content"]
                answer = next(a for q, a in right.items() if q in raw)
                return f"Thinking.\nAnswer: {'9' if self.wrong else answer}"

            return [[Response(text(p), 5)] * sampling.k for p in problems]

        def close(self):
            pass

    for wrong, expected in ((False, 1.0), (True, 0.0)):
        options = EvalOptions(
            ref=str(model),
            benchmarks=("minerva_math", "olympiadbench"),
            k=2,
            data_dir=str(tmp_path / "data"),
            db=f"sqlite:///{tmp_path / ('wrong' if wrong else 'right')}.db",
            runs_dir=str(tmp_path / "runs" / str(wrong)),
            engine="hf",
        )
        store = open_store(options.db)
        try:
            results = run_eval(plan_eval(options), store, make_generator=lambda path, engine, w=wrong: Answering(w))
        finally:
            store.close()
        assert {(r.benchmark, r.scorer, r.values["mean@k"]) for r in results} == {
            ("minerva_math", "math_verify", expected),
            ("olympiadbench", "math_verify", expected),
        }
