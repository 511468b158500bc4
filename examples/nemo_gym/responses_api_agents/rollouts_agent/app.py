"""NeMo Gym's entrypoint for the rollouts agent (the agent lives in the client: rollouts_client.trainers.nemo_gym_agent).

NeMo Gym starts it as `python app.py` in this directory with its config in the environment (`gym env start`).
"""

from rollouts_client.trainers.nemo_gym_agent import RolloutsAgent

if __name__ == "__main__":
    RolloutsAgent.run_webserver()
