"""slime's rollout function backed by the service: `--rollout-function-path rollouts_client.trainers.slime.generate_rollout`.

Read at THUDM/slime 624b824a (2026-08-21) and radixark's miles 0.0.2 (PyPI `miles-rl`), which keep the contract:
slime's `RolloutManager` (slime/ray/rollout.py) loads `--rollout-function-path` (and `--eval-function-path`,
which defaults to it) and calls `generate_rollout(args, rollout_id, data_source, evaluation=False)` through
`call_rollout_fn` (slime/rollout/base_types.py). Training wants `RolloutFnTrainOutput(samples=...)`: a list of
`rollout_batch_size` groups of `n_samples_per_prompt` Samples (slime/rollout/sglang_rollout.py), which the
manager flattens and turns into training data (`_convert_samples_to_train_data`); evaluation wants
`RolloutFnEvalOutput(data={name: {"rewards": [...], "truncated": [...], "samples": [...]}})` per eval dataset.

A step is one batch on the service (slime_batches.py): the data source's groups (`data_source.get_samples`), each
sample's task being its `metadata.rollouts_task` (slime's `--metadata-key` column). With slime's dynamic filter
`check_reward_nonzero_std`, the batch is DAPO's (`min_informative_groups` = `rollout_batch_size`,
`max_groups_in_flight` = `over_sampling_batch_size`); any other filter is refused (the service cannot run it).
Each sample is the record, not re-tokenized (slime_samples.py). A job that failed for the infrastructure is
retried, then its sample is `remove_sample=True` (never a reward of 0), or raised (`on_failure: raise`).

Settings: BridgeSettings' names, from `args.rollouts` (a mapping, e.g. `rollouts:` in slime's
`--custom-config-path` YAML) and the environment (ROLLOUTS_API_URL, ROLLOUTS_API_TOKEN, ROLLOUTS_RUN_ID).
`on_segments`: "last" (default: a record's evaluated segment), "raise", or "all": every segment a Sample of its
own, the job's samples a list sharing `rollout_id` (slime's "compact" shape: prompt x rollout x samples).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from rollouts_client.trainers.records import JobFailed, split_segments
from rollouts_client.trainers.rows import RowError, sampling_from
from rollouts_client.trainers.settings import BridgeSettings
from rollouts_client.trainers.slime_batches import Prompt, Result, StepRunner
from rollouts_client.trainers.slime_samples import filled, has_field, removed, row_name, sample_class, task_of
from rollouts_client.trainers.waiting import ServiceConnection

DAPO_FILTER = "dynamic_sampling_filters.check_reward_nonzero_std"  # slime's and miles' filter_hub path
T = TypeVar("T")


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """slime's rollout function: a training step's groups, or the evaluation datasets' results."""
    bridge = SlimeBridge(args)
    if evaluation:
        return bridge.run(bridge.evaluate(rollout_id))
    return bridge.run(bridge.rollout(rollout_id, data_source))


