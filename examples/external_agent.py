"""Bring your own agent: drive one rollout with the official `openai` package, evaluated by the service.

The service runs the job as always (its sandbox, its pinned vLLM backend, its evaluation); only the
agent loop is ours, below. We submit a job with `"agent": "external"`, get the job's base URL and
key back, read the task (messages and tool schemas), and then talk to the model as to any
OpenAI-compatible server. Tool calls run in the job's sandbox through `POST {base}/tools/{name}`;
`POST {base}/finish` ends the rollout and the job goes to evaluation. The trajectory the trainer
reads is token-exact (ids, logprobs, loss mask, weight versions), recorded by the service.

    .venv/bin/rollouts up                                   # another shell
    .venv/bin/python examples/external_agent.py --problem "What is 2 + 3?" --answer 5
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import httpx
from openai import OpenAI

NUDGE = "No tool call found. Call a tool, or call finish when you are done."


def submit(api: httpx.Client, problem: str, answer: str, max_turns: int, seed: int) -> tuple[str, dict[str, str]]:
    """One math job driven from outside; returns its id and its agent endpoint (base_url, api_key)."""
    job = {
        "task": {"kind": "math", "problem": problem, "answer": answer},
        "agent": "external",
        "limits": {"max_turns": max_turns, "max_tokens": 3000, "rollout_timeout_s": 600},
        "sampling": {"max_tokens": 64, "seed": seed},
    }
    response = api.post("/v1/jobs", json=job)
    response.raise_for_status()
    body = response.json()
    return body["job_ids"][0], body["agent"][0]


def wait_until_serving(endpoint: dict[str, str], timeout_s: float = 300) -> dict[str, Any]:
    """The task (messages, tools, model) once the job's rollout serves it (503 until then)."""
    headers = {"Authorization": f"Bearer {endpoint['api_key']}"}
    deadline = time.monotonic() + timeout_s
    while True:
        response = httpx.get(f"{endpoint['base_url']}/task", headers=headers, timeout=30)
        if response.status_code != 503 or time.monotonic() > deadline:
            response.raise_for_status()
            return response.json()
        time.sleep(float(response.headers.get("retry-after", 1)))


def run_agent(endpoint: dict[str, str], max_turns: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A small agent loop: ask the model, run the tools it calls in the job's sandbox, finish.
    Returns the task and the conversation as the agent kept it."""
    task = wait_until_serving(endpoint)
    llm = OpenAI(base_url=f"{endpoint['base_url']}/v1", api_key=endpoint["api_key"], max_retries=0)
    service = httpx.Client(
        base_url=endpoint["base_url"], headers={"Authorization": f"Bearer {endpoint['api_key']}"}, timeout=120
    )
    messages: list[dict[str, Any]] = list(task["messages"])
    answer = None
    for _ in range(max_turns):
        reply = llm.chat.completions.create(model=task["model"], messages=messages, tools=task["tools"])
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            messages.append({"role": "user", "content": NUDGE})
            continue
        for call in message.tool_calls:
            arguments = json.loads(call.function.arguments or "{}")
            if call.function.name == "finish":
                answer = arguments.get("answer")
                break
            result = service.post(f"/tools/{call.function.name}", json=arguments).json()
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result.get("output", str(result))})
        if answer is not None:
            break
    service.post("/finish", json={"answer": answer}).raise_for_status()
    return task, messages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--api", default=os.environ.get("ROLLOUTS_API_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--token", default=os.environ.get("ROLLOUTS_API_TOKEN"))
    parser.add_argument("--problem", default="What is 2 + 3?")
    parser.add_argument("--answer", default="5")
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    with httpx.Client(base_url=args.api, headers=headers, timeout=60) as api:
        job_id, endpoint = submit(api, args.problem, args.answer, args.max_turns, args.seed)
        print(f"job {job_id}: agent endpoint {endpoint['base_url']}")
        run_agent(endpoint, args.max_turns)
        while (job := api.get(f"/v1/jobs/{job_id}").json())["status"] not in (
            "done",
            "failed",
            "cancelled",
            "timed_out",
        ):
            time.sleep(1)
    trajectory = (job.get("result") or {}).get("trajectory") or {}
    print(
        f"job {job_id}: {job['status']}, reward {(job.get('result') or {}).get('reward')}, "
        f"{len(trajectory.get('token_ids', []))} tokens, stop {trajectory.get('stop_reason')}"
    )


if __name__ == "__main__":
    main()
