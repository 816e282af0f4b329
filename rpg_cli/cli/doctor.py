"""`rpg doctor`: this node, the shared directories, a sweep's inputs and the Ray cluster, checked for the runs."""

from __future__ import annotations

import typer

from rpg_cli.backends.registry import allowed, backend_names
from rpg_cli.cli.common import fail, rpg_command, runs_dir_option


@rpg_command("doctor")
def doctor_command(
    spec: str = typer.Argument(
        None, metavar="SPEC", help="A sweep YAML: check its inputs, and this node for the backends its runs use."
    ),
    backend: str = typer.Option(
        None,
        "--backend",
        metavar="|".join(backend_names()),
        help="Check SPEC's runs as on this backend (as rpg sweep --backend).",
    ),
    as_json: bool = typer.Option(False, "--json", metavar="", help="One JSON object per check instead of text."),
    address: str = typer.Option(
        None,
        "--address",
        metavar="ADDRESS",
        help="Ray cluster to check (dashboard URL or head address); default: $RAY_ADDRESS, else none.",
    ),
    runs_dir: str = runs_dir_option(),
) -> None:
    """Check what runs need of this node, of the directories every node shares, and of the Ray cluster.

    One line per check: ok, missing (a run cannot start without it) or warn (it may work: a version other than
    the one verl 0.9.1 is paired with), its name, what was found and, when it is not ok, the fix. The node:
    Python, glibc, the NVIDIA driver, torch and the GPUs it sees, NCCL, verl and rpg's plugin, vLLM,
    flash-attn, transformers and Ray. The data directory, the runs directory (--runs-dir) and the Hugging Face
    cache must be writable at the same absolute path on every node. Exit 1 when something a run needs is
    missing, else 0.

    Without SPEC the node is checked for verl runs. With SPEC: its data files and models too, and the node only
    for the backends its runs use (a sweep of local runs needs no GPU). With --address (or $RAY_ADDRESS): the
    cluster answers with its token, and for verl runs a Ray job checks every GPU node as `rpg sweep` does
    before it submits (each verl job checks its nodes again before verl starts).

    Examples:

      # this node, after installing (run it on every GPU node)
      rpg doctor

      # a sweep's data and models, and this node for its runs
      rpg doctor experiments/paper-qwen3-4b.yaml

      # and every GPU node of the cluster, through its head
      rpg doctor experiments/paper-qwen3-4b.yaml --address http://head:8265

      # one JSON object per line
      rpg doctor --json
    """
    if backend is not None and backend not in backend_names():
        fail("doctor", ValueError(f"unknown --backend {backend!r}; allowed: {allowed()}"))
    from pathlib import Path

    from rpg_cli.orchestration.doctor import doctor, failed
    from rpg_cli.spec import SpecError

    try:
        checks = doctor(spec, Path(runs_dir), address, backend)
    except SpecError as e:
        fail("doctor", e)
    if as_json:
        import json

        for check in checks:
            typer.echo(json.dumps(check.as_dict()))
    else:
        for check in checks:
            typer.echo(check.line())
    if failed(checks):
        raise typer.Exit(1)