class SlimeBridge:
    """One call of slime's rollout function: its settings, sampling and the service connection of the process."""

    _loop: asyncio.AbstractEventLoop | None = None  # one event loop per process, in a thread (slime calls in sync)
    _lock = threading.Lock()

    def __init__(self, args: Any) -> None:
        given = getattr(args, "rollouts", None)
        self.settings = BridgeSettings.from_mapping(json.loads(given) if isinstance(given, str) else given)
        if self.settings.model or self.settings.engines == "trainer":
            raise ValueError(
                "rollouts slime bridge: the service's batches name no model (`model` and `engines: trainer` are "
                "not supported): serve the policy on the service's backends"
            )
        self.args = args
        self.runner: StepRunner | None = None  # the last step's (tests read its batches)

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the process's bridge loop (slime's rollout actor calls from sync code)."""
        with SlimeBridge._lock:
            if SlimeBridge._loop is None:
                SlimeBridge._loop = asyncio.new_event_loop()
                threading.Thread(target=SlimeBridge._loop.run_forever, name="rollouts-slime", daemon=True).start()
        return asyncio.run_coroutine_threadsafe(work, SlimeBridge._loop).result()

    async def rollout(self, rollout_id: int, data_source: Any) -> Any:
        """`rollout_batch_size` groups of `n_samples_per_prompt` samples, in the data source's order."""
        args = self.args
        target, n = int(args.rollout_batch_size), int(args.n_samples_per_prompt)
        runner = self._runner(self._sampling(), "rollout_max_context_len", {"rollout_id": rollout_id, "phase": "train"})
        dynamic = getattr(args, "dynamic_sampling_filter_path", None)
        if dynamic is None:
            prompts = self._prompts(data_source.get_samples(target), "train", rollout_id)
            results = await runner.every_prompt(prompts, n)
            kept = list(zip(prompts, results))
        elif str(dynamic).endswith(DAPO_FILTER):
            in_flight = max(int(getattr(args, "over_sampling_batch_size", None) or target), target)
            draw = lambda: self._prompts(data_source.get_samples(in_flight), "train", rollout_id)  # noqa: E731
            kept = await runner.dapo(draw, target, n, in_flight)
        else:
            raise ValueError(
                f"rollouts slime bridge: dynamic_sampling_filter_path {dynamic!r}: only slime's "
                f"`{DAPO_FILTER}` runs on the service (DAPO batches); another filter needs slime's own rollout"
            )
        groups = sorted((self._group(p, r) for p, r in kept), key=lambda g: _first(g).group_index)
        metrics = {"rollouts/batches": len(runner.batches), "rollouts/failed_groups": runner.failed_groups}
        metrics["rollouts/removed_samples"] = sum(s.remove_sample for g in groups for s in _flat(g))
        return _outputs(groups).RolloutFnTrainOutput(samples=groups, metrics=metrics)

    async def evaluate(self, rollout_id: int) -> Any:
        """Each of slime's `eval_datasets` (a JSONL file) as one batch: its rewards, truncation and samples by name;
        a sample whose job failed for good is left out of all three (counted in the metrics)."""
        data: dict[str, dict[str, Any]] = {}
        metrics: dict[str, Any] = {}
        for config in getattr(self.args, "eval_datasets", None) or []:
            n = int(config.n_samples_per_eval_prompt or getattr(self.args, "n_samples_per_eval_prompt", 1) or 1)
            meta = {"rollout_id": rollout_id, "phase": "eval", "eval_dataset": config.name}
            runner = self._runner(self._sampling(config), "eval_max_context_len", meta)
            prompts = self._prompts(eval_groups(self.args, config, n), f"eval:{config.name}", rollout_id)
            results = await runner.every_prompt(prompts, n)
            kept = sorted((s for p, r in zip(prompts, results) for s in _flat(self._group(p, r, False))), key=_index)
            status = type(kept[0]).Status if kept else None
            data[config.name] = {
                "rewards": [s.reward for s in kept],
                "truncated": [s.status == status.TRUNCATED for s in kept] if status else [],
                "samples": kept,
            }
            failed = sum(isinstance(r, JobFailed) for group in results for r in group)
            metrics[f"eval/{config.name}/rollouts_failed_samples"] = failed
        return _outputs_of(sample_class()).RolloutFnEvalOutput(data=data, metrics=metrics)

    def _runner(self, sampling: dict[str, Any], context_arg: str, metadata: dict[str, Any]) -> StepRunner:
        """The step's runner; `limits.max_tokens` (the whole trajectory) is slime's context length where set."""
        context = getattr(self.args, context_arg, None) or getattr(self.args, "rollout_max_context_len", None)
        limits = {"max_tokens": int(context)} if context else {}
        metadata = {"trainer": "slime", "run_id": self.settings.run_id, **metadata}
        self.runner = StepRunner(ServiceConnection.shared(self.settings), sampling, limits, metadata)
        return self.runner

    def _sampling(self, config: Any = None) -> dict[str, Any]:
        """slime's rollout sampling (`--rollout-temperature`, ...; an eval dataset's own where it sets them) under
        the service's names; per-turn `max_tokens` = `max_tokens_per_turn`, else `--rollout-max-response-len`."""
        args = self.args

        def pick(name: str, arg: str) -> Any:
            own = getattr(config, name, None) if config is not None else None
            return own if own is not None else getattr(args, arg, None)

        top_p = pick("top_p", "rollout_top_p")
        if top_p is not None and float(top_p) != 1.0:
            raise ValueError(
                "rollouts slime bridge: rollout_top_p != 1.0 makes slime replay the nucleus token ids, which the "
                "service does not record: use top_p 1.0"
            )
        params = {
            "temperature": pick("temperature", "rollout_temperature"),
            "top_p": top_p,
            "top_k": pick("top_k", "rollout_top_k"),
            "stop": pick("stop", "rollout_stop"),
            "repetition_penalty": pick("repetition_penalty", "rollout_repetition_penalty"),
        }
        limit = self.settings.max_tokens_per_turn or pick("max_response_len", "rollout_max_response_len")
        return sampling_from(params, limit)

    def _prompts(self, groups: list[list[Any]], phase: str, rollout_id: int) -> list[Prompt]:
        """The data source's groups as batch prompts; RowError naming the sample before anything is submitted."""
        prompts = []
        for group in groups:
            if not group:
                raise RowError("*", "group", "an empty group from the data source")
            first = group[0]
            if self.settings.on_segments == "all" and not has_field(first, "rollout_id"):
                raise ValueError(
                    "on_segments: all returns slime's compact shape, whose siblings share Sample.rollout_id: "
                    f"{type(first).__module__}'s Sample has none (THUDM/slime's has)"
                )
            identity = (self.settings.run_id, "slime", phase, rollout_id, first.group_index)
            prompts.append(Prompt(list(group), task_of(first), identity, row_name(first)))
        return prompts

    def _group(self, prompt: Prompt, results: list[Result], keep_failed: bool = True) -> list[Any]:
        """The prompt's samples from its results: each done job's segments, then the failed ones `remove_sample`
        (left out when not `keep_failed`: evaluation has no group to keep whole)."""
        out: list[Any] = [None] * len(results)
        for i, result in enumerate(results):
            if isinstance(result, JobFailed):
                continue
            job, attempts = result
            splits = split_segments(job, self.settings.on_segments)
            made = [filled(prompt.samples[i], job, s, attempts, k, len(splits)) for k, s in enumerate(splits)]
            out[i] = made if self.settings.on_segments == "all" else made[0]
        done = [s for item in out if item is not None for s in (item if isinstance(item, list) else [item])]
        for i, result in enumerate(results):
            if isinstance(result, JobFailed) and keep_failed:
                out[i] = removed(prompt.samples[i], result, done)
        return [item for item in out if item is not None]


