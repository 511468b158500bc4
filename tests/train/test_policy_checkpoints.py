"""Checkpoints of examples/train_grpo: a second run into the same --out replaces them instead of failing."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from examples.train_grpo.policy import build_policy, build_policy_tokenizer, save_policy


def test_saving_over_an_earlier_run_and_its_leftover_staging_dir(tmp_path: Path) -> None:
    tokenizer = build_policy_tokenizer()
    first, second = (build_policy(tokenizer, seed, hidden=16, layers=1) for seed in (0, 1))
    target = tmp_path / "s0-v0"
    save_policy(first, tokenizer, target)
    (tmp_path / ".s0-v0.tmp").mkdir()  # a run that died mid-save
    (tmp_path / ".s0-v0.tmp" / "config.json").write_text("{}")

    assert save_policy(second, tokenizer, target) == target
    saved = load_file(target / "model.safetensors")
    expected = second.state_dict()
    assert all(torch.equal(saved[name], expected[name]) for name in saved)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s0-v0"]
