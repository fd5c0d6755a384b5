"""Chat templates (models/_chat.py, Generator.apply_chat_template / chat / stream_chat): the prompt
text is transformers' ``tokenizer.apply_chat_template(messages, tokenize=False, ...)`` on the same
files, the prompt ids its ``tokenize=True`` ids, chat() is generate() on those ids decoded, and the
template is found where transformers looks for it.

The templates below are written here after the common chat formats (ChatML / Qwen with a default
system message, Llama 3 headers with bos_token, Mistral [INST] refusing roles out of turn, Gemma
folding the system message into the first user turn, Phi-3 <|end|>), next to a byte-level BPE
tokenizer trained in the test and a tiny random GPT-2 of its vocabulary size.
"""

from __future__ import annotations

import json
import threading

import pytest

import cpuformer as cf
from cpuformer import _bench
from cpuformer._tokenizer_dir import open_tokenizer
from cpuformer.models import _chat

CHATML = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

LLAMA3 = """{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "Today Date: " + date_string|default("26 Jul 2024") %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

MISTRAL = """{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported after an optional system message!') }}
    {%- endif %}
{%- endfor %}
"""

GEMMA = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {{ message['content'] | trim }}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

PHI3 = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + '<|end|>\n'}}"
    "{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}"
    "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"
)

# Zephyr: indented blocks without whitespace control (trim_blocks and lstrip_blocks decide the text).
ZEPHYR = """{% for message in messages %}
    {% if message['role'] == 'user' %}
<|user|>
{{ message['content'] + eos_token }}
    {% elif message['role'] == 'system' %}
<|system|>
{{ message['content'] + eos_token }}
    {% else %}
<|assistant|>
  {{ message['content'] + eos_token }}
    {% endif %}
    {% if loop.last and add_generation_prompt %}
<|assistant|>
    {% endif %}
{% endfor %}"""

# Jinja features transformers' environment provides: tojson without HTML escaping, namespace,
# loop controls, the {% generation %} tag, dict(), tools and documents, extra variables.
FEATURES = (
    "{%- set ns = namespace(count=0) -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' %}S{% continue %}{% endif -%}"
    "{%- set ns.count = ns.count + 1 -%}"
    "{%- if message['role'] == 'assistant' %}{% generation %}<a>{{ message['content'] }}</a>{% endgeneration %}"
    "{%- else %}{{ message | tojson }}{% endif -%}"
    "{%- if ns.count > 3 %}{% break %}{% endif -%}"
    "{%- endfor -%}"
    "{{ strftime_now('%Y') }}|{{ dict(n=ns.count) | tojson }}|{{ tools | tojson }}|"
    "{{ documents | tojson(indent=1) }}|{{ pad_token }}"
    "{%- if add_generation_prompt %}<go>{% endif -%}"
)

TEMPLATES = dict(chatml=CHATML, llama3=LLAMA3, mistral=MISTRAL, gemma=GEMMA, phi3=PHI3, zephyr=ZEPHYR,
                 features=FEATURES)

SPECIALS = ["<unk>", "<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>", "<|start_header_id|>",
            "<|end_header_id|>", "<|eot_id|>", "<start_of_turn>", "<end_of_turn>", "<|system|>", "<|user|>",
            "<|assistant|>", "<|end|>"]

TOKENIZER_CONFIG = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "bos_token": "<s>",
    "eos_token": {"__type": "AddedToken", "content": "</s>", "lstrip": False, "normalized": False, "rstrip": False,
                  "single_word": False, "special": True},
    "unk_token": "<unk>",
    "pad_token": "<pad>",
}

CORPUS = ["Hello! How are you today? I am fine, thank you.", "The quick brown fox jumps over the lazy dog.",
          "You are a helpful assistant. Answer briefly.", "Größe, déjà vu — 東京 😀 \"quotes\" <html> & more",
          "What is the capital of France? Paris is the capital of France."]

SYSTEM = {"role": "system", "content": "You are terse. Answer in one word."}
TURNS = [{"role": "user", "content": "Hello! How are you?"},
         {"role": "assistant", "content": "  Fine, thank you.  "},
         {"role": "user", "content": "What is the capital of France? <html> & \"déjà\" 東京 😀"}]

VOCAB = 400
NEW = 12
RP = dict(repetition_penalty=3.0)  # the random tiny model repeats itself without it


def write_tokenizer(directory):
    """Byte-level BPE with the chat formats' special tokens; encode(add_special_tokens=True) adds
    BOS, as Llama's tokenizers do (a chat prompt must not get a second one)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=SPECIALS)
    tokenizer.train_from_iterator(CORPUS * 3, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    assert tokenizer.get_vocab_size() <= VOCAB and tokenizer.token_to_id("<s>") == 1
    tokenizer.save(str(directory / "tokenizer.json"))


def write_config(directory, chat_template=None, **extra):
    settings = dict(TOKENIZER_CONFIG, **extra)
    if chat_template is not None:
        settings["chat_template"] = chat_template
    (directory / "tokenizer_config.json").write_text(json.dumps(settings))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny random GPT-2 (eos: "</s>") with the BPE tokenizer and the ChatML template."""
    directory = tmp_path_factory.mktemp("chat") / "m"
    _bench.build_model("decoder", dict(name="tiny-gpt2", vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4,
                                       n_positions=256), str(directory))
    write_tokenizer(directory)
    write_config(directory, CHATML)
    config = json.loads((directory / "config.json").read_text())
    config.update(bos_token_id=SPECIALS.index("<s>"), eos_token_id=SPECIALS.index("</s>"))
    (directory / "config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def gen(model_dir):
    return cf.load(model_dir)


def hf_tokenizer(directory):
    import transformers

    return transformers.AutoTokenizer.from_pretrained(str(directory))


def conversations():
    yield [TURNS[0]]
    yield [SYSTEM, TURNS[0]]
    yield TURNS
    yield [SYSTEM] + TURNS


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_rendering_matches_transformers(name, model_dir, tmp_path):
    directory = tmp_path / name
    directory.mkdir()
    (directory / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    write_config(directory, TEMPLATES[name])
    hf = hf_tokenizer(directory)
    template = _chat.ChatTemplate.from_directory(directory)
    ours = open_tokenizer(directory)
    extra = dict(tools=[{"type": "function", "function": {"name": "f", "description": "<b> & é"}}],
                 documents=[{"title": "T", "text": "x < y"}]) if name == "features" else {}
    for messages in conversations():
        for add in (False, True):
            expected = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add, **extra)
            rendered = template.render(messages, add, **extra)
            assert rendered == expected, (name, messages, add)
            ids = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=add, return_dict=False,
                                         **extra)
            assert ours.encode(rendered, add_special_tokens=False) == list(ids)
    assert len(set(template.render(m, True, **extra) for m in conversations())) == 4  # the messages matter


def test_mistral_refuses_roles_out_of_turn(tmp_path, model_dir):
    (tmp_path / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    write_config(tmp_path, MISTRAL)
    messages = [TURNS[0], TURNS[0]]
    with pytest.raises(Exception, match="Conversation roles must alternate"):
        hf_tokenizer(tmp_path).apply_chat_template(messages, tokenize=False)
    template = _chat.ChatTemplate.from_directory(tmp_path)
    with pytest.raises(ValueError, match=r"the chat template of .*tokenizer_config.json failed: Conversation roles "
                                         r"must alternate user/assistant/user/assistant/\.\.\.$"):
        template.render(messages)


def test_extra_variables_override_special_tokens(tmp_path, model_dir):
    (tmp_path / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    write_config(tmp_path, LLAMA3)
    hf = hf_tokenizer(tmp_path)
    template = _chat.ChatTemplate.from_directory(tmp_path)
    kwargs = dict(date_string="1 Jan 2030", bos_token="<B>")
    expected = hf.apply_chat_template([TURNS[0]], tokenize=False, add_generation_prompt=True, **kwargs)
    assert template.render([TURNS[0]], True, **kwargs) == expected
    assert expected.startswith("<B><|start_header_id|>system<|end_header_id|>\n\nToday Date: 1 Jan 2030")


def test_chat_is_generate_on_the_template_ids(gen, model_dir):
    hf = hf_tokenizer(model_dir)
    for messages in ([TURNS[0]], [SYSTEM] + TURNS):
        prompt = gen.apply_chat_template(messages, add_generation_prompt=True)
        assert prompt == hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = list(hf.apply_chat_template(messages, add_generation_prompt=True, return_dict=False))
        assert ids == gen.tokenizer.encode(prompt, add_special_tokens=False)
        assert gen.tokenizer.encode(prompt)[0] == 1 and ids[0] != 1  # the template of this model has no BOS
        expected = gen.tokenizer.decode(gen.generate(ids, max_new_tokens=NEW, **RP)[0], skip_special_tokens=True)
        reply = gen.chat(messages, max_new_tokens=NEW, **RP)
        assert reply == expected and reply
        assert "".join(gen.stream_chat(messages, max_new_tokens=NEW, **RP)) == reply
        # sampling: the same seed gives the same reply
        sampled = gen.chat(messages, max_new_tokens=NEW, do_sample=True, seed=3, temperature=2.0)
        tokens = gen.generate(ids, max_new_tokens=NEW, do_sample=True, seed=3, temperature=2.0)[0]
        assert sampled == gen.tokenizer.decode(tokens)
    # without the generation prompt the model continues the last turn
    ids = gen.tokenizer.encode(gen.apply_chat_template(TURNS), add_special_tokens=False)
    assert gen.chat(TURNS, add_generation_prompt=False, max_new_tokens=NEW, **RP) == \
        gen.tokenizer.decode(gen.generate(ids, max_new_tokens=NEW, **RP)[0])


def test_chat_with_tools_renders_them(model_dir, tmp_path):
    """chat(tools=...) and stream_chat(tools=...) generate from the template rendered with the tools,
    as transformers' apply_chat_template(tools=...)."""
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (tmp_path / name).write_bytes((model_dir / name).read_bytes())
    write_config(tmp_path, "{% if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif %}"
                 + CHATML)
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "The weather",
                                               "parameters": {"type": "object", "properties": {}}}}]
    hf = hf_tokenizer(tmp_path)
    with cf.Generator(tmp_path) as model:
        prompt = model.apply_chat_template([TURNS[0]], add_generation_prompt=True, tools=tools)
        assert prompt == hf.apply_chat_template([TURNS[0]], tokenize=False, add_generation_prompt=True, tools=tools)
        assert "get_weather" in prompt and "get_weather" not in model.apply_chat_template([TURNS[0]], True)
        ids = model.tokenizer.encode(prompt, add_special_tokens=False)
        expected = model.tokenizer.decode(model.generate(ids, max_new_tokens=NEW, **RP)[0], skip_special_tokens=True)
        assert model.chat([TURNS[0]], tools=tools, max_new_tokens=NEW, **RP) == expected
        assert "".join(model.stream_chat([TURNS[0]], tools=tools, max_new_tokens=NEW, **RP)) == expected
    # an assistant turn that made calls may have no content (dropped, as transformers drops None values)
    calls = [TURNS[0], {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {}}}]}]
    template = _chat.ChatTemplate("{% for m in messages %}{{ m.role }}:{{ m.content if 'content' in m else "
                                  "m.tool_calls[0].function.name }};{% endfor %}", {}, "test")
    assert template.render(calls) == "user:Hello! How are you?;assistant:get_weather;"
    with pytest.raises(TypeError, match=r"message 1 \(assistant\) needs a 'content' string, got None"):
        template.render([TURNS[0], {"role": "assistant", "content": None}])


