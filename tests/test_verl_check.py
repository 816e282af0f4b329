"""verl's pre-submission check (backends/verl/diagnose.py): verl's config composed once per distinct configuration
with the same verdicts as a check of every run, a time per stage whose message names the stage, and
`rpg sweep SPEC --dry-run --check`, which runs it without submitting and prints its verdicts."""

from __future__ import annotations

import copy
import re
import shlex
from pathlib import Path

import pytest
import yaml
from run_inputs import write_inputs
from test_verl_block import BASE  # a verl cell on tiny shapes: 1 GPU, 8 + 16 tokens, a local model directory
from typer.testing import CliRunner

from rpg_cli.backends.verl import diagnose, launch
from rpg_cli.cli import app
from rpg_cli.orchestration.plan import plan_sweep
from rpg_cli.spec import load_sweep

REPO = Path(__file__).resolve().parents[1]
ACTOR = "actor_rollout_ref.actor"
REJECTED = f"{ACTOR}.loss_agg_mode=bogus"  # verl's ActorConfig.__post_init__ refuses it


def grid_file(root: Path) -> Path:
    """2 learning rates x 2 seeds, and one cell whose `verl` block sets what verl refuses: 5 runs, 2 configurations."""
    path = root / "vc.yaml"
    rejected = {"lr": 1e-3, "seed": 7, "verl": {"overrides": [REJECTED]}}
    sweep = {"name": "vc", "base": copy.deepcopy(BASE), "grid": {"lr": [1e-3, 2e-3], "seed": [0, 1]}}
    path.write_text(yaml.safe_dump({**sweep, "include": [rejected]}))
    return path


def fake_python(root: Path, *lines: str, then: str = "exit 0") -> str:
    """An interpreter that answers as the probe would: its stdin read, `lines` printed, then `then`."""
    script = root / "python"
    said = "".join(f"echo {shlex.quote(line)}\n" for line in lines)
    script.write_text(f"#!/bin/sh\ncat >/dev/null\n{said}{then}\n")
    script.chmod(0o755)
    return str(script)


P = diagnose.PREFIX
RUNS = {"a": ["x=1"], "b": ["x=2"], "c": ["x=3"]}


# ------------------------------------------------------------------ verdicts, read back from the probe's lines


def test_verdicts_name_their_runs_and_a_submission_refuses_with_the_first_in_one_line(tmp_path):
    python = fake_python(
        tmp_path, P + "imported", P + "groups:[[0, 2], [1]]", P + "verdict:0:", P + "verdict:1:Invalid: bogus", P + "ok"
    )
    found = diagnose.check_configs(launch.PLUGIN_MODULE, RUNS, python=python)
    assert found.verdicts == (diagnose.Verdict(("a", "c")), diagnose.Verdict(("b",), "Invalid: bogus"))
    assert found.refused == (diagnose.Verdict(("b",), "Invalid: bogus"),)
    with pytest.raises(RuntimeError) as refused:
        diagnose.check_plugin_loads(launch.PLUGIN_MODULE, python=python, configs=RUNS)
    assert str(refused.value) == "b: verl's config refuses its overrides: Invalid: bogus"


def test_a_refused_configuration_of_several_runs_says_how_many_and_how_many_others_were_refused(tmp_path):
    python = fake_python(
        tmp_path, P + "imported", P + "groups:[[0, 2], [1]]", P + "verdict:0:no", P + "verdict:1:nor this", P + "ok"
    )
    with pytest.raises(RuntimeError) as refused:
        diagnose.check_plugin_loads(launch.PLUGIN_MODULE, python=python, configs=RUNS)
    assert str(refused.value) == (
        "a and 1 other run(s) like it: verl's config refuses its overrides: no; 1 other configuration(s) refused "
        "too (`rpg sweep SPEC --dry-run --check` lists them)"
    )


def test_a_probe_that_answers_for_fewer_configurations_than_it_found_is_not_taken_as_ok(tmp_path):
    python = fake_python(tmp_path, P + "imported", P + "groups:[[0], [1, 2]]", P + "verdict:0:", P + "ok")
    with pytest.raises(RuntimeError) as short:
        diagnose.check_configs(launch.PLUGIN_MODULE, RUNS, python=python)
    assert str(short.value) == "verl's config check answered for 1 of 2 configuration(s)"


# ------------------------------------------------------------------ each stage's time, and a message that names it


def test_a_hung_import_is_said_to_be_the_import(tmp_path):
    python = fake_python(tmp_path, then="exec sleep 30")
    with pytest.raises(RuntimeError) as late:
        diagnose.check_plugin_loads(launch.PLUGIN_MODULE, python=python, timeout_s=1, configs=RUNS)
    assert str(late.value) == "importing verl with rpg's plugin did not finish in 1 s"


