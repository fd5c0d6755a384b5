"""Chat templates: a checkpoint's Jinja template that turns a conversation into the prompt text.

Found and rendered as Hugging Face transformers 5.24 does (``tokenization_utils_base.py``
``from_pretrained`` and ``get_chat_template``, ``utils/chat_template_utils.py``), so that
``ChatTemplate.render(messages, add_generation_prompt)`` is ``tokenizer.apply_chat_template(messages,
tokenize=False, add_generation_prompt=...)`` on the same files:

* where: ``chat_template.jinja`` (the default) and ``additional_chat_templates/*.jinja`` (named
  templates) take priority over tokenizer_config.json's ``"chat_template"``: a string, or a list of
  ``{"name", "template"}``. With several templates, "tool_use" is used when tools are given and it
  exists, else "default". Only when none of these exist, ``chat_template.json`` (``{"chat_template":
  ...}``, the file transformers' processors read) is used.
* how: a ``jinja2`` ``ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)`` with the
  loopcontrols extension and the ``{% generation %}`` tag, ``tojson`` without HTML escaping
  (``json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)``), the
  globals ``raise_exception``, ``strftime_now``, ``dict`` and ``namespace`` (no underscore names).
  The template sees ``messages``, ``tools``, ``documents``, ``add_generation_prompt``, the special
  tokens named by tokenizer_config.json (``bos_token``, ``eos_token``, ``unk_token``, ``pad_token``,
  ... and any other ``*_token``), and extra keyword arguments (which override the special tokens).

jinja2 is an optional dependency (``pip install 'cpuformer[chat]'``); like transformers, versions
before 3.1.6 (with known sandbox escapes: templates come from the Hub and are untrusted code) are refused.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
from datetime import datetime
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from .._model_dir import _describe, _read_json_object
from .._tokenizer import read_tokenizer_settings

PathLike = Union[str, "os.PathLike[str]"]

#: The files transformers reads chat templates from (transformers.utils.hub).
CHAT_TEMPLATE_FILE = "chat_template.jinja"
CHAT_TEMPLATE_DIR = "additional_chat_templates"
LEGACY_CHAT_TEMPLATE_FILE = "chat_template.json"

#: The roles a message may have.
ROLES = ("system", "user", "assistant", "tool")

#: Names a message's reasoning is passed under; the first is the one chat templates read.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")

JINJA_MINIMUM = (3, 1, 6)


def _jinja2() -> Any:
    """The jinja2 module; ImportError naming the extra when it is missing or too old."""
    try:
        import jinja2
    except ImportError:
        raise ImportError("chat templates need jinja2, an optional dependency of cpuformer: "
                          "pip install 'cpuformer[chat]' (or pip install 'jinja2>=3.1.6')") from None
    version = tuple(int(part) if part.isdigit() else 0 for part in jinja2.__version__.split(".")[:3])
    if version < JINJA_MINIMUM:
        raise ImportError(f"chat templates need jinja2>=3.1.6 (older versions have known sandbox escapes, and chat "
                          f"templates are untrusted code); found jinja2 {jinja2.__version__}: "
                          "pip install -U 'cpuformer[chat]'")
    return jinja2


@functools.lru_cache(maxsize=16)
def _compile(template: str) -> Any:
    """The compiled template, in the environment transformers renders chat templates in
    (utils/chat_template_utils.py, _cached_compile_jinja_template)."""
    _jinja2()  # present, and recent enough
    import jinja2.exceptions
    import jinja2.ext
    import jinja2.nodes
    import jinja2.sandbox
    import jinja2.utils

    class GenerationTag(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}``: marks an assistant reply (for transformers'
        assistant-token masks); renders its body unchanged."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller: Any) -> str:
            return caller()

    def raise_exception(message: Any) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        # Jinja's own tojson escapes HTML characters; transformers' does not.
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    class TemplateDict:
        """``dict(...)`` in a template, without the attributes of the dict type."""

        def __call__(self, *args: Any, **kwargs: Any) -> Dict[Any, Any]:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> Dict[Any, Any]:
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        """``namespace(...)`` that refuses underscore-prefixed attributes."""

        def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 (Jinja's Namespace signature)
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: Any, value: Any) -> None:
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"chat templates cannot store underscore-prefixed attributes on a namespace, got {name!r}")

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env.from_string(template)


def _plain(value: Any) -> Any:
    """What the template sees of a value: plain JSON-like data (transformers' _plain_template_data),
    anything else as a placeholder naming its type."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_plain(item) for item in value)
    if isinstance(value, np.generic):
        return _plain(value.item())
    return f"<{type(value).__name__}>"


def check_messages(messages: Any) -> List[Dict[str, Any]]:
    """A conversation: a non-empty list of {"role": ..., "content": str} dicts, roles in ROLES (an
    assistant turn with "tool_calls" may have no content). Other keys are passed to the template;
    keys whose value is None are dropped (as transformers)."""
    if not isinstance(messages, (list, tuple)):
        raise TypeError(f"messages must be a list of {{'role': ..., 'content': ...}} dicts, got "
                        f"{type(messages).__name__}")
    if not messages:
        raise ValueError("messages is empty: give at least one message")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise TypeError(f"message {i} must be a dict with 'role' and 'content', got {_describe(message)}")
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str):
            raise TypeError(f"message {i} needs a 'role' string, got {_describe(role)}")
        if role not in ROLES:
            raise ValueError(f"message {i} has the unknown role {role!r}; roles are {', '.join(ROLES)}")
        if not isinstance(content, str) and not (content is None and message.get("tool_calls")):
            raise TypeError(f"message {i} ({role}) needs a 'content' string, got {_describe(content)}")
        message = {key: value for key, value in message.items() if value is not None}
        reasoning = next((message[key] for key in _REASONING_FIELDS if message.get(key) is not None), None)
        if reasoning is not None:  # transformers' _alias_reasoning_fields
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(_plain(message))
    return out


