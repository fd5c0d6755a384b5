"""Tool calls in chat replies, for ``cpuformer serve``'s OpenAI ``tools`` (docs/serving.md, "Tool
calls"): the format a checkpoint's chat template asks its model to write calls in, the calls read
back out of a reply, and a stream's text held back while it may be a call.

Three formats, the ones chat templates of open models use:

- ``hermes`` (Qwen2.5 / Qwen3, Hermes, many fine-tunes): ``<tool_call>{"name": ..., "arguments":
  {...}}</tool_call>`` blocks after optional text;
- ``llama3_json`` (Llama 3.1 and later): the whole reply is ``{"name": ..., "parameters": {...}}``
  (several separated by ``;``), after the ``<|python_tag|>`` special token when the model writes it;
- ``mistral``: ``[TOOL_CALLS]`` (a special token, gone from decoded text) then a JSON list of
  ``{"name": ..., "arguments": {...}}``.

A reply that does not parse as calls of its format is plain content, returned as the model wrote it.
"""

from __future__ import annotations

import json
import re
from typing import Any, List, NamedTuple, Optional, Tuple

FORMATS = ("hermes", "llama3_json", "mistral")
_HERMES_OPEN, _HERMES_CLOSE = "<tool_call>", "</tool_call>"
_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


class ToolCall(NamedTuple):
    """One function call: its name and its arguments as JSON text of an object (OpenAI's shape)."""

    name: str
    arguments: str


def detect_format(template: str) -> Optional[str]:
    """The format a chat template's tool instructions name, or None (no known one)."""
    if _HERMES_OPEN in template:
        return "hermes"
    if "[TOOL_CALLS]" in template or "[AVAILABLE_TOOLS]" in template:
        return "mistral"
    if "<|python_tag|>" in template or "ipython" in template:
        return "llama3_json"
    return None


def _call(value: Any, arguments_key: str) -> Optional[ToolCall]:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    arguments = value.get(arguments_key, value.get("arguments", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False))


def _json_values(text: str) -> Optional[List[Any]]:
    """The JSON values of text separated by ';' or whitespace, or None if any part is not JSON."""
    decoder = json.JSONDecoder()
    values, at = [], 0
    while True:
        while at < len(text) and (text[at].isspace() or text[at] == ";"):
            at += 1
        if at == len(text):
            return values
        try:
            value, at = decoder.raw_decode(text, at)
        except ValueError:
            return None
        values.append(value)


def call_start(fmt: str, text: str) -> int:
    """Where the reply's tool calls begin (-1: it is plain content)."""
    if fmt == "hermes":
        return text.find(_HERMES_OPEN)
    stripped = len(text) - len(text.lstrip())
    head = text[stripped:]
    if fmt == "llama3_json":
        return stripped if head.startswith("{") else -1
    return stripped if head.startswith(("[", "[TOOL_CALLS]")) else -1


def parse_tool_calls(fmt: str, text: str) -> Tuple[Optional[str], List[ToolCall]]:
    """(content, calls) of a whole reply: the text before the calls (None when there is none) and
    the calls; (text, []) when the reply holds no well-formed call of the format."""
    if fmt not in FORMATS:
        raise ValueError(f"tool-call format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    start = call_start(fmt, text)
    if start < 0:
        return text, []
    calls: List[ToolCall] = []
    if fmt == "hermes":
        for block in _HERMES_BLOCK.findall(text[start:]):
            values = _json_values(block.strip())
            if not values or len(values) != 1:
                return text, []
            call = _call(values[0], "arguments")
            if call is None:
                return text, []
            calls.append(call)
        rest = _HERMES_BLOCK.sub("", text[start:]).strip()
        if not calls or rest:  # text between or after the blocks: not a clean call
            return text, []
    else:
        body = text[start:]
        if fmt == "mistral" and body.startswith("[TOOL_CALLS]"):
            body = body[len("[TOOL_CALLS]"):]
        values = _json_values(body)
        if not values:
            return text, []
        if fmt == "mistral":
            if len(values) != 1 or not isinstance(values[0], list):
                return text, []
            values = values[0]
        for value in values:
            call = _call(value, "parameters" if fmt == "llama3_json" else "arguments")
            if call is None:
                return text, []
            calls.append(call)
        if not calls:
            return text, []
    content = text[:start].strip()
    return (content or None), calls


class ToolStream:
    """A streamed reply's text, released as it comes except from where a tool call begins or may
    begin (held until the end, when ``finish`` tells calls from content)."""

    def __init__(self, fmt: str) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"tool-call format must be one of {', '.join(FORMATS)}, got {fmt!r}")
        self.fmt = fmt
        self.text = ""
        self.sent = 0  # characters released
        self.plain = False  # known to be content from here on (JSON formats: it began otherwise)

    def _held_from(self) -> int:
        text = self.text
        if self.plain:
            return len(text)
        if self.fmt == "hermes":
            found = text.find(_HERMES_OPEN)
            if found >= 0:
                return found
            for k in range(min(len(_HERMES_OPEN) - 1, len(text)), 0, -1):  # a marker may be starting
                if _HERMES_OPEN.startswith(text[-k:]):
                    return len(text) - k
            return len(text)
        head = text.lstrip()
        if not head:
            return 0
        opening = ("{",) if self.fmt == "llama3_json" else ("[",)
        if head.startswith(opening):
            return 0
        self.plain = True
        return len(text)

    def feed(self, piece: str) -> str:
        """Adds a piece of the reply; the text that can be sent now."""
        self.text += piece
        held = max(self._held_from(), self.sent)
        out, self.sent = self.text[self.sent:held], held
        return out

    def finish(self) -> Tuple[str, List[ToolCall]]:
        """(the content not yet sent, the calls) once the reply is complete."""
        content, calls = parse_tool_calls(self.fmt, self.text)
        if not calls:
            out, self.sent = self.text[self.sent:], len(self.text)
            return out, []
        end = call_start(self.fmt, self.text)
        out = self.text[self.sent:end].rstrip() if end > self.sent else ""
        self.sent = len(self.text)
        return out, calls


__all__ = ["FORMATS", "ToolCall", "ToolStream", "call_start", "detect_format", "parse_tool_calls"]