def test_reading_the_runs_overrides_has_a_time_that_grows_with_the_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(diagnose, "GROUP_S", 0.5)
    monkeypatch.setattr(diagnose, "GROUP_S_PER_RUN", 0.5)
    python = fake_python(tmp_path, P + "imported", then="exec sleep 30")
    with pytest.raises(RuntimeError) as late:
        diagnose.check_configs(launch.PLUGIN_MODULE, RUNS, python=python)
    assert str(late.value) == "reading the overrides of 3 runs did not finish in 2 s"


def test_composing_has_a_time_per_distinct_configuration_and_says_how_far_it_got(tmp_path, monkeypatch):
    monkeypatch.setattr(diagnose, "CHECK_S", 0.5)
    python = fake_python(tmp_path, P + "imported", P + "groups:[[0], [1, 2]]", P + "verdict:0:", then="exec sleep 30")
    with pytest.raises(RuntimeError) as late:
        diagnose.check_configs(launch.PLUGIN_MODULE, RUNS, python=python)
    assert re.fullmatch(
        r"verl's config check did not finish: 1 of 2 distinct configuration\(s\) \(3 runs\) checked in [12] s "
        r"\(allowed: 0.5 s each\)",
        str(late.value),
    ), late.value


def test_a_probe_that_fails_to_import_verl_says_why(tmp_path):
    python = fake_python(tmp_path, then="echo 'ModuleNotFoundError: No module named verl' >&2; exit 1")
    with pytest.raises(RuntimeError, match=r"plugin does not load: ModuleNotFoundError: No module named verl"):
        diagnose.check_configs(launch.PLUGIN_MODULE, RUNS, python=python)


# ------------------------------------------------------------------ rpg sweep --dry-run --check


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """A working directory holding the grid's data and model directory."""
    monkeypatch.chdir(tmp_path)
    write_inputs(tmp_path, grid_file(tmp_path))
    return tmp_path


def names(root: Path) -> list[str]:
    return [p.name for p in plan_sweep(load_sweep(grid_file(root)), root / "runs")]


def test_check_goes_with_dry_run_only(workdir):
    result = CliRunner().invoke(app, ["sweep", str(grid_file(workdir)), "--check"])
    assert result.exit_code == 2 and "--check" in result.output and "goes with --dry-run" in result.output


def test_dry_run_check_prints_each_configurations_verdict_and_exits_2_on_a_refusal(workdir, monkeypatch):
    """The real CLI over a fake probe: one summary line, the accepted runs, one line per refused configuration."""
    python = fake_python(
        workdir,
        P + "imported",
        P + "groups:[[0, 1, 2, 3], [4]]",
        P + "verdict:0:",
        P + "verdict:1:Invalid loss_agg_mode: bogus",
        P + "ok",
    )
    monkeypatch.setattr(
        launch,
        "check_configs",
        lambda runs: diagnose.check_configs(
            launch.PLUGIN_MODULE, {n: launch.overrides_of(argv) for n, argv in runs.items()}, python=python
        ),
    )
    result = CliRunner().invoke(app, ["sweep", str(grid_file(workdir)), "--dry-run", "--check"])
    run = names(workdir)
    assert result.exit_code == 2, result.output
    assert result.stdout.splitlines()[-3:] == [
        f"verl check: 5 run(s) in 2 distinct configuration(s), each checked once ({diagnose.ALIKE_TEXT})",
        "verl check: ok: 4 run(s) (1 configuration(s))",
        f"verl check: refused: 1 run(s) ({run[4]}): Invalid loss_agg_mode: bogus",
    ]
    assert re.search(r"rpg sweep: the verl check took \d+\.\d s \(\d+\.\d s importing\)", result.stderr)


def test_dry_run_check_as_json_gives_each_run_its_verdict(workdir, monkeypatch):
    python = fake_python(
        workdir, P + "imported", P + "groups:[[0, 1, 2, 3], [4]]", P + "verdict:0:", P + "verdict:1:no", P + "ok"
    )
    monkeypatch.setattr(
        launch,
        "check_configs",
        lambda runs: diagnose.check_configs(
            launch.PLUGIN_MODULE, {n: launch.overrides_of(argv) for n, argv in runs.items()}, python=python
        ),
    )
    result = CliRunner().invoke(app, ["sweep", str(grid_file(workdir)), "--dry-run", "--check", "--format", "json"])
    import json

    assert result.exit_code == 2, result.output
    assert [row["check"] for row in json.loads(result.stdout)] == ["ok", "ok", "ok", "ok", "no"]


