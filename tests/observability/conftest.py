"""Live stacks for observability tests, started the same way as the pipeline tests'."""

from tests.pipeline.conftest import make_stack, trace_dir  # noqa: F401