def eval_groups(args: Any, config: Any, n: int) -> list[list[Any]]:
    """An eval dataset's rows as groups of `n` Samples (prompt, label, metadata from slime's keys), one per row.
    The service renders each prompt from its task, so only JSONL files are read (no tokenizer)."""
    path = Path(config.path)
    if path.suffix != ".jsonl":
        raise ValueError(f"eval dataset {config.name}: {path}: the bridge reads JSONL files")
    keys = {k: getattr(config, k, None) or getattr(args, k, None) for k in ("input_key", "label_key", "metadata_key")}
    sample = sample_class()
    groups = []
    for row_index, line in enumerate(path.read_text().splitlines()):
        if not line.strip():
            continue
        row = json.loads(line)
        metadata = row.get(keys["metadata_key"] or "metadata") or {}
        group = []
        for j in range(n):
            index = len(groups) * n + j
            group.append(
                sample(
                    group_index=row_index,
                    index=index,
                    prompt=row.get(keys["input_key"] or "prompt", ""),
                    label=row.get(keys["label_key"] or "label"),
                    metadata=dict(metadata),
                )
            )
        groups.append(group)
    return groups


def _index(sample: Any) -> int:
    return int(sample.index)


def _first(group: list[Any]) -> Any:
    head = group[0]
    return head[0] if isinstance(head, list) else head


def _flat(group: list[Any]) -> list[Any]:
    return [s for item in group for s in (item if isinstance(item, list) else [item])]


def _outputs(groups: list[list[Any]]) -> Any:
    return _outputs_of(type(_first(groups[0])) if groups else sample_class())


def _outputs_of(sample: type) -> Any:
    """The running framework's `rollout.base_types` (slime's or miles'), by the package its Sample comes from."""
    return importlib.import_module(f"{sample.__module__.split('.')[0]}.rollout.base_types")
