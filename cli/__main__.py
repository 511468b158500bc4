"""`python -m cli`: the same as the `rollouts` command."""

from cli.main import main

main()
