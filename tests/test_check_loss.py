"""`rpg check-loss` through the real CLI: a sound loss passes every check line by line (exit 0); a loss that
is non-finite, detached or reads its padding fails the named check in one line (exit 1); a target that
cannot be found or imported is one line on stderr (exit 2)."""

from __future__ import annotations

import importlib.util
import sys
import textwrap

import pytest
from typer.testing import CliRunner

from rpg_cli.cli import app
from rpg_cli.custom_loss import CHECK_CALL, CHECK_FINITE, CHECK_GRADIENT, CHECK_PADDING, CHECK_VERL

pytest.importorskip("torch")

HAS_VERL = importlib.util.find_spec("verl") is not None
VERL_LINE = (
    f"ok  {CHECK_VERL}"
    if HAS_VERL
    else f"skip  {CHECK_VERL}: verl is not installed here (pip install -e '.[verl]' to check it)"
)

LOSSES = textwrap.dedent(
    """
    import torch

    def sound(*, log_prob, old_log_prob, advantages, response_mask, settings, **_):
        w = torch.exp(log_prob.detach() - old_log_prob)
        return -w.clamp(max=settings["clip"]) * advantages * log_prob, {"w_max": w[response_mask].max()}

    def nan_where_negative(*, log_prob, advantages, **_):
        return -torch.sqrt(advantages) * log_prob  # NaN wherever an advantage is negative

    def detached(*, log_prob, advantages, **_):
        return -(advantages * log_prob).detach()

    def half_detached(*, log_prob, advantages, **_):
        return -advantages * torch.where(advantages > 0, log_prob, log_prob.detach())

    def reads_padding(*, log_prob, advantages, **_):
        return -advantages * log_prob.mean(-1, keepdim=True).expand_as(log_prob)  # the mean counts padded tokens

    def wrong_shape(*, log_prob, advantages, **_):
        return -(advantages * log_prob).sum(-1)

    def raises(*, log_prob, settings, **_):
        return -log_prob * settings["missing"]
    """
)


@pytest.fixture
def losses(tmp_path, monkeypatch):
    """A module of losses in the current directory, as a researcher runs check-loss next to their code."""
    (tmp_path / "checked_losses_rpg.py").write_text(LOSSES)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "checked_losses_rpg"
    sys.modules.pop("checked_losses_rpg", None)


def check_loss(*args: str):
    return CliRunner().invoke(app, ["check-loss", *args], env={"COLUMNS": "250"})


def test_a_sound_loss_passes_every_check_line_by_line(losses):
    result = check_loss(f"{losses}:sound", "--set", "clip=2.0")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"ok  {CHECK_CALL}",
        f"ok  {CHECK_FINITE}",
        f"ok  {CHECK_GRADIENT}",
        f"ok  {CHECK_PADDING}",
        VERL_LINE,
    ]


def test_the_worked_example_passes():
    result = check_loss("examples.my_loss:capped_reinforce", "--set", "clip=2.0")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1] == VERL_LINE


@pytest.mark.parametrize(
    ("function", "check", "words"),
    [
        ("nan_where_negative", CHECK_FINITE, "the loss is nan on a float64 batch 4x11"),
        ("detached", CHECK_GRADIENT, "the loss does not depend on log_prob on a float64 batch 4x11"),
        ("half_detached", CHECK_GRADIENT, "tokens with an advantage, on-policy (w = 1), on a float64 batch 4x11"),
        ("reads_padding", CHECK_PADDING, "when the batch is cut to its 8 valid columns, on a float64 batch 4x11"),
    ],
)
def test_a_broken_loss_fails_the_named_check_in_one_line(losses, function, check, words):
    result = check_loss(f"{losses}:{function}")
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    (failed,) = [line for line in lines if line.startswith(f"FAIL  {check}: ")]
    assert words in failed, failed
    assert all(line.startswith("ok  ") for line in lines[: lines.index(failed)]), lines  # the checks before pass
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("function", "words"),
    [
        ("wrong_shape", "returned shape (4,), expected (4, 11): one loss per token"),
        ("raises", "KeyError: 'missing', on a float64 batch 4x11, per-sequence advantages"),
    ],
)
def test_a_loss_that_cannot_run_stops_at_the_first_check(losses, function, words):
    result = check_loss(f"{losses}:{function}")
    assert result.exit_code == 1, result.output
    (line,) = result.stdout.splitlines()
    assert line.startswith(f"FAIL  {CHECK_CALL}: ") and words in line, line


def test_settings_are_yaml_scalars(losses):
    """clip=2 is an int and 2.0 a float, both numbers: the sound loss clamps with either; a string fails it."""
    assert check_loss(f"{losses}:sound", "--set", "clip=2").exit_code == 0
    result = check_loss(f"{losses}:sound", "--set", "clip=two")
    assert result.exit_code == 1 and "TypeError" in result.stdout


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["no_such_module_rpg.losses:loss"], "cannot find module 'no_such_module_rpg.losses' of the loss"),
        (["not-a-target"], "is not package.module:function"),
        (["checked_losses_rpg:absent"], "has no 'absent'; define it, or fix the loss name"),
        (["checked_losses_rpg:sound", "--set", "clip"], "--set 'clip' is not KEY=VALUE"),
    ],
)
def test_a_target_that_cannot_be_loaded_is_one_line_with_exit_2(losses, args, words):
    result = check_loss(*args)
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("rpg check-loss: ") and words in line, line
    assert result.stdout == ""


def test_a_verl_path_that_disagrees_with_the_local_one_fails_the_verl_check(losses, monkeypatch):
    """What the check compares: a verl path that scales the loss, or drops the function's metrics, is caught."""
    from rpg_cli import custom_loss

    real = custom_loss._verl_loss_fn

    def scaled(target, settings):
        run = real(target, settings)
        return lambda batch: (lambda loss, grad, metrics: (1.5 * loss, 1.5 * grad, metrics))(*run(batch))

    def forgetful(target, settings):
        run = real(target, settings)
        return lambda batch: (*run(batch)[:2], {})

    pytest.importorskip("verl")
    for fake, words in [(scaled, "the loss changes"), (forgetful, "metric actor/w_max is missing")]:
        monkeypatch.setattr(custom_loss, "_verl_loss_fn", fake)
        result = check_loss(f"{losses}:sound", "--set", "clip=2.0")
        assert result.exit_code == 1, result.output
        last = result.stdout.splitlines()[-1]
        assert last.startswith(f"FAIL  {CHECK_VERL}: {words}") and "between verl's loss and the local one" in last


def test_without_verl_the_verl_check_is_skipped_in_one_line(losses, monkeypatch):
    from rpg_cli import custom_loss

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        custom_loss.importlib.util, "find_spec", lambda name, *a: None if name == "verl" else find_spec(name, *a)
    )
    result = check_loss(f"{losses}:sound", "--set", "clip=2.0")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1] == (
        f"skip  {CHECK_VERL}: verl is not installed here (pip install -e '.[verl]' to check it)"
    )
