"""A task kind whose rollout returns a real Trajectory record (turns, tool calls, tokens), for the viewer test.

Loaded by workers through ROLLOUTS_TASK_MODULES; no LLM needed: the trajectory is built with
the same `Trajectory.append` the agent loop uses, from fixed byte-level token ids. With
`task.stall: true` the rollout keeps its first turns as the partial record, as the agent loop
does, and waits until the stage's deadline stops it: a timed-out job with a partial trajectory;
with `task.stall_in_eval: true` the evaluation waits instead, for a job that times out after its rollout.

`run-demo`, for the run page: the same trajectory sampled by `task.version` of the model `run-model`,
with LLM time, the sandbox origin `task.sandbox`, the reward `task.reward` (or a failure in eval with
`task.fail`), and a rollout held until the test's file exists (`task.hold`, bench/hold.py).
"""

from __future__ import annotations

from typing import Any

from bench.hold import hold_stage, validate_hold
from shared.tasks import StageContext, TaskKind, register
from shared.trajectory import ASSISTANT, OBSERVATION, PROMPT, ToolCallRecord, Trajectory, Turn


def _ids(text: str) -> list[int]:
    return list(text.encode())


def sample_trajectory(stop_after_first_turn: bool = False) -> Trajectory:
    trajectory = Trajectory(stop_reason="timed_out" if stop_after_first_turn else "finished", answer="42")
    prompt = "<user>What is 6 x 7? Use the shell.</user>"
    trajectory.append(Turn(role=PROMPT, start=0, end=0, text=prompt), _ids(prompt))
    first = "Let me compute it. <bash>echo $((6*7))</bash>"
    call = ToolCallRecord(
        name="bash",
        arguments={"command": "echo $((6*7))"},
        raw="<bash>echo $((6*7))</bash>",
        output="42\n",
        exit_code=0,
        duration_s=0.031,
    )
    trajectory.append(
        Turn(
            role=ASSISTANT,
            start=0,
            end=0,
            text=first,
            tool_calls=[call],
            backend_id="cpu-1",
            finish_reason="stop",
            latency_s=0.12,
        ),
        _ids(first),
        [-0.5] * len(first),
    )
    observation = "<tool>42</tool>"
    trajectory.append(Turn(role=OBSERVATION, start=0, end=0, text=observation, duration_s=0.031), _ids(observation))
    if stop_after_first_turn:
        trajectory.stop_detail = "the rollout stage time limit"
        return trajectory
    last = "The answer is 42. <finish>42</finish>"
    finish = ToolCallRecord(name="finish", arguments={"answer": "42"}, raw="<finish>42</finish>", output="Finished.")
    trajectory.append(
        Turn(
            role=ASSISTANT,
            start=0,
            end=0,
            text=last,
            tool_calls=[finish],
            backend_id="cpu-1",
            finish_reason="stop",
            latency_s=0.08,
        ),
        _ids(last),
        [-0.25] * len(last),
    )
    return trajectory


@register
class ViewerDemoKind(TaskKind):
    name = "viewer-demo"

    def validate(self, task: dict[str, Any]) -> None:
        return None

    def init(self, ctx: StageContext) -> dict[str, Any]:
        return {}

    def rollout(self, ctx: StageContext) -> dict[str, Any]:
        if ctx.task.get("stall"):
            ctx.partial["trajectory"] = sample_trajectory(stop_after_first_turn=True).to_dict()
            while True:
                ctx.sleep(60)  # raises StageInterrupted at the stage's deadline
        return sample_trajectory().to_dict()

    def evaluate(self, ctx: StageContext) -> dict[str, Any]:
        if ctx.task.get("stall_in_eval"):
            while True:
                ctx.sleep(60)  # the job times out with its rollout finished and no evaluation
        if ctx.task.get("swe_style"):  # tests grouped as SWE-bench's evaluation reports them
            return {
                "reward": 0.0,
                "resolved": False,
                "reason": "not resolved (pytest): 0/1 FAIL_TO_PASS passed",
                "FAIL_TO_PASS": {"tests/test_x.py::test_fixed": "FAILED"},
                "PASS_TO_PASS": {"tests/test_x.py::test_kept": "PASSED"},
            }
        tests = [
            {"name": "prints_42", "passed": True, "status": "passed"},
            {"name": "uses_the_shell", "passed": True, "status": "passed"},
            {"name": "calls_finish", "passed": True, "status": "passed"},
            {"name": "explains_the_steps", "passed": False, "status": "wrong_output", "detail": "no explanation"},
        ]
        return {"reward": 0.75, "reason": "3 of 4 checks passed", "passed": 3, "total": 4, "tests": tests}


RUN_MODEL = "run-model"
RUN_LLM_S = 0.1  # the LLM seconds each run-demo rollout records
RUN_ROLLOUT_S = 0.3  # how long each run-demo rollout takes, at least


@register
class RunDemoKind(TaskKind):
    name = "run-demo"

    def validate(self, task: dict[str, Any]) -> None:
        validate_hold(task)

    def init(self, ctx: StageContext) -> dict[str, Any]:
        return {}

    def rollout(self, ctx: StageContext) -> dict[str, Any]:
        ctx.sleep(RUN_ROLLOUT_S)
        hold_stage(ctx)
        trajectory = sample_trajectory()
        for turn in trajectory.turns:
            if turn.role == ASSISTANT:
                turn.model, turn.policy_version = RUN_MODEL, ctx.task.get("version")
        trajectory.timings = {"llm_s": RUN_LLM_S, "tools_s": 0.01, "template_s": 0.0, "total_s": RUN_ROLLOUT_S}
        trajectory.sandbox = ctx.task.get("sandbox")
        return trajectory.to_dict()

    def evaluate(self, ctx: StageContext) -> dict[str, Any]:
        if ctx.task.get("fail"):
            raise RuntimeError("run-demo failure in eval")
        return {"reward": float(ctx.task.get("reward", 0.0))}
