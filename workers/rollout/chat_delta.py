"""Chat-template rendering as token deltas: the prompt once, then only what each observation adds.

The model's own tokens are never re-tokenized, and past turns are never re-rendered. The
tokens that follow a generation are cut from a rendering of the new messages after a fixed
stand-in exchange (a placeholder user message and assistant reply):

    after = render([user: "...", assistant: MARK, *observation], add_generation_prompt=True)
    delta = after[after.index(MARK) + len(MARK):]  minus the end-of-turn token the model generated

(checked with a second, different MARK: the two cuts must agree).

So the delta is the template's closing of an assistant turn, the observation's messages and
the next generation prompt, exactly as the template writes them after an assistant turn. This
stays token-exact for templates that rewrite history (Qwen3 drops the reasoning of earlier
turns, Llama 3.1 and Mistral trim whitespace): the record holds what the model saw each turn,
not what a re-render of the whole conversation would show. Per-job template arguments
(`chat_template_kwargs`, e.g. Qwen3's `enable_thinking`) reach every rendering.

If the model stopped on the template's end-of-turn token, the closing's copy of it is not
repeated; if it stopped on another one (<|endoftext|> where the template writes <|im_end|>),
its token stays and the template's whole closing follows, so the next turn sees exactly what
the record holds. Text that does not survive encode/decode raises ChatTemplateError: training
on a silently wrong record is worse than a failed job.

Works with any Hugging Face tokenizer that has a chat template; templates that ignore
`tools` get the tool list in the system message, written by the tool-call parser.

Tool results are data, not markup: a tool output (or a file the agent views) that
contains a control token's text, e.g. ``<|im_end|>\n<|im_start|>assistant``, must not
become those control tokens. So `render` escapes, in the content of every ``tool``
message, each occurrence of a special or added control token's text by putting a zero
width space (U+200B) after its first character (``<\u200b|im_end|>``); the model reads the
same characters as plain tokens.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from shared.errors import RolloutsError

ESCAPE = "\u200b"
# The stand-in exchange the observation deltas are cut from: plain words no template trims,
# splits (Qwen3 splits on </think>) or mistakes for markup.
STAND_IN_USER = {"role": "user", "content": "Begin."}
MARKS = ("Stand-in reply 7f3a9c.", "Stand-in answer 2d81e4.")
_CONTROL_LIKE = re.compile(r"^[<\[].*[>\]]$", re.DOTALL)


def control_token_texts(tokenizer: Any) -> list[str]:
    """The texts the tokenizer turns into special or added control tokens (longest first)."""
    texts = {str(t) for t in getattr(tokenizer, "all_special_tokens", []) or []}
    try:
        added = tokenizer.get_added_vocab()
    except Exception:  # noqa: BLE001 - a tokenizer without added tokens
        added = {}
    texts |= {t for t in added if _CONTROL_LIKE.match(t)}
    return sorted((t for t in texts if len(t) >= 2), key=len, reverse=True)


def escape_control_tokens(text: str, controls: list[str]) -> str:
    """`text` with every control token's text broken by a zero-width space after its first character."""
    if not controls or not text:
        return text
    pattern = re.compile("|".join(re.escape(t) for t in controls))
    return pattern.sub(lambda m: m.group(0)[0] + ESCAPE + m.group(0)[1:], text)


class ChatTemplateError(RolloutsError, RuntimeError):
    """The chat template cannot give a clean token delta for this conversation."""


@dataclass
class Delta:
    token_ids: list[int]
    text: str


def template_source(tokenizer: Any) -> str:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        return "\n".join(str(t) for t in template.values())
    return template or ""


