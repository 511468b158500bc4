"""Run slime's rollout contract on the bridge, with miles' own code (PyPI `miles-rl`, radixark's fork of slime).

Usage: python slime_driver.py <model dir> <cases.json> <out.json>, in the slime virtualenv with the client on
PYTHONPATH. Per case: miles' `RolloutDataSource` reads the rows (a JSONL file, the tiny model's tokenizer),
`RolloutManager._get_rollout_data` calls the rollout function through `call_rollout_fn` exactly as its
`generate` does, and `_convert_samples_to_train_data` (with its GRPO reward normalization) makes the training
data; the evaluation case goes through `call_rollout_fn(..., evaluation=True)` with miles' EvalDatasetConfig.
The RolloutManager is miles' class without its Ray actor and servers (its methods read `args`, the data source
and the rollout function only). What they built is written as JSON for the test to check against the records.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from argparse import Namespace
from pathlib import Path
from typing import Any

from miles.ray.rollout import RolloutManager
from miles.rollout.base_types import call_rollout_fn
from miles.rollout.data_source import RolloutDataSource
from miles.utils.eval_config import EvalDatasetConfig

from rollouts_client import RolloutClient
from rollouts_client.trainers import slime as bridge

FILTER = "miles.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std"


def main() -> None:
    model_dir, given_path, out_path = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    cases = json.loads(given_path.read_text())
    out: dict[str, Any] = {}
    for name, case in cases.items():
        try:
            out[name] = run_case(model_dir, given_path.parent / f"{name}.jsonl", case)
        except Exception as exc:  # noqa: BLE001 - the test reads which error, and its message
            out[name] = {"error": type(exc).__name__, "message": str(exc), "trace": traceback.format_exc()[-3000:]}
    out_path.write_text(json.dumps(out))


def make_args(model_dir: Path, rows_path: Path, case: dict[str, Any]) -> Namespace:
    """The args slime's (miles') RolloutManager, data source and reward post-processing read."""
    return Namespace(
        rollout_global_dataset=True,
        prompt_data=str(rows_path),
        hf_checkpoint=str(model_dir),
        chat_template_path=None,
        dump_details=None,
        rollout_max_prompt_len=None,
        input_key="prompt",
        label_key="label",
        metadata_key="metadata",
        tool_key=None,
        multimodal_keys=None,
        apply_chat_template=False,
        apply_chat_template_kwargs={},
        rollout_seed=42,
        rollout_shuffle=False,
        rollout_batch_size=case.get("rollout_batch_size", len(case["rows"])),
        n_samples_per_prompt=case.get("n", 2),
        over_sampling_batch_size=case.get("over_sampling_batch_size"),
        dynamic_sampling_filter_path=FILTER if case.get("dapo") else case.get("filter"),
        rollout_temperature=1.0,
        rollout_top_p=case.get("top_p", 1.0),
        rollout_top_k=-1,
        rollout_max_response_len=24,
        rollout_max_context_len=3000,
        rollout_stop=None,
        rollouts=case.get("settings") or {},
        # RolloutManager._get_rollout_data / _convert_samples_to_train_data
        load_debug_rollout_data=None,
        disable_rollout_trim_samples=True,
        use_dynamic_global_batch_size=False,
        custom_reward_post_process_path=None,
        custom_convert_samples_to_train_data_path=None,
        advantage_estimator="grpo",
        rewards_normalization=True,
        grpo_std_normalization=True,
        reward_key=None,
        eval_reward_key=None,
        n_samples_per_eval_prompt=1,
        eval_datasets=[],
    )


def manager(args: Namespace, data_source: Any) -> Any:
    """miles' RolloutManager as its __init__ leaves it for the non-refactored path, without Ray or servers."""
    rollout_manager = RolloutManager.__ray_metadata__.modified_class.__new__(
        RolloutManager.__ray_metadata__.modified_class
    )
    rollout_manager.args = args
    rollout_manager.data_source = data_source
    rollout_manager.use_experimental_refactor = False
    rollout_manager.generate_rollout = bridge.generate_rollout  # what load_function(rollout_function_path) gives
    rollout_manager.eval_generate_rollout = bridge.generate_rollout
    rollout_manager.custom_reward_post_process_func = None
    rollout_manager.custom_convert_samples_to_train_data_func = None
    return rollout_manager


