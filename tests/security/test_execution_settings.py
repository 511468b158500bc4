"""How code runs is never a trainer's choice: execution settings come from admins or the operator's profiles.

A reader token that names a sandbox's network, limits, environment or image, the evaluator's
interpreter, a repository on the workers' disks, or a prompt file on the server is refused with a
403 naming the field, and nothing is stored. The same settings through a profile the operator
configured (ROLLOUTS_TASK_PROFILES) are stored with the job, so the workers apply them.
"""

from __future__ import annotations

import pytest

from shared.config import Settings
from workers.kinds.math import MathKind

READER = {"authorization": "Bearer reader-token"}
ADMIN = {"authorization": "Bearer admin-token"}
MATH = {"kind": "math", "problem": "2+2?", "answer": "4"}
PROFILES = {"web": {"sandbox": {"network": True, "limits": {"memory_bytes": 2**31}}}}


@pytest.fixture()
def api(make_client):
    return make_client(api_tokens=["reader-token"], admin_tokens=["admin-token"], task_profiles=PROFILES)


def fields(response) -> list[str]:
    return [problem["field"] for problem in response.json()["errors"]]


@pytest.mark.parametrize(
    ("task_extra", "field"),
    [
        ({"sandbox": {"network": True}}, "body.task.sandbox.network"),
        ({"sandbox": {"limits": {"memory_bytes": 2**40}}}, "body.task.sandbox.limits"),
        ({"sandbox": {"env": {"LD_PRELOAD": "/x.so"}}}, "body.task.sandbox.env"),
        ({"sandbox": {"image": "docker://evil/image"}}, "body.task.sandbox.image"),
        ({"sandbox": {"workdir": "/"}}, "body.task.sandbox.workdir"),
        ({"python": "/workspace/fake_python"}, "body.task.python"),
    ],
)
def test_a_reader_naming_an_execution_setting_gets_403_and_nothing_is_stored(api, task_extra, field):
    response = api.post("/v1/jobs", json={"task": {**MATH, **task_extra}}, headers=READER)

    assert response.status_code == 403, response.text
    assert fields(response) == [field]
    assert api.get("/v1/jobs", headers=READER).json()["jobs"] == []


def test_every_refused_setting_of_every_job_is_named(api):
    jobs = [{"task": MATH}, {"task": {**MATH, "sandbox": {"network": True, "env": {"A": "1"}}}}]
    response = api.post("/v1/jobs", json=jobs, headers=READER)
    assert response.status_code == 403
    assert fields(response) == ["body[1].task.sandbox.env", "body[1].task.sandbox.network"]


def test_files_and_setup_are_the_tasks_own_and_anyone_may_give_them(api):
    task = {**MATH, "sandbox": {"files": {"notes.txt": "hi"}, "setup": ["echo ready"]}}
    assert api.post("/v1/jobs", json={"task": task}, headers=READER).status_code == 202


def test_an_admin_may_set_execution_settings_inline(api):
    task = {**MATH, "sandbox": {"network": True}}
    assert api.post("/v1/jobs", json={"task": task}, headers=ADMIN).status_code == 202


def test_a_reader_gets_the_settings_through_the_operators_profile(api):
    response = api.post("/v1/jobs", json={"task": {**MATH, "profile": "web"}}, headers=READER)
    assert response.status_code == 202, response.text

    stored = api.get(f"/v1/jobs/{response.json()['job_ids'][0]}", headers=READER).json()["request"]["task"]

    assert stored["sandbox"] == PROFILES["web"]["sandbox"]
    spec = MathKind().sandbox_spec(stored, Settings())
    assert spec.network is True and spec.limits.memory_bytes == 2**31
    assert "PATH" in spec.env  # the agent's environment is still there


def test_an_unknown_profile_is_a_422_naming_the_profiles_there_are(api):
    response = api.post("/v1/jobs", json={"task": {**MATH, "profile": "root"}}, headers=READER)
    assert response.status_code == 422
    assert fields(response) == ["body.task.profile"] and "web" in response.json()["detail"]


def test_a_swe_repository_on_the_workers_disks_is_an_execution_setting(api):
    row = {
        "kind": "swe",
        "format": "swebench",
        "instance_id": "o__r-1",
        "repo": "o/r",
        "repo_path": "/etc",
        "base_commit": "a" * 40,
        "problem_statement": "x",
        "FAIL_TO_PASS": ["t"],
    }
    response = api.post("/v1/jobs", json={"task": row}, headers=READER)
    assert response.status_code == 403 and "body.task.repo_path" in fields(response)


def test_a_server_side_prompt_file_is_an_admins_to_name(api, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"task": {"kind": "demo", "text": "a"}}\n')
    body = {"prompts_path": str(prompts), "n_samples": 2}

    refused = api.post("/v1/batches", json=body, headers=READER)
    accepted = api.post("/v1/batches", json=body, headers=ADMIN)

    assert refused.status_code == 403 and fields(refused) == ["body.prompts_path"]
    assert accepted.status_code == 202, accepted.text


def test_a_batch_prompt_with_execution_settings_is_refused_for_a_reader(api):
    body = {"prompts": [{"task": {**MATH, "sandbox": {"network": True}}}], "n_samples": 2}
    response = api.post("/v1/batches", json=body, headers=READER)
    assert response.status_code == 403 and fields(response) == ["body.prompts[0].task.sandbox.network"]


def test_with_auth_off_the_one_local_user_is_the_admin(make_client):
    open_api = make_client()
    assert open_api.post("/v1/jobs", json={"task": {**MATH, "sandbox": {"network": True}}}).status_code == 202