def test_a_check_that_cannot_run_is_one_line_and_exit_2(workdir, monkeypatch):
    def hung(runs):
        raise RuntimeError("importing verl with rpg's plugin did not finish in 120 s")

    monkeypatch.setattr(launch, "check_configs", hung)
    result = CliRunner().invoke(app, ["sweep", str(grid_file(workdir)), "--dry-run", "--check"])
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == "rpg sweep: importing verl with rpg's plugin did not finish in 120 s"


def test_dry_run_check_of_a_backend_without_a_check_says_so(workdir):
    path = workdir / "local.yaml"
    path.write_text(yaml.safe_dump({"name": "lc", "base": copy.deepcopy(BASE), "grid": {"seed": [0, 1]}}))
    result = CliRunner().invoke(app, ["sweep", str(path), "--dry-run", "--check", "--backend", "local"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1] == "local check: none (backend local has no pre-submission check)"


# ------------------------------------------------------------------ against verl itself


@pytest.mark.slow
def test_dry_run_check_with_verl_itself(workdir):
    """verl composes the grid's two configurations: the four runs that differ in seeds and learning rates share
    one, the cell whose `verl` block sets a loss_agg_mode verl does not know is refused with verl's reason."""
    pytest.importorskip("verl", reason="the verl extra is not installed")
    result = CliRunner().invoke(app, ["sweep", str(grid_file(workdir)), "--dry-run", "--check"])
    run = names(workdir)
    assert result.exit_code == 2, result.output
    lines = result.stdout.splitlines()[-3:]
    assert lines[:2] == [
        f"verl check: 5 run(s) in 2 distinct configuration(s), each checked once ({diagnose.ALIKE_TEXT})",
        "verl check: ok: 4 run(s) (1 configuration(s))",
    ]
    assert (
        lines[2].startswith(f"verl check: refused: 1 run(s) ({run[4]}): ")
        and "Invalid loss_agg_mode: bogus" in lines[2]
    )


@pytest.mark.slow
def test_grouped_verdicts_are_every_runs_own_on_the_paper_grids_and_a_rejected_override(tmp_path):
    """Every method of the Qwen3-4B paper and baselines grids (one cell per algorithm and KL: 14; their contexts
    only change batch budgets, each its own configuration anyway) at two seeds, and one of them with an override
    verl refuses: checked once per configuration (15), each run's verdict is the one it gets checked on its own,
    and only a cell's two seeds share one."""
    pytest.importorskip("verl", reason="the verl extra is not installed")
    cells = {}
    for grid in ("paper-qwen3-4b", "baselines-qwen3-4b"):
        sweep = yaml.safe_load((REPO / "experiments" / f"{grid}.yaml").read_text())
        path = tmp_path / f"{grid}.yaml"
        path.write_text(yaml.safe_dump({**sweep, "seeds": [0, 1]}))
        for p in plan_sweep(load_sweep(path), tmp_path / "runs"):
            cells.setdefault((p.spec["algorithm"], p.spec["kl"]), {})[p.spec["seed"]] = p
    plans = [p for seeds in cells.values() for p in seeds.values()]
    configs = {p.name: launch.overrides_of(p.entrypoint) for p in plans}
    for p in plans[:2]:  # the first cell's two seeds, with what verl refuses
        configs[f"rejected-{p.name}"] = [*configs[p.name], REJECTED]
    grouped = diagnose.check_configs(launch.PLUGIN_MODULE, configs)
    assert len(configs) == 2 * len(grouped.verdicts) == 30
    # each run the grouped check did not compose (all but the first of each configuration), checked on its own
    others = {name: configs[name] for v in grouped.verdicts for name in v.runs[1:]}
    each = diagnose.check_configs(launch.PLUGIN_MODULE, others, alike=())
    assert len(each.verdicts) == len(others) == 15

    def by_run(found: diagnose.ConfigCheck) -> dict[str, str | None]:
        return {name: v.refusal for v in found.verdicts for name in v.runs}

    assert by_run(each) == {name: refusal for name, refusal in by_run(grouped).items() if name in others}
    refused = [v.runs for v in grouped.refused]
    assert refused == [tuple(f"rejected-{p.name}" for p in plans[:2])]
    assert "Invalid loss_agg_mode: bogus" in grouped.refused[0].refusal
    spec_of = {p.name: {k: v for k, v in p.spec.items() if k != "seed"} for p in plans}
    for v in grouped.verdicts:  # a cell's two seeds, nothing else
        first, second = (name.removeprefix("rejected-") for name in v.runs)
        assert spec_of[first] == spec_of[second] and first != second
