"""The run page's numbers: aggregates of ended jobs per run, batch and minute, kept in Redis as jobs end.

A job's end adds a few counters to one hash per scope and minute (`record.py`); the API reads a
window of those hashes, never the job records (`view.py`). What a minute's hash holds is `fields.py`;
what a finished rollout contributes is taken from its trajectory once, by the rollout stage (`summary.py`).
"""
