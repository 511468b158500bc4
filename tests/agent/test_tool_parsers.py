"""Tool-call parsers: well-formed calls come out as name + arguments, malformed ones as errors, never raise."""

from __future__ import annotations

import pytest

from workers.rollout.tool_parsers import get_parser, known_parsers


def test_the_registry_ships_two_formats() -> None:
    assert {"hermes", "llama3_json"} <= set(known_parsers())
    with pytest.raises(KeyError, match="unknown tool parser"):
        get_parser("nope")


def test_hermes_finds_every_block_and_keeps_the_text_around_them() -> None:
    text = (
        'Let me look.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>\n'
        '<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"1+1\\"}"}</tool_call>'
    )
    result = get_parser("hermes").parse(text)
    assert result.content == "Let me look."
    assert [(c.name, c.arguments, c.error) for c in result.calls] == [
        ("bash", {"command": "ls -la"}, None),
        ("python", {"code": "1+1"}, None),  # arguments as a JSON string, OpenAI style
    ]
    assert result.calls[0].raw.startswith("<tool_call>") and result.calls[0].raw.endswith("</tool_call>")


@pytest.mark.parametrize(
    "text, error",
    [
        ("<tool_call>{not json}</tool_call>", "not valid JSON"),
        ('<tool_call>["bash"]</tool_call>', "must be a JSON object"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'no "name"'),
        ('<tool_call>{"name": "bash", "arguments": [1]}</tool_call>', "must be a JSON object"),
        ('<tool_call>{"name": "bash", "arguments": "{oops"}</tool_call>', "not valid JSON"),
        ('<tool_call>{"name": "bash", "arguments": {"command": "ls"}}', "without a closing"),
    ],
)
def test_hermes_malformed_calls_become_errors(text: str, error: str) -> None:
    [call] = get_parser("hermes").parse(text).calls
    assert not call.ok and error in call.error


def test_hermes_text_without_calls_has_none() -> None:
    result = get_parser("hermes").parse("The answer is 4.")
    assert result.calls == [] and result.content == "The answer is 4."


def test_llama3_json_calls_with_and_without_python_tag() -> None:
    parser = get_parser("llama3_json")
    [call] = parser.parse('{"name": "bash", "parameters": {"command": "pwd"}}').calls
    assert (call.name, call.arguments) == ("bash", {"command": "pwd"})
    text = '<|python_tag|>{"name": "view", "parameters": {"path": "a"}}; {"name": "finish", "parameters": {}}'
    calls = parser.parse(text).calls
    assert [(c.name, c.arguments) for c in calls] == [("view", {"path": "a"}), ("finish", {})]


@pytest.mark.parametrize(
    "text, error",
    [
        ('{"name": "bash", "parameters": {"command": ', "not valid JSON"),
        ('{"parameters": {}}', 'no "name"'),
        ('{"name": "bash", "parameters": {}} and then some', "unexpected text"),
        ("<|python_tag|>print(1)", "expected a JSON tool call"),
    ],
)
def test_llama3_json_malformed_calls_become_errors(text: str, error: str) -> None:
    calls = get_parser("llama3_json").parse(text).calls
    assert calls and not calls[-1].ok and error in calls[-1].error


def test_llama3_json_plain_text_is_content() -> None:
    result = get_parser("llama3_json").parse("I think the answer is 7.")
    assert result.calls == [] and result.content == "I think the answer is 7."


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>" + "[" * 100_000 + "</tool_call>",  # RecursionError inside json
        '<tool_call>{"name": "bash", "arguments": {"n": ' + "7" * 5000 + "}}</tool_call>",  # int over 4300 digits
        '<tool_call>{"name": "bash", "arguments": "' + "[" * 100_000 + '"}</tool_call>',
        '<tool_call>{"name": "bash", "arguments": "{\\"n\\": ' + "7" * 5000 + '}"}</tool_call>',
    ],
    ids=["deep", "huge_int", "deep_string_arguments", "huge_int_string_arguments"],
)
def test_json_that_hits_a_decoder_limit_is_a_malformed_call(text: str) -> None:
    result = get_parser("hermes").parse(text)
    assert len(result.calls) == 1 and result.calls[0].error and "not valid JSON" in result.calls[0].error


@pytest.mark.parametrize(
    "body",
    ['{"name": "bash", "parameters": ' + "[" * 100_000, '{"name": "bash", "parameters": {"n": ' + "7" * 5000 + "}}"],
)
def test_llama3_json_decoder_limits_are_malformed_calls(body: str) -> None:
    result = get_parser("llama3_json").parse(body)
    assert len(result.calls) == 1 and "not valid JSON" in (result.calls[0].error or "")


STREAMED_REPLIES = [
    "Hello there.",
    'Let me look.  \n<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>\nThen more.',
    'Broken: <tool_call>{"name": "bash"',  # unclosed: the reply comes back whole, as text
    '<tool_call>{"name": "bash", "arguments": {}}</tool_call>',
    "\n\nLeading whitespace, then <tool_call>{bad json}</tool_call>",
    '{"name": "bash", "parameters": {"command": "ls"}}',
    '<|python_tag|>{"name": "bash", "parameters": {}}',
    "  plain words for llama3",
]


@pytest.mark.parametrize("name", ["hermes", "llama3_json"])
@pytest.mark.parametrize("reply", STREAMED_REPLIES)
def test_what_a_parser_streams_of_an_unfinished_reply_always_begins_the_finished_replys_content(
    name: str, reply: str
) -> None:
    """The session streams `streamable(text so far)`: it must never be taken back, whatever follows. The content an
    agent gets is the parsed content, or the whole reply when a call is malformed (session.py, as vLLM does)."""
    parser = get_parser(name)
    parsed = parser.parse(reply)
    content = reply if any(call.error for call in parsed.calls) else parsed.content
    sent = ""
    for end in range(len(reply) + 1):
        shown = parser.streamable(reply[:end])
        assert shown.startswith(sent) or not shown, (reply[:end], shown, sent)
        sent = max(sent, shown, key=len)
        assert content.startswith(sent), (reply[:end], sent, content)
    if parsed.calls:
        assert {"hermes": "<tool_call>", "llama3_json": "{"}[name] not in sent, "a call's text is never streamed"
