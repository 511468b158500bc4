"""Token-in/token-out generation on the CPU with a KV prefix cache.

The engine is what vLLM's engine is to its OpenAI server, reduced to what the rollout
service uses: a token-ID prompt in, sampled token IDs and their logprobs out. The prefix
cache keeps the KV cache of recently seen sequences; a prompt that extends one (the next
turn of a trajectory, or another sample of the same prompt) only runs the new tokens
through the model, which is what makes sticky routing measurably faster.
"""

from __future__ import annotations

import copy
import random
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import torch


class EngineRequestError(ValueError):
    """The request cannot be served as asked (vLLM answers these with a 400)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class SamplingParams:
    """The subset of vLLM's SamplingParams this engine honours, with vLLM's defaults."""

    max_tokens: int | None = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off, as in vLLM
    min_p: float = 0.0
    seed: int | None = None
    n: int = 1
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True


@dataclass
class Sample:
    """One generated sequence: tokens, the logprob of each, and why it ended."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[dict[int, float]] = field(default_factory=list)
    text: str = ""
    finish_reason: str = "length"
    stop_reason: int | str | None = None


@dataclass
class Generation:
    samples: list[Sample]
    prompt_tokens: int
    cached_tokens: int
    first_token_s: float
    total_s: float
    version: str = ""  # the policy version (served model name) of the weights that generated it


@dataclass
class _Entry:
    tokens: torch.Tensor  # 1-D, the sequence whose KV the cache holds
    cache: object  # transformers DynamicCache of exactly len(tokens) positions


class PrefixCache:
    """LRU of KV caches keyed by the token sequence they cover; lookup finds the longest shared prefix."""

    def __init__(self, entries: int, max_tokens: int = 1 << 18) -> None:
        self.capacity = entries
        self.max_tokens = max_tokens  # bounds memory: a real HF model's KV per token is large
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._next = 0
        self._tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def longest_prefix(self, prompt: torch.Tensor) -> tuple[int, object | None]:
        """(shared length, a private copy of that entry's cache cropped to it), or (0, None)."""
        best_key, best_len = None, 0
        for key, entry in self._entries.items():
            n = min(len(entry.tokens), len(prompt))
            if n <= best_len:
                continue
            same = entry.tokens[:n] == prompt[:n]
            shared = n if bool(same.all()) else int(torch.argmin(same.to(torch.int8)))
            if shared > best_len:
                best_key, best_len = key, shared
        if best_key is None:
            return 0, None
        entry = self._entries[best_key]
        self._entries.move_to_end(best_key)
        cache = copy.deepcopy(entry.cache)
        surplus = len(entry.tokens) - best_len
        if surplus:
            cache.crop(-surplus)
        return best_len, cache

    def put(self, tokens: torch.Tensor, cache: object) -> None:
        if self.capacity <= 0 or len(tokens) == 0:
            return
        # An entry that is a prefix of the new one is now redundant.
        for key in [k for k, e in self._entries.items()
                    if len(e.tokens) <= len(tokens) and torch.equal(e.tokens, tokens[: len(e.tokens)])]:
            self._tokens -= len(self._entries.pop(key).tokens)
        self._entries[self._next] = _Entry(tokens.clone(), cache)
        self._tokens += len(tokens)
        self._next += 1
        while len(self._entries) > 1 and (len(self._entries) > self.capacity or self._tokens > self.max_tokens):
            self._tokens -= len(self._entries.popitem(last=False)[1].tokens)


