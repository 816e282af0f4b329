"""`rpg check-loss`: a researcher's own loss, run on small random batches before a GPU is paid for."""

from __future__ import annotations

import typer

from rpg_cli.cli.common import fail, rpg_command


@rpg_command("check-loss")
def check_loss_command(
    target: str = typer.Argument(
        ..., metavar="MODULE:FUNCTION", help="The loss, as a spec's `loss` names it: package.module:function."
    ),
    sets: list[str] = typer.Option(
        None, "--set", metavar="KEY=VALUE", help="One of the spec's loss_settings (VALUE read as YAML). Repeatable."
    ),
) -> None:
    """Check a custom loss (algorithm: custom) the way a run calls it, on small random padded batches.

    The function is imported as a run imports it (its directory on PYTHONPATH, or the current directory) and
    called through rpg's custom-loss path, in float32, float64 and bfloat16, with per-sequence and per-token
    advantages, ragged rows (one of length 1), with and without a reference. One line per check: it returns a
    per-token loss of the batch's shape; its values, gradients and metrics are finite; the gradient reaches
    log_prob at every token with an advantage (a detached loss does not); junk in the padding, or cutting the
    padding off, changes neither the loss nor its gradient; verl's plugin computes the same loss as the local
    backend (skipped where verl is not installed). Exit 0 when every check passes, 1 when one fails, 2 when
    the loss cannot be found or imported.

    Examples:

      # the README's worked example, with its setting
      rpg check-loss examples.my_loss:capped_reinforce --set clip=2.0

      # your own module, from the directory that holds my_losses/
      PYTHONPATH=. rpg check-loss my_losses.reinforce:loss --set clip=0.2
    """
    from rpg_cli.custom_loss import checks

    settings = _settings(sets or [])
    try:
        results = checks(target, settings)
        failed = False
        for result in results:  # each line as its check finishes
            typer.echo(result.line())
            failed = failed or result.failure is not None
    except ValueError as e:  # the target cannot be found, imported or called by rpg's keywords
        fail("check-loss", e)
    if failed:
        raise typer.Exit(1)


def _settings(sets: list[str]) -> dict[str, object]:
    """`--set k=v ...` -> {k: v}, each value a YAML scalar (2 -> int, 0.5 -> float, true -> bool, x -> str)."""
    import yaml

    settings: dict[str, object] = {}
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            fail("check-loss", ValueError(f"--set {item!r} is not KEY=VALUE; e.g. --set clip=0.2"))
        try:
            settings[key.strip()] = yaml.safe_load(value) if value.strip() else ""
        except yaml.YAMLError as e:
            fail("check-loss", ValueError(f"--set {item!r}: the value is not YAML ({' '.join(str(e).split())})"))
    return settings
