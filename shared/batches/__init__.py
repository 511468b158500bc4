"""Batches: GRPO groups, DAPO dynamic sampling with asynchronous replenishment, streamed results."""