def _token_text(value: Any) -> Optional[str]:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def special_tokens(directory: PathLike, settings: Optional[Mapping[str, Any]] = None) -> Dict[str, str]:
    """The special tokens a chat template sees (transformers' ``tokenizer.special_tokens_map``):
    tokenizer_config.json's bos_token, eos_token, unk_token, sep_token, pad_token, cls_token,
    mask_token and any other ``*_token`` key that holds a token (and its ``extra_special_tokens``
    when that is a {name: token} object); special_tokens_map.json's entries override them when
    tokenizer_config.json has no ``added_tokens_decoder`` (the legacy layout)."""
    directory = pathlib.Path(os.fspath(directory))
    merged = dict(read_tokenizer_settings(directory) if settings is None else settings)
    legacy = directory / "special_tokens_map.json"
    if "added_tokens_decoder" not in merged and legacy.is_file():
        merged.update(_read_json_object(legacy))
    tokens: Dict[str, str] = {}
    for key, value in merged.items():
        text = _token_text(value)
        if key.endswith("_token") and text is not None:
            tokens[key] = text
    extra = merged.get("extra_special_tokens")
    if isinstance(extra, Mapping):
        for key, value in extra.items():
            text = _token_text(value)
            if isinstance(key, str) and text is not None:
                tokens[key] = text
    return tokens


