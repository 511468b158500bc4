"""Entry point of the `rollouts` command: a click group; each area adds its commands."""

from __future__ import annotations

import click

from cli import failures


class ExplainedGroup(click.Group):
    """Failures outside the command (API down, bad token, refused input) as one line and an exit code."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            failure = failures.describe(exc)
            if failure is None or (ctx.obj or {}).get("verbose"):
                raise
            click.echo(f"rollouts: {failure.message}", err=True)
            ctx.exit(failure.exit_code)


@click.group(cls=ExplainedGroup)
@click.option("--verbose", "-v", is_flag=True, help="On a failure, show the whole traceback.")
@click.pass_context
def main(ctx: click.Context, verbose: bool) -> None:
    """Rollout-as-a-service: run the stack, submit jobs, watch them.

    Exit codes: 0 done, 1 the command failed, 2 usage, 3 the API cannot be reached, 4 the token is
    missing or lacks the scope, 5 the API refused the input, 6 the API failed, 7 a DAPO batch
    could not fill (its prompts ran out before the target).
    """
    ctx.obj = {"verbose": verbose}


def _register_commands() -> None:
    """Each area's commands live in their own module; add yours here."""
    from cli import backends, batches, dashboard, jobs, service, validate, weights

    for command in (service.up, service.api, service.worker, service.run, jobs.submit, jobs.status):
        main.add_command(command)
    main.add_command(backends.register)
    main.add_command(batches.batch)
    main.add_command(batches.export)
    main.add_command(dashboard.dashboard)
    main.add_command(validate.validate)
    main.add_command(weights.weights)


_register_commands()
