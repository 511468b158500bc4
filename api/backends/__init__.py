"""LLM backends: register, list, heartbeat, drain, remove; the router over shared/backend_pool/."""