def _named_templates(value: Any, source: str) -> Union[str, Dict[str, str]]:
    """tokenizer_config.json's (or chat_template.json's) "chat_template": a string, or a list of
    {"name", "template"} objects (a dict by name)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(t, dict) and isinstance(t.get("name"), str) and
                                       isinstance(t.get("template"), str) for t in value):
        return {t["name"]: t["template"] for t in value}
    raise ValueError(f"{source}: 'chat_template' must be a string or a list of {{\"name\": ..., \"template\": ...}} "
                     f"objects, got {_describe(value)}")


def _read_text(path: pathlib.Path) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text ({error.reason})") from None


def find_templates(directory: PathLike, settings: Optional[Mapping[str, Any]] = None
                   ) -> Tuple[Union[None, str, Dict[str, str]], str]:
    """(the checkpoint's chat template(s), the file they come from): a string, a dict of named
    templates, or None; precedence as transformers' tokenizer from_pretrained (module docstring)."""
    directory = pathlib.Path(os.fspath(directory))
    templates: Dict[str, str] = {}
    sources = []
    default = directory / CHAT_TEMPLATE_FILE
    if default.is_file():
        templates["default"] = _read_text(default)
        sources.append(str(default))
    extra_dir = directory / CHAT_TEMPLATE_DIR
    if extra_dir.is_dir():
        for path in sorted(extra_dir.glob("*.jinja")):
            templates[path.name[:-len(".jinja")]] = _read_text(path)
            sources.append(str(path))
    if templates:
        source = ", ".join(sources)
        return (templates["default"] if list(templates) == ["default"] else templates), source
    config = directory / "tokenizer_config.json"
    settings = read_tokenizer_settings(directory) if settings is None else settings
    if settings.get("chat_template") is not None:
        return _named_templates(settings["chat_template"], str(config)), str(config)
    legacy = directory / LEGACY_CHAT_TEMPLATE_FILE
    if legacy.is_file():
        value = _read_json_object(legacy).get("chat_template")
        if value is not None:
            return _named_templates(value, str(legacy)), str(legacy)
    return None, str(directory)


class ChatTemplate:
    """A checkpoint's chat template(s) and special tokens; ``render()`` gives the prompt text."""

    def __init__(self, templates: Union[str, Dict[str, str]], special: Mapping[str, str], source: str) -> None:
        self.templates = templates
        self.special_tokens = dict(special)
        #: The file(s) the template was read from (for error messages).
        self.source = source

    @classmethod
    def from_directory(cls, directory: PathLike, settings: Optional[Mapping[str, Any]] = None) -> "ChatTemplate":
        """The chat template of a model directory; ValueError when it has none."""
        templates, source = find_templates(directory, settings)
        if templates is None:
            raise ValueError(f"{directory} has no chat template (no {CHAT_TEMPLATE_FILE}, no 'chat_template' in "
                             f"tokenizer_config.json, no {LEGACY_CHAT_TEMPLATE_FILE}); chat() needs one, or pass "
                             "token ids to generate()")
        return cls(templates, special_tokens(directory, settings), source)

    def template(self, tools: Any = None) -> str:
        """The template used (transformers' get_chat_template): with several, "tool_use" when tools
        are given and it exists, else "default"."""
        if isinstance(self.templates, str):
            return self.templates
        if tools is not None and "tool_use" in self.templates:
            return self.templates["tool_use"]
        if "default" in self.templates:
            return self.templates["default"]
        raise ValueError(f"{self.source}: several chat templates and none named 'default' "
                         f"(templates: {', '.join(sorted(self.templates))})")

    def render(self, messages: Any, add_generation_prompt: bool = False, tools: Optional[Sequence[Any]] = None,
               documents: Optional[Sequence[Any]] = None, **kwargs: Any) -> str:
        """The conversation as prompt text: ``apply_chat_template(messages, tokenize=False,
        add_generation_prompt=..., tools=..., documents=..., **kwargs)``."""
        template = self.template(tools)
        chat = check_messages(messages)
        if not isinstance(add_generation_prompt, bool):
            raise TypeError(f"add_generation_prompt must be True or False, got {add_generation_prompt!r}")
        if tools is not None and (not isinstance(tools, (list, tuple)) or
                                  not all(isinstance(t, Mapping) for t in tools)):
            raise TypeError(f"tools must be a list of JSON-schema dicts, got {_describe(tools)}")
        if documents is not None and (not isinstance(documents, (list, tuple)) or
                                      not all(isinstance(d, Mapping) for d in documents)):
            raise TypeError(f"documents must be a list of dicts (with 'title' and 'text'), got {_describe(documents)}")
        jinja2 = _jinja2()
        variables = _plain({**self.special_tokens, **kwargs})
        try:
            compiled = _compile(template)
            return compiled.render(messages=chat, tools=_plain(list(tools) if tools is not None else None),
                                   documents=_plain(list(documents) if documents is not None else None),
                                   add_generation_prompt=add_generation_prompt, **variables)
        except jinja2.exceptions.TemplateError as error:
            where = f" (line {error.lineno})" if getattr(error, "lineno", None) else ""
            raise ValueError(f"the chat template of {self.source} failed{where}: {error.message or error}") from error
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, ZeroDivisionError,
                OverflowError) as error:
            raise ValueError(f"the chat template of {self.source} failed: {type(error).__name__}: {error}") from error


__all__ = ["CHAT_TEMPLATE_DIR", "CHAT_TEMPLATE_FILE", "ChatTemplate", "LEGACY_CHAT_TEMPLATE_FILE", "ROLES",
           "check_messages", "find_templates", "special_tokens"]
