"""The three worker stages (init, rollout, eval) and the runtime they share."""