def run_case(model_dir: Path, rows_path: Path, case: dict[str, Any]) -> dict[str, Any]:
    gate = rows_path.with_suffix(".gate")
    if case.get("cancel_one"):  # every job's evaluation waits for the gate, which goes once one job is cancelled
        gate.touch()
        for row in case["rows"]:
            row["metadata"]["rollouts_task"]["eval_gate"] = str(gate)
    rows_path.write_text("".join(json.dumps(row) + "\n" for row in case["rows"]))
    args = make_args(model_dir, rows_path, case)
    data_source = RolloutDataSource(args)
    rollout_manager = manager(args, data_source)
    if case.get("cancel_one"):
        with RolloutClient(os.environ["ROLLOUTS_API_URL"]) as client:
            seen = {job.id for job in client.list_jobs(limit=1000)}  # before the batch: its jobs are the new ones
        cancelled: list[dict[str, Any]] = []
        canceller = threading.Thread(
            target=cancel_one, args=(os.environ["ROLLOUTS_API_URL"], seen, cancelled, gate), daemon=True
        )
        canceller.start()
    started = time.perf_counter()
    if case.get("eval"):
        args.eval_datasets = [
            EvalDatasetConfig(name="parity", path=str(rows_path), n_samples_per_eval_prompt=case.get("n", 2))
        ]
        result = call_rollout_fn(rollout_manager.eval_generate_rollout, args, 0, data_source, evaluation=True)
        return {
            "eval": {
                name: {**{k: v for k, v in d.items() if k != "samples"}, "samples": [dump(s) for s in d["samples"]]}
                for name, d in result.data.items()
            },
            "metrics": result.metrics,
        }
    samples, metrics = rollout_manager._get_rollout_data(rollout_id=case.get("rollout_id", 0))
    if case.get("cancel_one"):
        canceller.join()
    train = rollout_manager._convert_samples_to_train_data(samples)
    return {
        "samples": [dump(s) for s in samples],
        "train": {k: v for k, v in train.items() if isinstance(v, list)},
        "metrics": metrics,
        "seconds": time.perf_counter() - started,
        "cancelled": cancelled if case.get("cancel_one") else None,
    }


def cancel_one(api_url: str, seen: set[str], cancelled: list[dict[str, Any]], gate: Path) -> None:
    """Cancel sample 1 of the first group of the next batch once its job is listed (a job failing for the
    infrastructure: cancelled, as an operator or a lost worker ends it), then open the gate its evaluation and
    its mates' wait at (no job can end before the cancel); what it did goes into `cancelled`."""
    started = time.monotonic()
    try:
        with RolloutClient(api_url) as client:
            while time.monotonic() < started + 120:
                for job in client.list_jobs(limit=1000):
                    if job.id not in seen and job.sample_index == 1 and str(job.group_id or "").endswith(".0"):
                        now = client.cancel_job(job.id)
                        cancelled.append({"job": job.id, "listed_as": job.status, "cancelled": now})
                        return
                time.sleep(0.02)
    finally:
        gate.unlink(missing_ok=True)


def dump(sample: Any) -> dict[str, Any]:
    return {
        "index": sample.index,
        "group_index": sample.group_index,
        "tokens": sample.tokens,
        "response_length": sample.response_length,
        "loss_mask": sample.loss_mask,
        "rollout_log_probs": sample.rollout_log_probs,
        "reward": sample.reward,
        "weight_versions": sample.weight_versions,
        "status": sample.status.value,
        "remove_sample": sample.remove_sample,
        "metadata": {k: v for k, v in sample.metadata.items() if k != "rollouts_task"},
        "task": sample.metadata.get("rollouts_task"),
    }


if __name__ == "__main__":
    main()