def test_chat_stop_strings(gen):
    messages = [SYSTEM, TURNS[0]]
    plain = gen.chat(messages, max_new_tokens=40, min_new_tokens=40, eos_token_id=[], **RP)
    assert len(plain) > 8
    stop = plain[5:8]
    cut = plain[:plain.find(stop)]
    assert gen.chat(messages, max_new_tokens=40, min_new_tokens=40, eos_token_id=[], stop=stop, **RP) == cut
    pieces = list(gen.stream_chat(messages, max_new_tokens=40, min_new_tokens=40, eos_token_id=[], stop=[stop],
                                  **RP))
    assert "".join(pieces) == cut


def test_closing_stream_chat_stops_it(gen):
    pieces = gen.stream_chat([TURNS[0]], max_new_tokens=200, min_new_tokens=200, eos_token_id=[], **RP)
    first = next(pieces)
    assert first
    pieces.close()
    with pytest.raises(StopIteration):
        next(pieces)
    assert not [t for t in threading.enumerate() if t.name == "cpuformer-stream"]  # the generation stopped


def test_where_the_template_is_found(tmp_path, model_dir):
    """chat_template.jinja and additional_chat_templates/*.jinja over tokenizer_config.json's
    chat_template (a string, or named templates), then chat_template.json, as transformers."""
    (tmp_path / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    messages = [TURNS[0]]

    def both():
        hf = hf_tokenizer(tmp_path)
        ours = _chat.ChatTemplate.from_directory(tmp_path)
        return (hf.apply_chat_template(messages, tokenize=False),
                hf.apply_chat_template(messages, tokenize=False, tools=[{"name": "t"}]),
                ours.render(messages), ours.render(messages, tools=[{"name": "t"}]))

    write_config(tmp_path, "config {{ messages[0].content }}")
    assert both() == ("config Hello! How are you?",) * 4
    write_config(tmp_path, [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}])
    assert both() == ("D", "T", "D", "T")
    (tmp_path / "chat_template.jinja").write_text("jinja file")
    assert both() == ("jinja file",) * 4
    (tmp_path / "additional_chat_templates").mkdir()
    (tmp_path / "additional_chat_templates" / "tool_use.jinja").write_text("tool file")
    assert both() == ("jinja file", "tool file", "jinja file", "tool file")
    (tmp_path / "chat_template.jinja").unlink()
    with pytest.raises(ValueError, match="multiple chat templates with no default"):
        hf_tokenizer(tmp_path).apply_chat_template(messages, tokenize=False)
    with pytest.raises(ValueError, match=r"additional_chat_templates/tool_use.jinja: several chat templates and none "
                                         r"named 'default' \(templates: tool_use\)"):
        _chat.ChatTemplate.from_directory(tmp_path).render(messages)
    (tmp_path / "additional_chat_templates" / "tool_use.jinja").unlink()
    write_config(tmp_path)
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": "legacy {{ bos_token }}"}))
    assert _chat.ChatTemplate.from_directory(tmp_path).render(messages) == "legacy <s>"


