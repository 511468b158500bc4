"""Entry point of the `rollouts` command: a click group; each area adds its commands."""

from __future__ import annotations

import click


@click.group()
def main() -> None:
    """Rollout-as-a-service: run the stack, submit jobs, watch them."""


def _register_commands() -> None:
    """Each area's commands live in their own module; add yours here."""
    from cli import backends, batches, dashboard, jobs, service, validate

    for command in (service.up, service.api, service.worker, service.run, jobs.submit, jobs.status):
        main.add_command(command)
    main.add_command(backends.register)
    main.add_command(batches.batch)
    main.add_command(batches.export)
    main.add_command(dashboard.dashboard)
    main.add_command(validate.validate)


_register_commands()
