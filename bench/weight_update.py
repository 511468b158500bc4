"""One weight update of every backend through the service vs saving and reading the checkpoint once.

Starts two vLLM servers on the tiny model (as `rollouts up` starts them) and a private
redis-server, then times, in this one process and interleaved round by round:
- baseline: `save_pretrained` of the tiny model to a fresh directory plus `from_pretrained` of it
  (what any trainer pays to hand weights over through a disk);
- `update_model` (the code behind POST /v1/models/{model}/weights) with one backend registered,
  then with both: checkpoint check, pause, reload, reset prefix cache, set version, resume, check,
  on every backend at once. The per-step times of the last update are printed too;
- with `--bytes`, in the same rounds, `update_model` with the checkpoint's safetensors file as
  bytes (the code behind PUT /v1/models/{model}/weights, after the API has the body): the load
  step sends it base64 to vLLM's worker extension instead of a path.
The goal is an update of all backends in under 2x the baseline.

    .venv/bin/python -m bench.weight_update [--rounds 10] [--bytes]

With `--backend-url URL` (twice) it updates servers that already run instead of starting two: their
weights change, so never point it at servers anything else uses (tests/bench/ gives it test doubles).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from redis import Redis

from bench.backends import add_backend_option, tiny_model, vllm_urls
from cli.embedded_redis import EmbeddedRedis
from cli.tiny_model import build_tiny_model, build_tokenizer
from shared.backend_pool import BackendPool
from shared.config import Settings
from shared.keys import Keys
from shared.weights import Checkpoint, update_model


def save_and_load(model: torch.nn.Module, directory: Path) -> float:
    """Seconds to save the model and read it back, as a trainer handing weights over through a disk would."""
    from transformers import AutoModelForCausalLM

    start = time.perf_counter()
    model.save_pretrained(directory)
    AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--bytes", action="store_true", help="also time the update with the weights sent as bytes")
    add_backend_option(parser, " (given: exactly 2, whose weights this run changes)")
    args = parser.parse_args(argv)
    if args.backend_url and len(args.backend_url) != 2:
        parser.error("--backend-url: give two servers (the run updates 1, then 2 backends)")
    with tempfile.TemporaryDirectory(prefix="bench-weights-") as tmp:
        work = Path(tmp)
        with vllm_urls(args.backend_url, 2, work, bind_cores=True) as servers, EmbeddedRedis() as redis_server:
            redis = Redis.from_url(redis_server.url)
            settings = Settings(redis_url=redis_server.url)
            pool = BackendPool(redis, Keys(settings.redis_prefix), settings)
            model = build_tiny_model(build_tokenizer(), 1, 4096)
            checkpoints = [work / f"ckpt-{seed}" for seed in (1, 2)]
            for seed, directory in zip((1, 2), checkpoints):
                build_tiny_model(build_tokenizer(), seed, 4096).save_pretrained(directory)
            payloads = [(directory / "model.safetensors").read_bytes() for directory in checkpoints]
            tokenizer_dir = str(tiny_model())
            times: dict[str, list[float]] = {"save+load": [], "update 1 backend": [], "update 2 backends": []}
            if args.bytes:
                times |= {"bytes 1 backend": [], "bytes 2 backends": []}
            last_steps: dict[str, dict[str, float]] = {}
            version = 0
            for backends in (1, 2):
                pool.register(servers[backends - 1], "tiny", tokenizer=tokenizer_dir)
                for round_ in range(args.rounds + 1):  # round 0 warms up
                    baseline = save_and_load(model, work / f"save-{backends}-{round_}")
                    version += 1
                    start = time.perf_counter()
                    report = update_model(pool, "tiny", Checkpoint(str(checkpoints[version % 2]), f"v{version}"))
                    elapsed = time.perf_counter() - start
                    assert all(o.status == "updated" for o in report.backends), report
                    plural = "s" * (backends > 1)
                    if round_:
                        times["save+load"].append(baseline)
                        times[f"update {backends} backend{plural}"].append(elapsed)
                    last_steps = {o.url: o.seconds for o in report.backends}
                    if args.bytes:
                        version += 1
                        upload = Checkpoint(f"upload-{version}", f"v{version}", data=payloads[version % 2])
                        start = time.perf_counter()
                        report = update_model(pool, "tiny", upload)
                        elapsed = time.perf_counter() - start
                        assert all(o.status == "updated" for o in report.backends), report
                        if round_:
                            times[f"bytes {backends} backend{plural}"].append(elapsed)
                        last_steps |= {f"{o.url} (bytes)": o.seconds for o in report.backends}
    base = statistics.median(times["save+load"])
    print(f"\n{'what':<20} {'median s':>9} {'min s':>8} {'x save+load':>12}   ({args.rounds} rounds)")
    for name, values in times.items():
        print(
            f"{name:<20} {statistics.median(values):>9.4f} {min(values):>8.4f} {statistics.median(values) / base:>12.2f}"
        )
    print("\nper step, last update (ms):")
    for url, steps in last_steps.items():
        print(f"  {url}: " + "  ".join(f"{k} {v * 1000:.1f}" for k, v in steps.items()))


if __name__ == "__main__":
    main()
