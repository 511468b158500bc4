"""Bridges into trainers: TRL's GRPOTrainer, a verl agent loop and a SkyRL generator backed by the service
(docs/TRAINERS.md).

The trainer modules (`trl_rollout`, `verl_agent_loop`, `skyrl_generator`) import their trainer and are
installed with the client's extras (`pip install "./client[trl]"`, `"./client[verl]"`, `"./client[skyrl]"`);
the modules they share (`rows`, `records`, `waiting`, `settings`) import none, so they are tested without one.
"""
