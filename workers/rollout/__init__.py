"""Rollout stage: the agent loop (LLM calls and tool calls), many trajectories per process."""
