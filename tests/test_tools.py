"""cpuformer._tools: tool calls read out of chat replies (hermes, Llama 3 JSON, Mistral) and a
stream's text held back while it may be a call."""
from __future__ import annotations

import json

import numpy as np
import pytest

from cpuformer._tools import ToolCall, ToolStream, detect_format, parse_tool_calls

WEATHER = ToolCall("get_weather", json.dumps({"city": "Paris", "unit": "celsius"}))
TIME = ToolCall("get_time", json.dumps({"zone": "CET"}))


def test_detect_format_from_the_template():
    assert detect_format("... <tool_call>\n{\"name\": <function-name>, ...}\n</tool_call> ...") == "hermes"
    assert detect_format("{{ '[AVAILABLE_TOOLS]' }} ... [TOOL_CALLS]") == "mistral"
    assert detect_format("Environment: ipython\n ... <|python_tag|>") == "llama3_json"
    assert detect_format("{% for message in messages %}{{ message['content'] }}{% endfor %}") is None


@pytest.mark.parametrize("text, content, calls", [
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>',
     None, [WEATHER]),
    ('Let me look.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
     '</tool_call>\n<tool_call>{"name": "get_time", "arguments": {"zone": "CET"}}</tool_call>',
     "Let me look.", [WEATHER, TIME]),
    # arguments written as a JSON string; the closing tag missing at the end of the reply
    ('<tool_call>{"name": "get_time", "arguments": "{\\"zone\\": \\"CET\\"}"}', None, [TIME]),
])
def test_hermes_calls(text, content, calls):
    assert parse_tool_calls("hermes", text) == (content, calls)


@pytest.mark.parametrize("text", [
    "The weather is fine.",
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Par',  # cut off
    '<tool_call>{"arguments": {}}</tool_call>',  # no name
    '<tool_call>{"name": "f", "arguments": [1]}</tool_call>',  # arguments not an object
    '<tool_call>{"name": "f", "arguments": {}}</tool_call> and then some text',
    '<tool_call>{"name": "f"} {"name": "g"}</tool_call>',  # two objects in one block
])
def test_malformed_hermes_replies_are_content(text):
    assert parse_tool_calls("hermes", text) == (text, [])


def test_llama3_json_and_mistral_calls():
    assert parse_tool_calls("llama3_json", ' {"name": "get_weather", "parameters": {"city": "Paris", '
                                           '"unit": "celsius"}}') == (None, [WEATHER])
    assert parse_tool_calls("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris", "unit": '
                                           '"celsius"}}; {"name": "get_time", "parameters": {"zone": "CET"}}') \
        == (None, [WEATHER, TIME])
    for text in ("Paris is sunny.", '{"name": "get_weather", "parameters": {"city": "Paris"', '{"city": "Paris"}',
                 '{"name": "f", "parameters": {}} trailing'):
        assert parse_tool_calls("llama3_json", text) == (text, [])
    calls = '[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}, ' \
            '{"name": "get_time", "arguments": {"zone": "CET"}}]'
    assert parse_tool_calls("mistral", calls) == (None, [WEATHER, TIME])
    assert parse_tool_calls("mistral", "[TOOL_CALLS]" + calls) == (None, [WEATHER, TIME])
    for text in ("[1, 2]", "[citation needed]", '{"name": "f", "arguments": {}}'):
        assert parse_tool_calls("mistral", text) == (text, [])
    with pytest.raises(ValueError, match="tool-call format must be one of hermes, llama3_json, mistral, got 'x'"):
        parse_tool_calls("x", "")


REPLIES = {
    "hermes": ['Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
               '</tool_call>', "No calls here, only a < sign and <tool text.", "<tool_call>{broken",
               '<tool_call>{"name": "get_time", "arguments": {"zone": "CET"}}</tool_call>'],
    "llama3_json": ['{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}', "Plain {text}.",
                    '  {"not": "a call"}'],
    "mistral": ['[{"name": "get_time", "arguments": {"zone": "CET"}}]', "Plain [text].", "[1, 2"],
}


@pytest.mark.parametrize("fmt", list(REPLIES))
def test_a_stream_releases_content_and_holds_calls(fmt):
    """Whatever the pieces: the released text and finish()'s rest are the reply's content (the
    whole reply when it holds no call) and never any part of a call."""
    rng = np.random.default_rng(0)
    for reply in REPLIES[fmt]:
        content, calls = parse_tool_calls(fmt, reply)
        for _ in range(20):
            cuts = sorted(set(rng.integers(0, len(reply) + 1, int(rng.integers(0, 8))).tolist()))
            pieces = [reply[a:b] for a, b in zip([0] + cuts, cuts + [len(reply)])]
            stream = ToolStream(fmt)
            released = "".join(stream.feed(p) for p in pieces)
            if calls:
                assert "{" not in released and "<tool_call>" not in released, (reply, pieces, released)
            rest, got = stream.finish()
            assert got == calls
            assert (released + rest).strip() == (content or "").strip() if calls else released + rest == reply


def test_a_hermes_stream_releases_text_before_the_marker_as_it_comes():
    stream = ToolStream("hermes")
    assert stream.feed("Let me ") == "Let me "
    assert stream.feed("check <to") == "check "  # "<to" may begin the marker
    assert stream.feed("ol_call>{") == ""
    assert stream.feed('"name": "get_time", "arguments": {"zone": "CET"}}</tool_call>') == ""
    assert stream.finish() == ("", [TIME])
    plain = ToolStream("hermes")
    assert plain.feed("a <to") == "a "
    assert plain.feed("p> b") == "<top> b"
    assert plain.finish() == ("", [])
