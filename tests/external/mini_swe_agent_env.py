"""mini-swe-agent's environment for a job driven from outside: every command runs in the job's sandbox.

Imported by the unmodified `mini` CLI from the mini-swe-agent environment (scripts/setup.sh test) as
`--environment-class mini_swe_agent_env.JobToolsEnvironment`, so it imports nothing of the
project. A command goes to the job's `POST {base}/tools/bash` (the sandbox's persistent shell,
recorded under the job's `tool_runs`) instead of a local subprocess; the rest -- the observation
dict, the `COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` submission check, the template variables -- is
LocalEnvironment's own.
"""

from __future__ import annotations

from typing import Any

import requests
from minisweagent.environments.local import LocalEnvironment, LocalEnvironmentConfig


class JobToolsEnvironmentConfig(LocalEnvironmentConfig):
    base_url: str
    """The job's endpoint (the submit answer's `agent[i].base_url`)."""
    api_key: str
    """The job's token (the submit answer's `agent[i].api_key`)."""


class JobToolsEnvironment(LocalEnvironment):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(config_class=JobToolsEnvironmentConfig, **kwargs)

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        """Run the action's command as the job's bash tool; a refusal or a failed call is the agent's observation."""
        arguments = {"command": action.get("command", ""), "timeout": timeout or self.config.timeout}
        try:
            reply = requests.post(
                f"{self.config.base_url}/tools/bash",
                json=arguments,
                headers={"Authorization": f"Bearer {self.config.api_key}"},
                timeout=(timeout or self.config.timeout) + 30,
            )
            reply.raise_for_status()
            result = reply.json()
            code = result.get("exit_code")
            output = {
                "output": result["output"],
                "returncode": code if code is not None else (1 if result.get("is_error") else 0),
                "exception_info": "the command timed out" if result.get("timed_out") else "",
            }
        except requests.RequestException as e:
            body = e.response.text if e.response is not None else ""
            output = {
                "output": body,
                "returncode": -1,
                "exception_info": f"The job's bash tool failed: {e}",
                "extra": {"exception_type": type(e).__name__, "exception": str(e)},
            }
        self._check_finished(output)
        return output
