"""file_facts: what the dry run read from a data file, kept across processes while the file is unchanged."""

from __future__ import annotations

import json
import os

import pytest

from rpg_cli import file_facts, inputs
from rpg_cli.datasets import VERL_SCHEMA, verl_row


def counted(kind: str):
    """A remembered reader that counts its reads, and that list of reads."""
    calls: list[str] = []

    @file_facts.remembered(kind, encode=list, decode=lambda v: (str(v[0]), int(v[1])))
    def read(path: str, mtime_ns: int, size: int):
        calls.append(path)
        return None if path.endswith("none") else (path, size)

    return read, calls


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(file_facts.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache" / file_facts.FILE_NAME


def test_a_fact_is_read_once_across_processes_and_again_when_the_file_changes(cache):
    read, calls = counted("k")
    assert read("/a", 1, 10) == ("/a", 10)
    fresh, fresh_calls = counted("k")  # another process: no in-memory cache, the file's entry
    assert fresh("/a", 1, 10) == ("/a", 10) and fresh_calls == []
    assert fresh("/a", 2, 10) == ("/a", 10) and fresh_calls == ["/a"]  # written again: mtime moved
    other_kind, other_calls = counted("other")
    other_kind("/a", 2, 10)
    assert other_calls == ["/a"]  # one kind's fact is not another's
    assert set(json.loads(cache.read_text())) == {"k:/a", "other:/a"}


def test_none_is_not_kept(cache):
    read, _ = counted("k")
    assert read("/none", 1, 1) is None
    assert not cache.exists()


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"k:/a": [1, 10, "not a pair"]}'])
def test_a_broken_cache_means_reading_the_file(cache, content):
    cache.parent.mkdir()
    cache.write_text(content)
    read, calls = counted("k")
    assert read("/a", 1, 10) == ("/a", 10) and calls == ["/a"]
    assert json.loads(cache.read_text())["k:/a"] == [1, 10, ["/a", 10]]  # and the entry is written over it


def test_an_unwritable_cache_is_no_error(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(file_facts.CACHE_ENV, str(blocker / "sub"))  # a directory under a file: never creatable
    read, calls = counted("k")
    assert read("/a", 1, 10) == ("/a", 10)
    assert list(tmp_path.iterdir()) == [blocker]


def test_the_cache_is_bounded(cache, monkeypatch):
    monkeypatch.setattr(file_facts, "MAX_ENTRIES", 3)
    read, _ = counted("k")
    for i in range(5):
        read(f"/f{i}", 1, 1)
    assert list(json.loads(cache.read_text())) == ["k:/f2", "k:/f3", "k:/f4"]  # the oldest dropped


def test_the_dry_runs_readers_reuse_what_another_process_read(cache, tmp_path, monkeypatch):
    """The data file's footer and problem count, read in one process, come from the cache in the next
    (pyarrow not asked), and a file written again is read again."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "val.parquet"
    rows = [verl_row(f"What is {i} + 1?", str(i + 1), "toy", i) for i in range(3)]
    pq.write_table(pa.Table.from_pylist(rows + rows[:1], schema=VERL_SCHEMA), path)
    first = (inputs.parquet_schema(path), inputs.count_problems(path))
    assert first[1] == inputs.ProblemCount(rows=4, problems=3)
    inputs._parquet_schema.cache_clear()
    inputs._count_problems.cache_clear()

    def no_pyarrow(*args, **kwargs):
        raise AssertionError("pyarrow asked again")

    monkeypatch.setattr(pq, "read_metadata", no_pyarrow)
    monkeypatch.setattr(pq, "ParquetFile", no_pyarrow)
    assert (inputs.parquet_schema(path), inputs.count_problems(path)) == first
    os.utime(path, ns=(1, 1))
    assert inputs.count_problems(path) is None  # read again (and the reader, stubbed, fails: not counted)
