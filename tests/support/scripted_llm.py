"""A scripted test double of a vLLM backend: deterministic multi-turn agent behaviour for tests.

The tiny random model almost never writes a valid tool call, so the loop's tool-call
paths (a call every turn, malformed calls, finish) are driven by this test double
instead; everything about the model itself is tested against real vLLM. It answers
vLLM's token-in/token-out `/inference/v1/generate` (token-ID prompt in, `token_ids`,
`logprobs.content` and `weight_versions` out, `finish_reason`/`stop_reason`) and serves
`/v1/models` with the tokenizer's directory as the model's `root`, as vLLM does. Stateless:

- the script is chosen by a marker `[script:NAME]` anywhere in the prompt's text;
- the turn is the number of assistant headers in the prompt, minus one;
- the reply is that turn's text, tokenized with the real tokenizer, plus EOS,
  cut to the request's `max_tokens` (then `finish_reason: length`, no EOS).

Logprobs are deterministic made-up values. Every request and response is kept in
`exchanges` so tests compare the trajectory with exactly what was served. A script
with an event in `gates` holds every request until the test sets it (`received`
counts requests as they arrive, held or not).

`stream: true` answers as vLLM's generate stream does (one GenerateTokensStreamResponse chunk a
token, the finish on the last, a usage chunk, `[DONE]`). For the streaming tests, a script may
hold its stream after the first token until an event in `holds` is set, and may break off (the
connection closed, as a dying server leaves it) after `breaks[script]` tokens.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from typing import Any

from tests.support.json_backend import JsonBackendHandler

MARKER = re.compile(r"\[script:([A-Za-z0-9_-]+)\]")
ASSISTANT_HEADER = "<|im_start|>assistant"
SCRIPTED_MODEL = "scripted-policy-v1"  # the name it serves


@dataclass
class Exchange:
    prompt: list[int]
    max_tokens: int
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str


@dataclass
class ScriptedLLM:
    tokenizer: Any
    scripts: dict[str, list[str]] = field(default_factory=dict)
    model: str = SCRIPTED_MODEL
    version: str = "1"  # the weight version every reply reports
    exchanges: list[Exchange] = field(default_factory=list)
    gates: dict[str, threading.Event] = field(default_factory=dict)
    holds: dict[str, threading.Event] = field(default_factory=dict)
    breaks: dict[str, int] = field(default_factory=dict)
    received: int = 0
    streams_done: int = 0  # streams that have sent their last token
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        assert self._server is not None, "not started"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = [int(t) for t in body["token_ids"]]
        text = self.tokenizer.decode(prompt, skip_special_tokens=False)
        found = MARKER.search(text)
        if found is None or found.group(1) not in self.scripts:
            raise LookupError(f"no script marker in the prompt: {text[-200:]!r}")
        script = self.scripts[found.group(1)]
        with self._lock:
            self.received += 1
        gate = self.gates.get(found.group(1))
        if gate is not None:
            gate.wait()
        turn = text.count(ASSISTANT_HEADER) - 1
        reply = script[min(turn, len(script) - 1)]
        ids = [*self.tokenizer.encode(reply, add_special_tokens=False), self.tokenizer.eos_token_id]
        max_tokens = int(body["sampling_params"].get("max_tokens") or 16)
        finish = "stop"
        if len(ids) > max_tokens:
            ids, finish = ids[:max_tokens], "length"
        logprobs = [-((token * 7 + position) % 13 + 1) / 8.0 for position, token in enumerate(ids)]
        with self._lock:
            self.exchanges.append(Exchange(prompt, max_tokens, ids, logprobs, finish))
        return {
            "request_id": f"generate-tokens-{len(self.exchanges)}",
            "model": self.model,
            "output_mode": "tokens",
            "choices": [
                {
                    "index": 0,
                    "token_ids": ids,
                    "logprobs": {"content": [{"token_id": t, "logprob": lp} for t, lp in zip(ids, logprobs)]},
                    "weight_versions": [{"version": self.version, "start": 0, "end": len(ids)}],
                    "finish_reason": finish,
                    "stop_reason": None,
                }
            ],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(ids),
                "total_tokens": len(prompt) + len(ids),
            },
        }

    def stream(self, body: dict[str, Any]) -> Iterator[str]:
        """The reply of `complete` as vLLM streams it, chunk by chunk (a LookupError before the first)."""
        whole = self.complete(body)
        script = MARKER.search(self.tokenizer.decode([int(t) for t in body["token_ids"]], skip_special_tokens=False))
        return self._chunks(whole, script.group(1) if script is not None else "")

    def _chunks(self, whole: dict[str, Any], name: str) -> Iterator[str]:
        choice = whole["choices"][0]
        ids, content = choice["token_ids"], choice["logprobs"]["content"]
        for position, (token, entry) in enumerate(zip(ids, content)):
            if position == self.breaks.get(name, -1):
                return  # the connection closes mid-stream, without [DONE]
            last = position == len(ids) - 1
            chunk = {
                "index": 0,
                "token_ids": [token],
                "logprobs": {"content": [entry]},
                "finish_reason": choice["finish_reason"] if last else None,
                "stop_reason": None,
                "weight_versions": choice["weight_versions"] if last else None,
            }
            yield f"data: {json.dumps({'request_id': whole['request_id'], 'choices': [chunk]})}\n\n"
            if position == 0 and name in self.holds:
                self.holds[name].wait(timeout=60)  # a safety net only: the test sets it (or fails: streams_done)
        with self._lock:
            self.streams_done += 1  # counted before the end is sent: whoever reads the end sees it counted
        yield f"data: {json.dumps({'request_id': whole['request_id'], 'choices': [], 'usage': whole['usage']})}\n\n"
        yield "data: [DONE]\n\n"

    def start(self) -> ScriptedLLM:
        llm = self

        class Handler(JsonBackendHandler):
            def models_listing(self) -> dict[str, Any]:
                card = {"id": llm.model, "object": "model", "root": str(llm.tokenizer.name_or_path)}
                return {"object": "list", "data": [card]}

            def do_POST(self) -> None:
                if self.path != "/inference/v1/generate":
                    self.send_json(404, {"detail": "Not Found"})
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                try:
                    if body.get("stream"):
                        chunks = llm.stream(body)
                        self.send_response(200)
                        self.send_header("Content-Type", "text/event-stream")
                        self.end_headers()
                        for chunk in chunks:
                            self.wfile.write(chunk.encode())
                            self.wfile.flush()
                        return
                    self.send_json(200, llm.complete(body))
                except LookupError as exc:
                    self.send_json(400, {"error": {"message": str(exc), "type": "BadRequestError"}})

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True, name="scripted-llm").start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
