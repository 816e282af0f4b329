"""`rpg export`: stored runs to W&B, TensorBoard or MLflow."""

from __future__ import annotations

import typer

from rpg_cli.cli.common import (
    address_option,
    db_option,
    existing_store,
    fail,
    live_runs,
    one_blas_thread,
    reconcile_shown,
    rpg_command,
    runs_dir_option,
    sweep_option,
)

EXPORT_TIMEOUT_S = 30.0  # how long `rpg export` waits for a tracker's server, per request


@rpg_command("export")
def export_command(
    to: str = typer.Option(..., "--to", metavar="wandb|tensorboard|mlflow", help="The tracker to push to."),
    sweep_name: str = sweep_option(),
    db: str = db_option(),
    address: str = address_option(),
    runs_dir: str = runs_dir_option(),
    project: str = typer.Option(
        None, "--project", help="W&B project / MLflow experiment (default: the run's trackers.project, else rpg)."
    ),
    directory: str = typer.Option(
        None,
        "--dir",
        metavar="DIR",
        help="TensorBoard log root (default: runs/tensorboard); W&B writes its files under DIR/wandb/ (default: runs/wandb/).",
    ),
    tracking_uri: str = typer.Option(
        None,
        "--tracking-uri",
        metavar="URI",
        help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///runs/mlflow.db). Credentials go in MLFLOW_TRACKING_USERNAME/PASSWORD or _TOKEN.",
    ),
    entity: str = typer.Option(None, "--entity", help="W&B entity (default: $WANDB_ENTITY, else your default entity)."),
    offline: bool = typer.Option(
        False, "--offline", help="W&B offline: write run files to upload later with `wandb sync`."
    ),
    timeout: float = typer.Option(
        EXPORT_TIMEOUT_S,
        "--timeout",
        metavar="SECONDS",
        help="Seconds to wait for the tracker's server (MLflow, W&B online) per request. It is asked first: one "
        "that does not answer stops the export before anything is written. MLflow then retries nothing "
        "(unless MLFLOW_HTTP_REQUEST_MAX_RETRIES is set).",
    ),
) -> None:
    """Push what the results store holds to W&B, TensorBoard or MLflow, for runs not tracked live.

    Metrics go at their steps, evals at their checkpoints' steps, the spec as config, one line per run
    on stderr as it goes. The tracker's server is asked first: one that does not answer within --timeout
    stops the export before anything is written. Runs are grouped
    by cell (seeds band together) and tagged with the sweep and its varying fields, as live runs are.
    Exporting again adds only what is new: no duplicate runs or steps. Runs that ended while no rpg
    watched them (--detach) are brought up to date from Ray first, their last metrics included.

    Examples:

      # the smoke sweep as TensorBoard event files under runs/tensorboard/
      rpg export --to tensorboard --sweep smoke

      # every run to W&B, offline (upload later with `wandb sync`)
      rpg export --to wandb --offline

      # a team's MLflow server
      rpg export --to mlflow --tracking-uri http://mlflow.internal:5000
    """
    from pathlib import Path

    one_blas_thread()

    from rpg_cli.store import StoreError
    from rpg_cli.trackers import TrackerError
    from rpg_cli.trackers.export import Exported, ExportOptions, export

    if not 0 < timeout < float("inf"):
        fail("export", ValueError(f"--timeout {timeout:g}: give a positive number of seconds, e.g. --timeout 30"))
    options = ExportOptions(
        project=project,
        directory=Path(directory) if directory else None,
        tracking_uri=tracking_uri,
        entity=entity,
        offline=offline,
        timeout=timeout,
    )

    def progress(i: int, n: int, r: Exported) -> None:
        if r.steps:
            typer.echo(
                f"exported {i}/{n}: {r.sweep}/{r.name} ({r.steps} steps, {r.metrics} metrics) -> {r.where}", err=True
            )
        else:
            typer.echo(f"skipped {i}/{n}: {r.sweep}/{r.name} (nothing recorded)", err=True)

    with existing_store("export", db) as store:
        try:
            reconcile_shown("export", store, live_runs(store, sweep_name), address, runs_dir, marked=False)
            done = export(store, to, sweep_name, options, on_run=progress)
        except (TrackerError, StoreError) as e:
            fail("export", e)
    typer.echo(f"exported {sum(r.steps > 0 for r in done)} of {len(done)} run(s) to {to}")
