"""A fast stand-in for a vLLM server, for load tests: hundreds of requests in flight, no model.

The CPU backend runs a real model and serves a few requests a second on this machine;
`scripted_llm.py` answers on one thread per request. This one is an asyncio server
(starlette on uvicorn) in a process of its own, so 200+ generations can wait at once
without a thread each and without taking the GIL of the test process that measures
latency. A "generation" is a sleep of `delay` seconds (uniform in [min, max], to emulate
decoding time), then a scripted reply.

The script is in the prompt: a marker `[standin:turns=N answer=TEXT]` anywhere in the
decoded prompt says the episode has N assistant turns; turns 1..N-1 are plain reasoning
text (no tool call), turn N calls `finish` with `\\boxed{TEXT}` in the hermes format. The
turn is the number of assistant headers in the prompt, minus one (so the server is
stateless, and any replica can serve any turn).

vLLM fields honoured (vllm/entrypoints/openai/completion/protocol.py, CompletionRequest):
- `prompt`: a list of token IDs (a string is refused: the agent loop never sends one);
- `max_tokens`: the reply is cut to it, then `finish_reason: "length"` and no EOS;
  `prompt + max_tokens` over `--max-model-len` is a 400 with vLLM's wording;
- `model`: must be the served name (else 404, as vLLM answers), or absent;
- `n`: only 1; `stream`: only false (400 otherwise);
- `return_token_ids`: the choice carries `token_ids` and `prompt_token_ids`;
- `logprobs` (any non-null value) with `return_tokens_as_token_ids`: `logprobs.tokens` are
  `"token_id:N"` strings and `token_logprobs` made-up deterministic values, one per token.
A reply ends with EOS (`finish_reason: "stop"`, `stop_reason: null`, as vLLM reports EOS).
Ignored: sampling parameters (temperature, top_p, top_k, min_p, seed, stop, stop_token_ids,
ignore_eos). It has no `/inference/v1/generate` (a server started without `--enable-scale-out`), so the
client's fallback path is what the load tests drive. Also served: `GET /health`, `GET /v1/models`
(with the tokenizer directory as `root`), and `GET /stats` (requests
served, in flight now, peak in flight, refused) for the test.

Run: `python -m tests.support.standin_llm --tokenizer DIR --port P --delay 2 5`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from cli.procs import stop_process

MARKER = re.compile(r"\[standin:turns=(\d+) answer=([^\]\s]*)\]")
ASSISTANT_HEADER = "<|im_start|>assistant"
REPO = Path(__file__).resolve().parents[2]


class FastTokenizer:
    """The few calls the stand-in makes, on the `tokenizers` library alone: a start in well
    under a second instead of importing transformers (and torch with it) on a loaded machine."""

    def __init__(self, tokenizer_dir: Path) -> None:
        self.tokenizer_dir = tokenizer_dir
        from tokenizers import Tokenizer

        self._core = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
        eos = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())["eos_token"]
        eos_id = self._core.token_to_id(eos["content"] if isinstance(eos, dict) else eos)
        if eos_id is None:
            raise ValueError(f"{tokenizer_dir}: the eos token {eos!r} is not in the vocabulary")
        self.eos_token_id: int = eos_id

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self._core.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self._core.decode(ids, skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [self._core.id_to_token(i) for i in ids]


def marker(turns: int, answer: str) -> str:
    """The prompt marker that scripts an episode of `turns` assistant turns ending in `answer`."""
    return f"[standin:turns={turns} answer={answer}]"


@dataclass
class StandinLLM:
    """The request handling, independent of the HTTP server (unit-testable without sockets)."""

    tokenizer: Any
    model: str = "standin-policy-v1"
    delay: tuple[float, float] = (2.0, 5.0)
    max_model_len: int = 32768
    seed: int = 0
    served: int = 0
    inflight: int = 0
    peak_inflight: int = 0
    refused: int = 0
    _replies: dict[str, list[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def reply_text(self, prompt_text: str) -> str:
        found = MARKER.search(prompt_text)
        if found is None:
            raise LookupError(f"no [standin:...] marker in the prompt: {prompt_text[-200:]!r}")
        turns, answer = int(found.group(1)), found.group(2)
        turn = prompt_text.count(ASSISTANT_HEADER) - 1
        if turn + 1 < turns:
            return f"Step {turn + 1}: working through the problem before answering."
        call = {"name": "finish", "arguments": {"answer": f"\\boxed{{{answer}}}"}}
        return f"The answer is {answer}. <tool_call>{json.dumps(call)}</tool_call>"

    def reply_ids(self, text: str) -> list[int]:
        """Token IDs of a reply plus EOS, tokenized once per distinct text."""
        ids = self._replies.get(text)
        if ids is None:
            ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.tokenizer.eos_token_id]
            self._replies[text] = ids
        return ids

    def check(self, body: dict[str, Any]) -> tuple[int, str] | None:
        """(status, message) when vLLM would refuse the request, else None."""
        prompt = body.get("prompt")
        if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
            return 400, "prompt: this stand-in takes a list of token IDs"
        if body.get("model") not in (None, self.model):
            return 404, f"The model `{body['model']}` does not exist."
        if body.get("n", 1) != 1 or body.get("stream", False):
            return 400, "n > 1 and streaming are not supported by this stand-in"
        max_tokens = int(body.get("max_tokens") or 16)
        if len(prompt) + max_tokens > self.max_model_len:
            return 400, (
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{len(prompt) + max_tokens} tokens ({len(prompt)} in the messages, {max_tokens} in the completion)."
            )
        return None

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt: list[int] = body["prompt"]
        text = self.tokenizer.decode(prompt, skip_special_tokens=False)
        ids = self.reply_ids(self.reply_text(text))
        max_tokens = int(body.get("max_tokens") or 16)
        finish = "stop"
        if len(ids) > max_tokens:
            ids, finish = ids[:max_tokens], "length"
        logprobs = [-((token * 7 + position) % 13 + 1) / 8.0 for position, token in enumerate(ids)]
        as_ids = body.get("return_tokens_as_token_ids", False)
        choice: dict[str, Any] = {
            "index": 0,
            "text": self.tokenizer.decode(ids, skip_special_tokens=True),
            "logprobs": None,
            "finish_reason": finish,
            "stop_reason": None,
        }
        if body.get("logprobs") is not None:
            tokens = [f"token_id:{t}" for t in ids] if as_ids else self.tokenizer.convert_ids_to_tokens(ids)
            choice["logprobs"] = {"tokens": tokens, "token_logprobs": logprobs}
        if body.get("return_token_ids"):
            choice["token_ids"], choice["prompt_token_ids"] = ids, prompt
        self.served += 1
        return {
            "id": f"cmpl-{self.served}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(ids),
                "total_tokens": len(prompt) + len(ids),
            },
        }

    def next_delay(self) -> float:
        return self._rng.uniform(*self.delay)

    def stats(self) -> dict[str, int]:
        return {
            "served": self.served,
            "inflight": self.inflight,
            "peak_inflight": self.peak_inflight,
            "refused": self.refused,
        }


def create_app(llm: StandinLLM) -> Any:
    """The starlette app serving `llm` under vLLM's routes."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    def error(status: int, message: str) -> JSONResponse:
        kind = {400: "BadRequestError", 404: "NotFoundError"}.get(status, "Error")
        return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)

    async def completions(request: Request) -> JSONResponse:
        try:
            body = json.loads(await request.body())
        except ValueError:
            llm.refused += 1
            return error(400, "the body is not JSON")
        refusal = llm.check(body) if isinstance(body, dict) else (400, "the body is not a JSON object")
        if refusal is not None:
            llm.refused += 1
            return error(*refusal)
        llm.inflight += 1
        llm.peak_inflight = max(llm.peak_inflight, llm.inflight)
        try:
            await asyncio.sleep(llm.next_delay())  # "decoding"
            try:
                return JSONResponse(llm.complete(body))
            except LookupError as exc:
                llm.refused += 1
                return error(400, str(exc))
        finally:
            llm.inflight -= 1

    async def health(_: Request) -> JSONResponse:
        return JSONResponse({})

    async def models(_: Request) -> JSONResponse:
        card = {"id": llm.model, "object": "model", "owned_by": "standin", "root": str(llm.tokenizer.tokenizer_dir)}
        return JSONResponse({"object": "list", "data": [card]})

    async def stats(_: Request) -> JSONResponse:
        return JSONResponse(llm.stats())

    return Starlette(
        routes=[
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/health", health),
            Route("/v1/models", models),
            Route("/stats", stats),
        ]
    )