class Engine:
    """Serialises generation (one CPU model, one lock) and owns the prefix cache."""

    def __init__(self, model, tokenizer, max_model_len: int, cache_entries: int,
                 logprobs_mode: str = "raw_logprobs", cache_tokens: int = 1 << 18, version: str = "") -> None:
        if logprobs_mode not in ("raw_logprobs", "processed_logprobs"):
            raise ValueError(f"unknown logprobs mode {logprobs_mode!r}")
        self.model = model
        self.version = version
        self.tokenizer = tokenizer
        self.vocab_size = int(model.config.vocab_size)
        self.max_model_len = max_model_len
        self.logprobs_mode = logprobs_mode
        self.prefix_cache = PrefixCache(cache_entries, cache_tokens)
        self.eos_token_id = tokenizer.eos_token_id
        self._lock = threading.Lock()
        self._count_lock = threading.Lock()  # the request threads update the gauges concurrently
        self.waiting = 0
        self.running = 0

    def _count(self, waiting: int, running: int) -> None:
        with self._count_lock:
            self.waiting += waiting
            self.running += running

    def generate(self, prompt: list[int], params: SamplingParams) -> Generation:
        self._validate(prompt, params)
        self._count(1, 0)
        with self._lock:
            self._count(-1, 1)
            try:
                with torch.inference_mode():
                    return self._generate(prompt, params)
            finally:
                self._count(0, -1)

    def load_model(self, model, version: str) -> None:
        """Swap in new weights between requests: the one in flight finishes on the old ones.

        The prefix cache is cleared in the same critical section, since its KV entries were
        computed by the old weights and would silently mix two policies into one generation.
        """
        if int(model.config.vocab_size) != self.vocab_size:
            raise EngineRequestError(
                f"the new model's vocabulary ({model.config.vocab_size}) differs from the served one "
                f"({self.vocab_size}); the tokenizer stays, so the weights must fit it", "path")
        with self._lock:
            self.model = model.eval()
            self.version = version
            self.prefix_cache = PrefixCache(self.prefix_cache.capacity, self.prefix_cache.max_tokens)

    def _validate(self, prompt: list[int], params: SamplingParams) -> None:
        if not prompt:
            raise EngineRequestError("the prompt is empty", "prompt")
        bad = [t for t in prompt if not 0 <= t < self.vocab_size]
        if bad:
            raise EngineRequestError(f"token id {bad[0]} is out of vocabulary (size {self.vocab_size})", "prompt")
        max_tokens = params.max_tokens if params.max_tokens is not None else self.max_model_len - len(prompt)
        if len(prompt) + max_tokens > self.max_model_len:
            raise EngineRequestError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{len(prompt) + max_tokens} tokens ({len(prompt)} in the messages, {max_tokens} in the "
                "completion). Please reduce the length of the messages or completion.",
                "max_tokens",
            )
        if max_tokens < 1:
            raise EngineRequestError("max_tokens must be at least 1", "max_tokens")

    def _generate(self, prompt: list[int], params: SamplingParams) -> Generation:
        started = time.perf_counter()
        tokens = torch.tensor(prompt, dtype=torch.long)
        # Always run at least the last prompt token: its logits give the first sample.
        cached, cache = self.prefix_cache.longest_prefix(tokens)
        cached = min(cached, len(prompt) - 1)
        if cached <= 0:
            cached, cache = 0, None
        elif cache.get_seq_length() > cached:
            cache.crop(cached - cache.get_seq_length())
        out = self.model(input_ids=tokens[cached:].unsqueeze(0), past_key_values=cache, use_cache=True)
        prefill_cache, prefill_logits = out.past_key_values, out.logits[0, -1].float()
        first_token_s = time.perf_counter() - started

        generator = torch.Generator().manual_seed(params.seed if params.seed is not None else random.getrandbits(63))
        max_tokens = params.max_tokens if params.max_tokens is not None else self.max_model_len - len(prompt)
        samples = []
        for i in range(params.n):
            last = i == params.n - 1
            cache_i = prefill_cache if last else copy.deepcopy(prefill_cache)
            sample, cache_i = self._sample(cache_i, prefill_logits, params, max_tokens, generator)
            covered = torch.tensor(prompt + sample.token_ids[:-1], dtype=torch.long)
            self.prefix_cache.put(covered, cache_i)
            samples.append(sample)
        return Generation(samples, len(prompt), cached, first_token_s, time.perf_counter() - started, self.version)

    def _sample(self, cache, logits: torch.Tensor, params: SamplingParams, max_tokens: int,
                generator: torch.Generator) -> tuple[Sample, object]:
        sample = Sample()
        for step in range(max_tokens):
            raw = torch.log_softmax(logits, dim=-1)
            processed = self._processed_logprobs(logits, params)
            if params.temperature == 0:
                token = int(torch.argmax(logits))
            else:
                token = int(torch.multinomial(processed.exp(), 1, generator=generator))
            reported = raw if self.logprobs_mode == "raw_logprobs" else processed
            sample.token_ids.append(token)
            sample.logprobs.append(float(reported[token]))
            if params.logprobs is not None:
                top = {}
                if params.logprobs > 0:
                    values, ids = torch.topk(reported, min(params.logprobs, self.vocab_size))
                    top = {int(t): float(v) for t, v in zip(ids, values)}
                top[token] = float(reported[token])
                sample.top_logprobs.append(top)
            if self._stopped(sample, token, step, params):
                break
            if step + 1 < max_tokens:
                out = self.model(input_ids=torch.tensor([[token]]), past_key_values=cache, use_cache=True)
                cache, logits = out.past_key_values, out.logits[0, -1].float()
        if not sample.text:
            sample.text = self.tokenizer.decode(sample.token_ids, skip_special_tokens=params.skip_special_tokens)
        return sample, cache

    def _processed_logprobs(self, logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
        """Log-probabilities of the distribution actually sampled from (temperature, top-k, top-p, min-p)."""
        scaled = logits / params.temperature if params.temperature > 0 else logits.clone()
        if params.top_k and params.top_k > 0 and params.top_k < scaled.numel():
            kth = torch.topk(scaled, params.top_k).values[-1]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        probs = torch.softmax(scaled, dim=-1)
        if params.min_p > 0:
            scaled = scaled.masked_fill(probs < params.min_p * probs.max(), float("-inf"))
            probs = torch.softmax(scaled, dim=-1)
        if params.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            outside = (torch.cumsum(sorted_probs, dim=-1) - sorted_probs) > params.top_p
            scaled = scaled.masked_fill(torch.zeros_like(outside).scatter(0, order, outside), float("-inf"))
        return torch.log_softmax(scaled, dim=-1)

    def _stopped(self, sample: Sample, token: int, step: int, params: SamplingParams) -> bool:
        if step + 1 < params.min_tokens:
            return False
        if token in params.stop_token_ids:
            sample.finish_reason, sample.stop_reason = "stop", token
            return True
        if token == self.eos_token_id and not params.ignore_eos:
            sample.finish_reason, sample.stop_reason = "stop", None
            return True
        if params.stop:
            text = self.tokenizer.decode(sample.token_ids, skip_special_tokens=params.skip_special_tokens)
            for stop in params.stop:
                at = text.find(stop)
                if at >= 0:
                    sample.text = text[: at + len(stop)] if params.include_stop_str_in_output else text[:at]
                    sample.finish_reason, sample.stop_reason = "stop", stop
                    return True
        return False
