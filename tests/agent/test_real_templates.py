"""The agent loop with the chat templates of real model families: every turn token-exact, whatever the template does.

The templates are the models' published ones (tests/fixtures/chat_templates/, SOURCES.md there).
Some rewrite history: Qwen3 drops the reasoning of earlier turns, Llama 3.1 and Mistral trim an
assistant reply's whitespace, Mistral refuses two assistant turns in a row and moves the tool
list to the last user message. The record must still be exactly what the model saw each turn.

Each family's control tokens sit on a byte-level tokenizer (cli/tiny_model.py), so any text
round-trips and the test needs no model hub; the loop is the real one, its model a script.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from cli.tiny_model import build_tokenizer
from shared.tool_schemas import TOOL_SCHEMAS
from shared.trajectory import ASSISTANT, OBSERVATION, Trajectory
from tests.agent.conftest import Unlimited
from tests.support.trajectory_checks import Served, assert_decodes_to_conversation, assert_exact_against_backend
from workers.rollout.agent_loop import AgentLoop, LoopConfig
from workers.rollout.chat_delta import ChatRenderer, tool_instructions_json
from workers.rollout.llm_completion import Completion, Sampling
from workers.rollout.tool_parsers import get_parser
from workers.toolserver.result import ToolResult

TEMPLATES = Path(__file__).parent.parent / "fixtures" / "chat_templates"
TOOL_NAMES = ("bash", "finish")
TOOLS = [s for s in TOOL_SCHEMAS if s["function"]["name"] in TOOL_NAMES]
TASK = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Count the files."}]
CHATML = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def hermes(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def llama_json(name: str, **arguments: Any) -> str:
    return json.dumps({"name": name, "parameters": arguments})


@dataclass(frozen=True)
class Family:
    template: str
    special_tokens: list[str]
    end_of_turn: str  # what the model generates to end its turn
    bos: str | None = None
    parser: str = "hermes"
    kwargs: dict[str, Any] = field(default_factory=dict)
    # The model's text at turn k (the last one calls finish); whitespace and reasoning on purpose.
    reply: Callable[[int, bool], str] = lambda k, last: (
        hermes("finish", answer="3") if last else f"Let me look.\n{hermes('bash', command=f'ls | wc -l # {k}')}"
    )
    rewrites_history: bool = True  # a re-render of the whole conversation differs from what the model saw


def _thinking(k: int, last: bool) -> str:
    call = hermes("finish", answer="3") if last else hermes("bash", command=f"ls | wc -l # {k}")
    return f"<think>\nTurn {k}: I should use a tool.\n</think>\n\n{call}"


def _llama(k: int, last: bool) -> str:
    return "  " + (llama_json("finish", answer="3") if last else llama_json("bash", command=f"ls # {k}")) + "\n"


FAMILIES = {
    "qwen2.5": Family("qwen2.5.jinja", CHATML, "<|im_end|>", rewrites_history=False),
    "qwen3-thinking": Family("qwen3.jinja", CHATML, "<|im_end|>", kwargs={"enable_thinking": True}, reply=_thinking),
    "qwen3-no-thinking": Family("qwen3.jinja", CHATML, "<|im_end|>", kwargs={"enable_thinking": False}),
    "llama3.1": Family(
        "llama3.1.jinja",
        [
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
            "<|eom_id|>",
            "<|python_tag|>",
        ],
        "<|eot_id|>",
        bos="<|begin_of_text|>",
        parser="llama3_json",
        reply=_llama,
    ),
    "mistral": Family(
        "mistral.jinja",
        [
            "<s>",
            "</s>",
            "[INST]",
            "[/INST]",
            "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]",
            "[TOOL_RESULTS]",
            "[/TOOL_RESULTS]",
            "[TOOL_CALLS]",
        ],
        "</s>",
        bos="<s>",
    ),
    "smollm2": Family("smollm2.jinja", CHATML, "<|im_end|>", rewrites_history=False),
}


def tokenizer_for(family: Family) -> Any:
    return build_tokenizer(
        special_tokens=family.special_tokens,
        chat_template=(TEMPLATES / family.template).read_text(),
        eos_token=family.end_of_turn,
        bos_token=family.bos,
        pad_token=family.special_tokens[0],
    )


class ScriptedModel:
    """The loop's `generate`: the family's replies as token ids, each ended by its end-of-turn token."""

    def __init__(self, renderer: ChatRenderer, family: Family, turns: int) -> None:
        self.renderer, self.family, self.turns = renderer, family, turns
        self.served: list[Served] = []

    def __call__(self, prompt: list[int], sampling: Sampling) -> Completion:
        k = len(self.served)
        tokenizer = self.renderer.tokenizer
        ids = self.renderer.encode(self.family.reply(k, k == self.turns - 1))
        ids.append(tokenizer.convert_tokens_to_ids(self.family.end_of_turn))
        logprobs = [-0.01 * (i + 1) for i in range(len(ids))]
        self.served.append(Served(list(prompt), ids, logprobs, sampling.max_tokens))
        return Completion(
            token_ids=ids,
            logprobs=logprobs,
            text=self.renderer.decode(ids),
            finish_reason="stop",
            stop_reason=None,
            model="scripted",
            backend_id="b0",
            prompt_tokens=len(prompt),
            cached_tokens=None,
            latency_s=0.0,
            attempts=1,
        )


def run_loop(
    family: Family, turns: int = 3, tokenizer: Any = None, **config: Any
) -> tuple[Trajectory, ChatRenderer, ScriptedModel]:
    """`tokenizer`: a real model's (default: the family's tokens and template on the byte-level tokenizer)."""
    parser = get_parser(family.parser)
    renderer = ChatRenderer(
        tokenizer or tokenizer_for(family),
        TOOLS,
        tool_instructions_json(TOOLS, parser.call_format),
        template_kwargs=family.kwargs,
    )
    model = ScriptedModel(renderer, family, turns)
    outputs = iter(f"{n} files\n" for n in range(1, 100))

    def run_tool(name: str, arguments: dict[str, Any], timeout: float) -> ToolResult:
        return ToolResult(output=next(outputs))

    settings = {"max_turns": 8, "max_context_tokens": 16000, "max_tokens_per_turn": 400, "allowed_tools": TOOL_NAMES}
    loop = AgentLoop(
        renderer, parser, model, run_tool, LoopConfig(**{**settings, **config}), Sampling(max_tokens=400), Unlimited()
    )
    return loop.run(TASK), renderer, model


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_turn_is_what_the_model_saw_and_the_mask_is_its_own_tokens(name: str) -> None:
    family = FAMILIES[name]
    record, renderer, model = run_loop(family)

    assert record.stop_reason == "finish" and record.answer == "3"
    assert [t.role for t in record.turns].count(ASSISTANT) == 3
    # Each call saw exactly the record before it; generated spans and logprobs verbatim; the loss
    # mask is exactly the generated tokens (the end-of-turn token the model wrote included).
    assert_exact_against_backend(record, model.served)
    # decode(token_ids) round-trips: it is every piece's text in order, and it encodes back.
    text = renderer.decode(record.token_ids)
    assert text == "".join(t.text for t in record.turns)
    assert renderer.tokenizer.encode(text, add_special_tokens=False) == record.token_ids
    # The tool results reached the model, and each observation ends with the template's generation prompt.
    assert all(f"{n} files" in text for n in (1, 2))
    opened = renderer.render([TASK[1]], add_generation_prompt=True)
    generation_prompt = opened[len(renderer.render([TASK[1]], add_generation_prompt=False)) :]
    for turn in record.turns:
        if turn.role == OBSERVATION:
            assert turn.text.endswith(generation_prompt), (turn.text, generation_prompt)
    if not family.rewrites_history:  # then the record is also the template's render of the conversation
        assert_decodes_to_conversation(record, renderer, TASK)


def _thinks_then_answers_without_a_tool(k: int, last: bool) -> str:
    """Turn 1 calls no tool, so a user nudge follows: the message after which Qwen3 drops earlier reasoning."""
    return _thinking(k, last).split("<tool_call>")[0] + "I am not sure yet." if k == 1 else _thinking(k, last)


def test_qwen3_keeps_the_reasoning_the_model_saw_where_a_re_render_drops_it() -> None:
    family = replace(FAMILIES["qwen3-thinking"], reply=_thinks_then_answers_without_a_tool)
    record, renderer, model = run_loop(family, stop_on_no_tool_call=False)
    assert_exact_against_backend(record, model.served)
    text = renderer.decode(record.token_ids)
    assert "Turn 0: I should use a tool." in text and "Turn 1: I should use a tool." in text
    assert any(m["role"] == "user" for t in record.turns if t.role == OBSERVATION for m in t.messages)
    history = [*TASK]
    for turn in record.turns[1:]:
        if turn.role == ASSISTANT:
            history.append({"role": "assistant", "content": turn.text.removesuffix("<|im_end|>")})
        else:
            history.extend(turn.messages)
    rerendered = renderer.render(history, add_generation_prompt=False)
    assert "Turn 0: I should use a tool." not in rerendered, "the template rewrites history: a re-render differs"


def test_qwen3_without_thinking_opens_every_turn_with_an_empty_think_block() -> None:
    record, _, _ = run_loop(FAMILIES["qwen3-no-thinking"])
    assert record.turns[0].text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    observations = [t for t in record.turns if t.role == OBSERVATION]
    assert observations and all(t.text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") for t in observations)


def test_llama_keeps_the_whitespace_the_model_generated() -> None:
    """Llama 3.1's template trims replies; the record keeps the model's own tokens and the job goes on."""
    record, _renderer, _ = run_loop(FAMILIES["llama3.1"])
    first = next(t for t in record.turns if t.role == ASSISTANT)
    assert first.text.startswith("  {") and first.text.endswith("\n<|eot_id|>")
    observation = next(t for t in record.turns if t.role == OBSERVATION)
    # The template writes a tool result as JSON (a string is `iterable` to Jinja): as published.
    assert observation.text == (
        '<|start_header_id|>ipython<|end_header_id|>\n\n"1 files\\n"<|eot_id|>'
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_mistral_tool_results_carry_call_ids_its_template_accepts() -> None:
    record, _, _ = run_loop(FAMILIES["mistral"])
    observation = next(t for t in record.turns if t.role == OBSERVATION)
    assert observation.text.startswith('[TOOL_RESULTS] {"content": 1 files\n, "call_id": "call00001"}[/TOOL_RESULTS]')
