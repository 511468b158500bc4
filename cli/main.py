"""Entry point of the `rollouts` command: a click group; each area adds its commands."""

from __future__ import annotations

import click


@click.group()
def main() -> None:
    """Rollout-as-a-service: run the stack, submit jobs, watch them."""


def _register_commands() -> None:
    """Each area's commands live in their own module; add yours here."""
    from cli import jobs, service

    for command in (service.up, service.api, service.worker, service.run, jobs.submit, jobs.status):
        main.add_command(command)


_register_commands()