class StandinProcess:
    """One stand-in server in a child process (so its event loop has a core of its own to share)."""

    def __init__(
        self,
        tokenizer_dir: Path,
        port: int,
        delay: tuple[float, float],
        log_path: Path,
        model: str = "standin-policy-v1",
        seed: int = 0,
    ) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.model = model
        argv = [
            sys.executable,
            "-m",
            "tests.support.standin_llm",
            "--tokenizer",
            str(tokenizer_dir),
            "--port",
            str(port),
            "--delay",
            str(delay[0]),
            str(delay[1]),
            "--model",
            model,
            "--seed",
            str(seed),
        ]
        self._log = log_path.open("wb")
        self.process = subprocess.Popen(argv, cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_healthy(self, timeout: float = 60.0) -> StandinProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the stand-in LLM exited with {self.process.returncode}")
            try:
                if httpx.get(self.url + "/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"the stand-in LLM at {self.url} did not come up in {timeout:.0f}s")

    def stats(self) -> dict[str, int]:
        return httpx.get(self.url + "/stats", timeout=10.0).json()

    def stop(self) -> None:
        stop_process(self.process)
        self._log.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tokenizer",
        type=Path,
        required=True,
        help="local HF tokenizer dir (the agent's; tokenizer.json and tokenizer_config.json)",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default="standin-policy-v1")
    parser.add_argument("--delay", type=float, nargs=2, default=(2.0, 5.0), metavar=("MIN_S", "MAX_S"))
    parser.add_argument("--max-model-len", type=int, default=32768)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import uvicorn

    llm = StandinLLM(
        FastTokenizer(args.tokenizer),
        model=args.model,
        delay=tuple(args.delay),
        max_model_len=args.max_model_len,
        seed=args.seed,
    )
    # backlog: a burst of 200 connects must not overflow the listen queue.
    uvicorn.run(
        create_app(llm),
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        backlog=4096,
        timeout_keep_alive=30,
    )


if __name__ == "__main__":
    main()
