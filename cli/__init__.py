"""The `rollouts` command line."""
