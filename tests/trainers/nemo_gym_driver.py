"""Run in the NeMo Gym virtualenv: NeMo Gym's own CLI (`gym env start`) serves the rollouts agent from
examples/nemo_gym, and NeMo Gym's own rollout client (`RolloutCollectionHelper.run_examples`, what NeMo-RL calls)
posts the rows to its `/run`. Each answer is validated with NeMo Gym's pydantic models (`BaseVerifyResponse`,
`NeMoGymResponse`); a failure is kept as NeMo Gym's client saw it (HTTP status and body). Results are written as JSON.

    python nemo_gym_driver.py MODEL_DIR GIVEN_JSON OUT_JSON

GIVEN_JSON: {"rows": {name: row}, "head_port": int, "unreachable_url": str, "segmented_job": job id or null,
"responses": Responses API create params for the agent's `/v1/responses`, or null}.
Rows named `unreachable*` go to a second instance of the agent whose service address is `unreachable_url`.
OUT_JSON: {name: {"status": 200, "result": verify response, "item_classes": [...]} or {"status", "content"}},
and under "segmented" the items of the given job's record as the agent maps them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import ray
from nemo_gym.base_resources_server import BaseVerifyResponse
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.rollout_collection import RolloutCollectionHelper
from nemo_gym.server_utils import BaseServerConfig, ServerClient

from rollouts_client.aio import AsyncRolloutClient
from rollouts_client.trainers.nemo_gym_agent import response_of
from rollouts_client.trainers.settings import BridgeSettings

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "nemo_gym"
CONFIG = "responses_api_agents/rollouts_agent/configs/rollouts_agent.yaml"
AGENTS = ("rollouts_agent", "rollouts_agent_unreachable")


def main() -> int:
    _, given_path, out_path = sys.argv[1:4]
    given = json.loads(Path(given_path).read_text())
    work = Path(out_path).parent / "nemo-gym"
    work.mkdir(exist_ok=True)
    # NeMo-RL hands NeMo Gym the Ray cluster it runs in (`ray_head_node_address`); so does this driver.
    ray.init(include_dashboard=False, num_cpus=2, log_to_driver=False)
    gym = start_gym(given, work, ray.get_runtime_context().gcs_address)
    try:
        head = BaseServerConfig(host="127.0.0.1", port=given["head_port"])
        wait_ready(head, gym)
        out = asyncio.run(asyncio.wait_for(drive(given, head), timeout=600))  # a hang fails, not the suite
    finally:
        stop(gym)
        ray.shutdown()
    Path(out_path).write_text(json.dumps(out))
    return 0


def start_gym(given: dict[str, Any], work: Path, ray_address: str) -> subprocess.Popen[bytes]:
    """`gym env start` on the example's config, as a user starts it (README in docs/TRAINERS.md); a second agent
    instance (NeMo Gym's instance-name layer) points at an address where no service listens."""
    unreachable = work / "unreachable.yaml"
    unreachable.write_text(
        "rollouts_agent_unreachable:\n  responses_api_agents:\n    rollouts_agent:\n      entrypoint: app.py\n"
        f"      rollouts:\n        api_url: {given['unreachable_url']}\n"
    )
    # The agent's venv is this one: NeMo Gym sources <uv_venv_dir>/responses_api_agents/rollouts_agent/.venv
    venv = work / "venvs" / "responses_api_agents" / "rollouts_agent" / ".venv"
    venv.parent.mkdir(parents=True, exist_ok=True)
    if not venv.exists():
        venv.symlink_to(sys.prefix)
    command = [
        str(Path(sys.prefix) / "bin" / "gym"),
        "env",
        "start",
        f"+config_paths=[{CONFIG},{unreachable}]",
        "+skip_venv_if_present=true",
        f"+uv_venv_dir={work / 'venvs'}",
        f"+head_server={{host:127.0.0.1,port:{given['head_port']}}}",
        f"+ray_head_node_address={ray_address}",
        f"+nemo_gym_log_dir={work / 'logs'}",
        f"hydra.run.dir={work / 'hydra'}",  # not hydra's default, outputs/ under the example's directory
    ]
    log = (work / "gym.log").open("wb")
    return subprocess.Popen(command, cwd=EXAMPLE, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def wait_ready(head: BaseServerConfig, gym: subprocess.Popen[bytes], timeout: float = 240.0) -> None:
    """Until the head server answers and both agent instances are up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if gym.poll() is not None:
            raise RuntimeError(f"gym env start exited {gym.returncode}")
        with contextlib.suppress(ValueError):  # the head server is not up yet
            client = ServerClient.load_from_global_config(head)
            if all(client.poll_for_status(name) == "success" for name in AGENTS):
                return
        time.sleep(1)
    raise TimeoutError("NeMo Gym's servers did not come up")


async def drive(given: dict[str, Any], head: BaseServerConfig) -> dict[str, Any]:
    """Everything in one event loop: NeMo Gym's aiohttp client is global and belongs to the loop that made it."""
    out = await run_rows(given["rows"], head)
    if given.get("responses"):
        out["responses"] = await post_responses(given["responses"], head)
    if given.get("segmented_job"):
        out["segmented"] = await segmented_items(given["segmented_job"])
    return out


async def run_rows(rows: dict[str, dict[str, Any]], head: BaseServerConfig) -> dict[str, Any]:
    """Every row at once through NeMo Gym's rollout client; each answer validated or its failure kept."""
    helper = RolloutCollectionHelper()

    async def one(row: dict[str, Any]) -> dict[str, Any]:
        [task] = list(helper.run_examples([row], head_server_config=head))
        try:
            _, result = await task
        except Exception as exc:  # noqa: BLE001 - NeMo Gym's client raises the HTTP error: the test reads it
            content = getattr(exc, "response_content", b"")
            return {"status": getattr(exc, "status", None), "content": content.decode(errors="replace")}
        verified = BaseVerifyResponse.model_validate(result)  # NeMo Gym's own models, items and all
        NeMoGymResponse.model_validate(result["response"])
        return {
            "status": 200,
            "result": result,
            "item_classes": [type(item).__name__ for item in verified.response.output],
        }

    answers = await asyncio.gather(*(one(row) for row in rows.values()))
    return dict(zip(rows, answers))


async def post_responses(params: dict[str, Any], head: BaseServerConfig) -> dict[str, Any]:
    """The agent's `/v1/responses` through NeMo Gym's server client; the answer validated as NeMo Gym's response."""
    client = RolloutCollectionHelper().setup_server_client(head)
    answer = await client.post(server_name=AGENTS[0], url_path="/v1/responses", json=params)
    body = await answer.json()
    if answer.status != 200:
        return {"status": answer.status, "content": json.dumps(body)}
    return {"status": 200, "response": NeMoGymResponse.model_validate(body).model_dump()}


async def segmented_items(job_id: str) -> dict[str, Any]:
    """A two-segment record (an external agent's two conversations) as the agent answers it (`on_segments: all`)."""
    async with AsyncRolloutClient(os.environ["ROLLOUTS_API_URL"]) as client:
        job = await client.get_job(job_id)
    params = NeMoGymResponseCreateParamsNonStreaming(input=[])
    settings = BridgeSettings.from_mapping({"on_segments": "all"})
    response = NeMoGymResponse.model_validate(response_of(job, params, settings).model_dump())
    return {"response": response.model_dump(), "item_classes": [type(i).__name__ for i in response.output]}


def stop(gym: subprocess.Popen[bytes]) -> None:
    """Ctrl-C, as a user stops it (NeMo Gym then stops its servers); killed if it does not exit."""
    if gym.poll() is None:
        os.killpg(gym.pid, signal.SIGINT)
        try:
            gym.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(gym.pid, signal.SIGKILL)
            gym.wait()


if __name__ == "__main__":
    sys.exit(main())
