"""The processes of a vLLM server's group, found by their command line (to kill one part of it in a test)."""

from __future__ import annotations

from pathlib import Path

from cli.vllm_server import VLLMServer
from tests.support.proc_table import process_table


def process_group(leader: int) -> list[int]:
    return [pid for pid, (_parent, group) in process_table().items() if group == leader]


def vllm_process(server: VLLMServer, needle: bytes) -> int:
    """The one process of the server's group whose command line holds `needle` (vLLM titles its engine
    `VLLM::EngineCore`; its API server runs `vllm.entrypoints.openai.api_server`)."""
    assert server.process is not None
    found = [
        p
        for p in process_group(server.process.pid)
        if needle in Path(f"/proc/{p}/cmdline").read_bytes() and p != server.process.pid
    ]
    assert len(found) == 1, (needle, found, [Path(f"/proc/{p}/cmdline").read_bytes() for p in found])
    return found[0]
