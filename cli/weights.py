"""`rollouts weights update|show`: load a checkpoint (a path, or a file sent as bytes) into every backend of a model."""

from __future__ import annotations

import json
from pathlib import Path

import click

from cli.connect import connect, connect_admin
from shared.config import get_settings

_url_option = click.option("--url", default=None, help="API URL (default: ROLLOUTS_API_URL or host:port settings).")


@click.group()
def weights() -> None:
    """Policy weights of the served models."""


@weights.command()
@click.argument("model")
@click.option("--version", "version", required=True, help="The label every token of these weights will carry.")
@click.option(
    "--path",
    "path",
    default=None,
    type=click.Path(path_type=Path),
    help="Checkpoint directory (absolute; the backends and the API must be able to read it).",
)
@click.option(
    "--upload",
    "upload",
    default=None,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Instead of --path: send this safetensors file (every tensor of the model) as bytes; "
    "for backends with no shared disk.",
)
@click.option(
    "--pause-mode",
    type=click.Choice(["wait", "keep", "abort"]),
    default="wait",
    show_default=True,
    help="Running requests during the swap: finish first, freeze and continue, or end.",
)
@click.option("--lora", default=None, help="Load PATH as this LoRA adapter (in place) instead of full weights.")
@click.option("--json", "as_json", is_flag=True, help="Print the API's answer as JSON.")
@_url_option
def update(
    model: str,
    version: str,
    path: Path | None,
    upload: Path | None,
    pause_mode: str,
    lora: str | None,
    as_json: bool,
    url: str | None,
) -> None:
    """Load PATH (or the --upload file) into every backend of MODEL under VERSION; exits 1 when a backend failed."""
    if (path is None) == (upload is None):
        raise click.UsageError("give exactly one of --path and --upload")
    if upload is not None and lora is not None:
        raise click.UsageError("--lora takes a --path (adapters are not uploaded as bytes)")
    with connect_admin(url, get_settings()) as client:
        if upload is not None:
            result = client.upload_weights(model, version, upload.read_bytes(), pause_mode=pause_mode)
        else:
            assert path is not None
            result = client.update_weights(model, version, path=str(path.absolute()), pause_mode=pause_mode, lora=lora)
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        click.echo(
            f"{result['model']}: version {result['version']} (update {result['seq']}) in {result['seconds']:.2f}s"
        )
        for backend in result["backends"]:
            steps = " ".join(f"{name} {seconds * 1000:.0f}ms" for name, seconds in backend["seconds"].items())
            line = f"  {backend['id']} {backend['url']}: {backend['status']}  {steps}"
            if backend["status"] != "updated":
                line += f"\n    {backend['error']}" + (
                    "\n    removed from the pool" if backend["removed_from_pool"] else ""
                )
            click.echo(line)
    if any(backend["status"] != "updated" for backend in result["backends"]):
        raise SystemExit(1)


@weights.command()
@click.argument("model")
@_url_option
def show(model: str, url: str | None) -> None:
    """MODEL's current weight version, its sequence number and checkpoint path."""
    with connect(url) as client:
        current = client.current_weights(model)
    version = current["version"] or "(start-up weights; never updated through the service)"
    click.echo(f"{model}: {version} (update {current['seq']}) {current['path']}")
