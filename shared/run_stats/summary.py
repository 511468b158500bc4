"""A finished rollout summed up in a few numbers, taken from its trajectory where it is in memory.

The rollout stage keeps the summary on the job record (`rollout_summary`), so the job's end adds it
to the run page's aggregates without reading the trajectory back from the results store.
"""

from __future__ import annotations

from typing import Any

from shared.trajectory import turn_versions


def rollout_summary(output: dict[str, Any]) -> dict[str, Any] | None:
    """Tokens, generated tokens, LLM seconds, the model and its versions, the sandbox's origin; None
    for an output that is not a sampled trajectory (a kind without turns, a given output)."""
    if not isinstance(output.get("turns"), list) or output.get("given"):
        return None
    records = [output, *(s for s in output.get("segments") or [] if isinstance(s, dict))]
    model, versions = "", set()
    tokens = generated = 0
    llm_s = 0.0
    for record in records:
        tokens += len(record.get("token_ids") or [])
        generated += int((record.get("counts") or {}).get("generated_tokens") or 0)
        llm_s += float((record.get("timings") or {}).get("llm_s") or 0.0)
        served, seen = turn_versions(record)
        model, versions = model or served, versions | seen
    return {
        "tokens": tokens,
        "generated": generated,
        "llm_s": llm_s,
        "model": model,
        "versions": sorted(v or "" for v in versions),
        "sandbox": output.get("sandbox"),
    }
