"""The CPU engine in-process: the prefix cache changes speed, never results; bootstrap is deterministic."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cpu_backend.bootstrap import build_tiny_model, build_tokenizer, load
from cpu_backend.engine import Engine, EngineRequestError, PrefixCache, SamplingParams


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path):
    return load(tiny_model_dir)


def engine(loaded, cache_entries: int, **kwargs: object) -> Engine:
    tokenizer, model = loaded
    return Engine(model, tokenizer, max_model_len=2048, cache_entries=cache_entries, **kwargs)


def test_prefix_cache_reuse_gives_identical_tokens_and_logprobs(loaded) -> None:
    cached, uncached = engine(loaded, 8), engine(loaded, 0)
    params = SamplingParams(max_tokens=8, seed=5, ignore_eos=True)
    history = {id(cached): [257, 104, 105, 258, 10], id(uncached): [257, 104, 105, 258, 10]}
    hits = []
    for turn in range(3):
        outputs = {}
        for e in (cached, uncached):
            gen = e.generate(history[id(e)], params)
            outputs[id(e)] = gen.samples[0]
            history[id(e)] += gen.samples[0].token_ids + [10, 257, 100 + turn, 10]
            if e is cached:
                hits.append(gen.cached_tokens)
        a, b = outputs[id(cached)], outputs[id(uncached)]
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    assert hits[0] == 0 and all(h > 0 for h in hits[1:]), hits


def test_n_samples_share_the_prefill_and_differ(loaded) -> None:
    gen = engine(loaded, 8).generate([257, 104, 258], SamplingParams(max_tokens=6, n=3, seed=1, ignore_eos=True))
    assert len(gen.samples) == 3
    assert len({tuple(s.token_ids) for s in gen.samples}) > 1


def test_processed_logprobs_follow_the_sampling_distribution(loaded) -> None:
    greedy_like = SamplingParams(max_tokens=4, top_k=1, seed=0, ignore_eos=True)
    processed = engine(loaded, 0, logprobs_mode="processed_logprobs").generate([104, 105], greedy_like)
    assert processed.samples[0].logprobs == [0.0] * 4, "top_k=1 leaves one token with probability 1"
    raw = engine(loaded, 0).generate([104, 105], greedy_like)
    assert raw.samples[0].token_ids == processed.samples[0].token_ids
    assert all(v < 0 for v in raw.samples[0].logprobs)


def test_requests_the_model_cannot_serve_are_rejected(loaded) -> None:
    e = engine(loaded, 0)
    with pytest.raises(EngineRequestError, match="maximum context length"):
        e.generate([104] * 2000, SamplingParams(max_tokens=100))
    with pytest.raises(EngineRequestError, match="out of vocabulary"):
        e.generate([104, 10_000], SamplingParams())


def test_prefix_cache_evicts_to_its_token_budget() -> None:
    cache = PrefixCache(entries=10, max_tokens=100)
    for start in (0, 1000, 2000):
        cache.put(torch.arange(start, start + 60), object())
    assert len(cache) == 1, "60 + 60 tokens exceed the budget: only the newest entry stays"
    cache.put(torch.arange(2000, 2090), object())
    assert len(cache) == 1, "an entry extending another replaces it"


def test_tiny_model_build_is_deterministic_per_seed() -> None:
    tokenizer = build_tokenizer()
    a, b, c = (build_tiny_model(tokenizer, seed, 256).state_dict() for seed in (3, 3, 4))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)
    assert tokenizer.decode(tokenizer.encode("héllo ✓")) == "héllo ✓"