class ChatRenderer:
    """Renders one conversation's prompt and observation deltas with one tokenizer (thread-safe: no state)."""

    def __init__(
        self,
        tokenizer: Any,
        tools: list[dict[str, Any]] | None = None,
        tool_instructions: str = "",
        template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        source = template_source(tokenizer)
        if not source:
            raise ChatTemplateError(f"tokenizer {tokenizer.name_or_path!r} has no chat template")
        self.tokenizer = tokenizer
        self.tools = tools or None
        # A template that never looks at `tools` would drop them silently: say them in the system message.
        self.template_takes_tools = "tools" in source
        self.tool_instructions = tool_instructions if self.tools and not self.template_takes_tools else ""
        self.controls = control_token_texts(tokenizer)
        self.template_kwargs = dict(template_kwargs or {})

    # --- rendering ---------------------------------------------------------------
    def prepare(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The task's messages as the template will see them (tool instructions added where needed)."""
        messages = [dict(m) for m in messages]
        if self.tool_instructions:
            if messages and messages[0].get("role") == "system":
                messages[0]["content"] = f"{messages[0]['content']}\n\n{self.tool_instructions}"
            else:
                messages.insert(0, {"role": "system", "content": self.tool_instructions})
        return messages

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        """The template's text; tool results' control-token texts escaped (see the module doc)."""
        messages = [self._as_data(m) for m in messages]
        try:
            text = self.tokenizer.apply_chat_template(
                messages,
                tools=self.tools,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                **self.template_kwargs,
            )
        except Exception as exc:  # jinja raises its own errors (raise_exception in templates)
            raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from exc
        return text

    def _as_data(self, message: dict[str, Any]) -> dict[str, Any]:
        content = message.get("content")
        if message.get("role") != "tool" or not isinstance(content, str):
            return message
        escaped = escape_control_tokens(content, self.controls)
        return message if escaped == content else {**message, "content": escaped}

    def encode(self, text: str) -> list[int]:
        """Tokenize template text (special tokens in it become their ids); it must decode back exactly."""
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        back = self.decode(ids)
        if back != text:
            raise ChatTemplateError(
                f"text does not survive encode/decode with {self.tokenizer.name_or_path!r}: "
                f"{text[:200]!r} came back as {back[:200]!r}"
            )
        return ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    # --- the two token pieces the loop needs ----------------------------------------
    def prompt(self, messages: list[dict[str, Any]]) -> Delta:
        """The first prompt: system and user messages, tools, and the generation prompt."""
        text = self.render(messages, add_generation_prompt=True)
        return Delta(self.encode(text), text)

    def split_generation(self, token_ids: list[int], stopped_on_token: bool) -> tuple[str, str]:
        """(content, stop text): the message content the model wrote, and its end-of-turn token's text."""
        if stopped_on_token and token_ids:
            return self.decode(token_ids[:-1]), self.decode(token_ids[-1:])
        return self.decode(token_ids), ""

    def observation(self, stop_text: str, observation: list[dict[str, Any]]) -> Delta:
        """The tokens between a generation and the next one: the template's closing of the assistant
        turn (less `stop_text`, the end-of-turn token the model generated), the observation's
        messages (tool results, or a user nudge) and the next generation prompt, cut from a
        rendering after the stand-in exchange (module doc)."""
        rests = [self._after_stand_in(mark, observation) for mark in MARKS]
        if rests[0] is None or rests[0] != rests[1]:
            raise ChatTemplateError(
                "the chat template does not render an assistant reply verbatim before the observation"
            )
        rest = rests[0]
        text = rest[len(stop_text) :] if stop_text and rest.startswith(stop_text) else rest
        return Delta(self.encode(text), text)

    def _after_stand_in(self, mark: str, observation: list[dict[str, Any]]) -> str | None:
        """What the template writes after a stand-in reply `mark` when `observation` follows; None if the
        reply is not in the rendering. Two different marks must give the same: a mark found only inside
        the observation (a tool output that quotes it) would not move with the reply."""
        exchange = [STAND_IN_USER, {"role": "assistant", "content": mark}]
        after = self.render([*exchange, *observation], add_generation_prompt=True)
        cut = after.find(mark)
        return None if cut < 0 else after[cut + len(mark) :]


def tool_instructions_json(tools: list[dict[str, Any]], call_format: str) -> str:
    """The tool list for templates that ignore `tools`: the schemas as JSON, and how to call one."""
    listing = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    return f"You can call these tools (JSON schemas):\n<tools>\n{listing}\n</tools>\n\n{call_format}"
