"""The client stands alone: it imports without the service's packages on the path, and its wheel
requires httpx and msgpack only (numpy is the `tensors` extra)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from rollouts_client import collate_trajectories

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "client"
SERVER_PACKAGES = ("shared", "workers", "api", "cli", "bench")

# Run with -I -S: no PYTHONPATH, no working directory, no site (so no .pth file puts the
# project's editable install on the path); the path is the standard library's, then the
# client's source and the third-party packages.
IMPORT_ALONE = """
import sys
sys.path[:] = [*sys.path, *{path!r}]
import rollouts_client, rollouts_client.training
server = sorted(m for m in sys.modules if m.split(".")[0] in {server!r})
assert not server, f"the client imported the service: {{server}}"
assert "numpy" not in sys.modules, "numpy is imported only when tensors are made"


class Record:
    def to_dict(self):
        return {{"token_ids": [5, 6, 7], "loss_mask": [0, 1, 1], "logprobs": [None, -0.5, -0.25],
                 "prompt_length": 1}}


batch = rollouts_client.collate_trajectories([Record()], pad_token_id=0, tensors="numpy")
assert batch["input_ids"].tolist() == [[5, 6, 7]] and batch["prompt_lengths"].tolist() == [1]
print("alone")
"""


def test_the_client_imports_and_collates_without_the_service() -> None:
    libs = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    code = IMPORT_ALONE.format(path=[str(CLIENT), *libs], server=SERVER_PACKAGES)
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=60, cwd="/", check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "alone"


def test_tensors_without_numpy_say_which_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "numpy", None)  # makes `import numpy` fail
    record = {"token_ids": [1, 2], "loss_mask": [0, 1], "logprobs": [None, -1.0], "prompt_length": 1}
    with pytest.raises(ImportError, match=r"rollouts-client\[tensors\]"):
        collate_trajectories([record], tensors="numpy")


def test_a_record_whose_lists_do_not_line_up_is_refused() -> None:
    short_mask = {"token_ids": [1, 2, 3], "loss_mask": [0, 1], "logprobs": [None, -1.0, -1.0]}
    with pytest.raises(ValueError, match="trajectory 0: lengths differ"):
        collate_trajectories([short_mask], tensors="numpy")
    no_logprob = {"token_ids": [1, 2], "loss_mask": [0, 1], "logprobs": [None, None]}
    with pytest.raises(ValueError, match="generated token 1 has no logprob"):
        collate_trajectories([no_logprob], tensors="numpy")


def test_the_wheel_requires_httpx_and_msgpack_only(tmp_path: Path) -> None:
    source = tmp_path / "client"  # a copy: building writes build/ and *.egg-info next to the sources
    shutil.copytree(CLIENT, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("rollouts_client-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = Parser().parsestr(archive.read(metadata).decode())
    assert meta["Name"] == "rollouts-client"
    requires = meta.get_all("Requires-Dist") or []
    required = sorted(r.split(">")[0].split("=")[0].split(";")[0].strip() for r in requires if "extra ==" not in r)
    assert required == ["httpx", "msgpack"], requires
    assert any(r.startswith("numpy") and 'extra == "tensors"' in r for r in requires), requires
    packages = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert packages == {"rollouts_client"}, packages
    assert "rollouts_client/py.typed" in names


def test_a_trajectorys_own_token_rewards_are_kept_and_checked():
    import numpy as np

    from rollouts_client import collate_trajectories

    shaped = {
        "token_ids": [5, 6, 7, 8],
        "loss_mask": [0, 1, 0, 1],
        "logprobs": [None, -0.1, None, -0.2],
        "token_rewards": [0.0, 0.5, 0.0, 1.0],
    }
    plain = {"token_ids": [5, 6, 7], "loss_mask": [0, 1, 1], "logprobs": [None, -0.3, -0.4]}

    batch = collate_trajectories([shaped, plain], rewards=[9.0, 2.0], tensors="numpy")

    np.testing.assert_allclose(batch["token_rewards"], [[0.0, 0.5, 0.0, 1.0], [0.0, 0.0, 2.0, 0.0]])
    assert "token_rewards" not in collate_trajectories([plain], tensors="numpy")
    with pytest.raises(ValueError, match="token_rewards has 2 entries for 3 tokens"):
        collate_trajectories([{**plain, "token_rewards": [0.0, 1.0]}], tensors="numpy")
