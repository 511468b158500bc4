"""Live stacks for observability tests, started the same way as the pipeline tests'; a headless browser."""

from tests.observability.browser import browser  # noqa: F401
from tests.pipeline.conftest import make_stack, trace_dir  # noqa: F401
