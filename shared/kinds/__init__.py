"""The built-in task kinds' specs (the light halves): importing this package registers them all.

A spec says what a task holds and how it is checked (fields, published formats, tools); it is
what the API and the CLI load. Each names its stage code in workers/kinds/, which only workers
import (shared/tasks/registry.py). Modules here import nothing from workers/.
"""

from shared.kinds import code, demo, math, stem, swe

__all__ = ["code", "demo", "math", "stem", "swe"]
