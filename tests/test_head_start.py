"""Starting rpg's local Ray head on a busy machine: Ray gives its raylet a fixed 30 s to register, and a
`ray start` that runs out of it is tried once more; any other failure, or a second timeout, is one line."""

from __future__ import annotations

import sys

import pytest

pytest.importorskip("psutil")

from rpg_cli.orchestration import head as head_module  # noqa: E402
from rpg_cli.orchestration.head import ClusterError, local_head  # noqa: E402

RAY_TIMEOUT = (
    "Exception: The current node timed out during startup. This could happen because some of the raylet "
    "failed to startup or the GCS has become overloaded."
)


def fake_ray_start(monkeypatch, outcomes: list[str]) -> list[int]:
    """`ray start` as a process that prints each outcome in turn ("ok" exits 0, else the line and exit 1);
    returns the list of the starts made (their numbers)."""
    starts: list[int] = []

    def command(temp_dir):
        outcome = outcomes[len(starts)]
        starts.append(len(starts) + 1)
        code = "" if outcome == "ok" else f"print({outcome!r}); raise SystemExit(1)"
        return [sys.executable, "-c", code], 1, 2

    monkeypatch.setattr(head_module, "ray_start_command", command)
    monkeypatch.setattr(head_module, "_dashboard_alive", lambda head: True)
    return starts


def test_a_start_that_runs_out_of_rays_startup_wait_is_tried_once_more(tmp_path, monkeypatch):
    starts = fake_ray_start(monkeypatch, [RAY_TIMEOUT, "ok"])
    head = local_head(tmp_path / "runs", num_cpus=1)
    assert head is not None and starts == [1, 2]
    assert (tmp_path / "runs" / "ray" / "head.json").is_file()


def test_a_second_timeout_or_another_failure_is_one_line(tmp_path, monkeypatch):
    starts = fake_ray_start(monkeypatch, [RAY_TIMEOUT, RAY_TIMEOUT, "ok"])
    with pytest.raises(ClusterError, match="timed out during startup"):
        local_head(tmp_path / "a", num_cpus=1)
    assert starts == [1, 2]  # not a third
    starts = fake_ray_start(monkeypatch, ["ValueError: bad --num-cpus", "ok"])
    with pytest.raises(ClusterError, match="bad --num-cpus"):
        local_head(tmp_path / "b", num_cpus=1)
    assert starts == [1]  # not a startup timeout: not tried again
    assert not (tmp_path / "b" / "ray" / "head.json").exists()
