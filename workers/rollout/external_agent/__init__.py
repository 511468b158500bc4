"""An external agent's rollout: an OpenAI-compatible endpoint per job, recording a token-exact trajectory."""
