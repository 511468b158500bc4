"""The built-in task kinds' stage code, one module each, over their specs in shared/kinds/.

A spec names its stage class here ("workers.kinds.math:MathKind"); workers import it on first
use (shared/tasks/registry.py `get_kind`), the API never does. Adding a kind: its spec (a
TaskSpec, decorated with @register) in a module the API may import, its stage class (the spec
and TaskKind, or AgentTask) in workers; docs/PIPELINE.md, "Adding a task kind".
"""