def test_special_tokens_as_transformers(tmp_path, model_dir):
    (tmp_path / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    show = "{{ bos_token }}|{{ eos_token }}|{{ unk_token }}|{{ pad_token }}|{{ image_token }}|{{ boi_token }}"
    cases = [dict(),
             dict(bos_token=None, image_token="<|user|>", extra_special_tokens={"boi_token": "<|end|>"}),
             dict(eos_token="<|eot_id|>", add_bos_token=True)]
    for extra in cases:
        write_config(tmp_path, show, **extra)
        expected = hf_tokenizer(tmp_path).apply_chat_template([TURNS[0]], tokenize=False)
        assert _chat.ChatTemplate.from_directory(tmp_path).render([TURNS[0]]) == expected, extra
    # special_tokens_map.json (the legacy layout: no added_tokens_decoder) overrides tokenizer_config.json
    write_config(tmp_path, show, eos_token="<|eot_id|>")
    (tmp_path / "special_tokens_map.json").write_text(json.dumps({"eos_token": {"content": "<|end|>"},
                                                                  "image_token": "<|user|>"}))
    expected = hf_tokenizer(tmp_path).apply_chat_template([TURNS[0]], tokenize=False)
    assert expected == "<s>|<|end|>|<unk>|<pad>|<|user|>|"
    assert _chat.ChatTemplate.from_directory(tmp_path).render([TURNS[0]]) == expected


def test_message_errors(gen):
    with pytest.raises(ValueError, match=r"message 1 has the unknown role 'robot'; roles are system, user, "
                                         r"assistant, tool"):
        gen.chat([TURNS[0], {"role": "robot", "content": "beep"}])
    with pytest.raises(TypeError, match=r"messages must be a list of \{'role': ..., 'content': ...\} dicts, got str"):
        gen.chat("hello")
    with pytest.raises(ValueError, match="messages is empty: give at least one message"):
        gen.chat([])
    with pytest.raises(TypeError, match=r"message 0 must be a dict with 'role' and 'content', got \['user', 'hi'\]"):
        gen.chat([["user", "hi"]])
    with pytest.raises(TypeError, match="message 0 needs a 'role' string, got None"):
        gen.chat([{"content": "hi"}])
    with pytest.raises(TypeError, match=r"message 0 \(user\) needs a 'content' string, got 3"):
        gen.chat([{"role": "user", "content": 3}])
    with pytest.raises(TypeError, match="add_generation_prompt must be True or False, got 1"):
        gen.apply_chat_template([TURNS[0]], add_generation_prompt=1)
    with pytest.raises(TypeError, match="chat\\(\\) returns the reply text; for return_log_probs=True call generate"):
        gen.chat([TURNS[0]], return_log_probs=True)
    with pytest.raises(TypeError, match="stream\\(\\) got unexpected keyword arguments \\['nonsense'\\]"):
        gen.stream_chat([TURNS[0]], nonsense=1)
    with pytest.raises(TypeError, match="tools must be a list of JSON-schema dicts, got 'f'"):
        gen.apply_chat_template([TURNS[0]], tools="f")
    with pytest.raises(TypeError, match=r"documents must be a list of dicts \(with 'title' and 'text'\), got \[1\]"):
        gen.apply_chat_template([TURNS[0]], documents=[1])


def test_template_errors(tmp_path, model_dir):
    (tmp_path / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    (tmp_path / "config.json").write_bytes((model_dir / "config.json").read_bytes())
    (tmp_path / "model.safetensors").symlink_to(model_dir / "model.safetensors")
    write_config(tmp_path)
    model = cf.load(tmp_path)
    with pytest.raises(ValueError, match=r"has no chat template \(no chat_template.jinja, no 'chat_template' in "
                                         r"tokenizer_config.json, no chat_template.json\); chat\(\) needs one"):
        model.chat([TURNS[0]])
    cases = [("{% if %}", r"failed \(line 1\): Expected an expression, got 'end of statement block'"),
             ("{{ messages[0].content.nope.deeper }}", r"failed: 'str object' has no attribute 'nope'"),
             ("{{ messages[0].content + 1 }}", r"failed: TypeError: can only concatenate str"),
             ("{{ raise_exception('no system messages, please') }}", r"failed: no system messages, please$"),
             ("{% set ns = namespace(_x=1) %}", "failed: chat templates cannot store underscore-prefixed attributes"),
             ("{{ messages.__class__ }}{{ ().__class__.__base__.__subclasses__() }}", "failed: access to attribute")]
    for template, message in cases:
        (tmp_path / "chat_template.jinja").write_text(template)
        fresh = cf.load(tmp_path)
        with pytest.raises(ValueError, match=r"the chat template of .*chat_template.jinja " + message):
            fresh.chat([TURNS[0]])
    write_config(tmp_path, 5)
    (tmp_path / "chat_template.jinja").unlink()
    with pytest.raises(ValueError, match=r"tokenizer_config.json: 'chat_template' must be a string or a list of "
                                         r"\{\"name\": ..., \"template\": ...\} objects, got 5"):
        cf.load(tmp_path).chat([TURNS[0]])
    write_config(tmp_path, "{{ '' }}")
    with pytest.raises(ValueError, match="the chat template rendered the messages as empty text"):
        cf.load(tmp_path).chat([TURNS[0]])


def test_jinja2_is_optional(monkeypatch, tmp_path):
    import builtins
    import sys

    import jinja2

    real_import = builtins.__import__

    def no_jinja(name, *args, **kwargs):
        if name == "jinja2" or name.startswith("jinja2."):
            raise ImportError("No module named 'jinja2'")
        return real_import(name, *args, **kwargs)

    template = _chat.ChatTemplate("{{ messages[0].content }}", {}, "here")
    monkeypatch.setattr(builtins, "__import__", no_jinja)
    monkeypatch.delitem(sys.modules, "jinja2")
    with pytest.raises(ImportError, match=r"chat templates need jinja2, an optional dependency of cpuformer: "
                                          r"pip install 'cpuformer\[chat\]'"):
        template.render([TURNS[0]])
    monkeypatch.setattr(builtins, "__import__", real_import)
    monkeypatch.setitem(sys.modules, "jinja2", jinja2)
    monkeypatch.setattr(jinja2, "__version__", "3.1.5")
    with pytest.raises(ImportError, match=r"chat templates need jinja2>=3.1.6 .* found jinja2 3.1.5"):
        template.render([TURNS[0]])
    monkeypatch.undo()
    assert template.render([TURNS[0]]) == TURNS[0]["content"]


def test_message_keys_as_transformers(tmp_path, model_dir):
    """Keys whose value is None are dropped; the reasoning fields alias each other; other keys
    reach the template."""
    (tmp_path / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    write_config(tmp_path, "{% for m in messages %}{{ m.name is defined }}|{{ m.thinking }}|{{ m.reasoning_content }}|"
                           "{{ m.tool_call_id }};{% endfor %}")
    messages = [{"role": "user", "content": "q", "name": None},
                {"role": "assistant", "content": "a", "reasoning": "because"},
                {"role": "tool", "content": "42", "tool_call_id": "call-1", "name": "f"}]
    expected = hf_tokenizer(tmp_path).apply_chat_template(messages, tokenize=False)
    assert expected == "False|||;False|because|because|;True|||call-1;"
    assert _chat.ChatTemplate.from_directory(tmp_path).render(messages) == expected
