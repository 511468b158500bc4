"""The built-in task kinds, one module each; importing this package registers them all.

A kind sits above the stage libraries it calls (workers/init, rollout, eval) and is found by
name through the registry in shared/tasks. Adding a kind: write one module here (or anywhere,
named in ROLLOUTS_TASK_MODULES), decorate its class with @register, and import it below.
"""

from workers.kinds import code, demo, math, stem, swe

__all__ = ["code", "demo", "math", "stem", "swe"]
