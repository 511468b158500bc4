"""`python -m cpu_backend --port N [--model DIR]`: serve a causal LM on the CPU with vLLM's protocol."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from shared.config import get_settings


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    settings = get_settings()
    parser = argparse.ArgumentParser(prog="python -m cpu_backend", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--model", type=Path, default=settings.cpu_backend_model,
                        help="local HF model dir; default: the tiny model built under <state_dir>/models")
    parser.add_argument("--served-model-name", default=None, help="name reported in responses (vLLM's flag)")
    parser.add_argument("--seed", type=int, default=settings.cpu_backend_seed)
    parser.add_argument("--max-model-len", type=int, default=settings.cpu_backend_max_model_len)
    parser.add_argument("--prefix-cache-entries", type=int, default=settings.cpu_backend_prefix_cache_entries,
                        help="KV prefixes kept; 0 turns prefix caching off")
    parser.add_argument("--prefix-cache-tokens", type=int, default=1 << 18,
                        help="total tokens the prefix cache may hold (bounds its memory)")
    parser.add_argument("--threads", type=int, default=settings.cpu_backend_threads)
    parser.add_argument("--logprobs-mode", choices=["raw_logprobs", "processed_logprobs"], default="raw_logprobs",
                        help="as vLLM's --logprobs-mode: raw model logprobs, or after temperature/top-k/top-p")
    parser.add_argument("--admin-token", default=settings.cpu_backend_admin_token,
                        help="bearer token of POST /admin/load_weights; unset: weight loading is off")
    parser.add_argument("--state-dir", type=Path, default=settings.state_dir)
    return parser.parse_args(argv)


def build_app(args: argparse.Namespace):
    """Load (building on first use) the model and wrap it in the HTTP app."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from cpu_backend.bootstrap import load, tiny_model_dir
    from cpu_backend.engine import Engine
    from cpu_backend.server import create_app

    model_dir = args.model or tiny_model_dir(args.state_dir, args.seed, args.max_model_len)
    tokenizer, model = load(model_dir, threads=args.threads)
    max_len = min(args.max_model_len, int(getattr(model.config, "max_position_embeddings", args.max_model_len)))
    engine = Engine(model, tokenizer, max_len, args.prefix_cache_entries, args.logprobs_mode,
                    args.prefix_cache_tokens)
    name = args.served_model_name or Path(model_dir).name
    return create_app(engine, name, Path(model_dir), args.admin_token)


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(build_app(args), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
