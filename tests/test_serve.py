"""``cpuformer serve`` (cpuformer.serve, docs/serving.md): the OpenAI-compatible HTTP API on tiny
random-weight models, through FastAPI's TestClient, httpx and the real ``openai`` client against a
uvicorn server on a free local port."""

from __future__ import annotations

import asyncio
import base64
import builtins
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import openai
import pytest
import uvicorn
from fastapi.testclient import TestClient
from models.test_chat import CHATML, write_config, write_tokenizer
from test_cli import PACKAGE_PARENT, TINY, assert_user_error, run_cli

import cpuformer as cf
from cpuformer import _bench, cli, serve
from cpuformer._model_dir import save_safetensors

VOCAB = 400
CONTEXT = 4096
PROMPTS = ["Hello there", "The cat sat", "One two three four", "a b", "We went to the", "Why is the sky",
           "Once upon a time", "x y z", "It was a dark", "I like green", "Numbers: 1 2 3", "The end"]


@pytest.fixture(scope="module")
def gen_dir(tmp_path_factory):
    """A tiny random GPT-2 (context 4096) with a byte-level BPE tokenizer and the ChatML template."""
    directory = tmp_path_factory.mktemp("serve") / "tiny-gpt"
    _bench.build_model("decoder", dict(name="tiny-gpt2", vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4,
                                       n_positions=CONTEXT), str(directory))
    write_tokenizer(directory)
    write_config(directory, CHATML)
    return directory


@pytest.fixture(scope="module")
def gen(gen_dir):
    with cf.load(gen_dir) as model:
        yield model


@pytest.fixture(scope="module")
def enc_dir(tmp_path_factory):
    return _bench.build_model("encoder", TINY["encoder"], str(tmp_path_factory.mktemp("serve") / "tiny-bert"))


@pytest.fixture(scope="module")
def enc(enc_dir):
    with cf.load(enc_dir) as model:
        yield model


@pytest.fixture(scope="module")
def client(gen):
    app = serve.create_app(gen)
    with TestClient(app) as c:
        yield c
    app.state.close()


@pytest.fixture(scope="module")
def enc_client(enc):
    app = serve.create_app(enc, model_name="bert", max_batch=64)
    with TestClient(app) as c:
        yield c
    app.state.close()


class Running:
    """A uvicorn server for ``app`` in a thread, on a free local port."""

    def __init__(self, app):
        self.app = app
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2))
        self.thread = threading.Thread(target=self.server.run, kwargs=dict(sockets=[self.sock]), daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            assert time.time() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(30)
        self.app.state.close()
        self.sock.close()


@pytest.fixture(scope="module")
def live(gen):
    with Running(serve.create_app(gen, max_queue=64)) as running:
        yield running


@pytest.fixture(scope="module")
def enc_live(enc):
    with Running(serve.create_app(enc, model_name="bert", max_batch=64)) as running:
        yield running


def complete(c, **body):
    return c.post("/v1/completions", json=dict(dict(model="tiny-gpt", max_tokens=10, temperature=0), **body))


def error_of(response, status, fragment, param=None, code=None):
    """The response is an HTTP error with the OpenAI error body holding ``fragment``."""
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert fragment in body["error"]["message"], body
    assert body["error"]["param"] == param, body
    assert body["error"]["code"] == code, body
    return body["error"]


def events(text):
    """The data payloads of a server-sent-event body, [DONE] last."""
    blocks = [b for b in text.split("\n\n") if b]
    assert all(b.startswith("data: ") for b in blocks), text
    payloads = [b[len("data: "):] for b in blocks]
    assert payloads[-1] == "[DONE]", payloads[-1]
    return [json.loads(p) for p in payloads[:-1]]


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics")


# ---- health, models, metrics ---------------------------------------------------------------------


def test_health_and_models(client):
    assert client.get("/health").status_code == 200
    body = client.get("/v1/models").json()
    assert body["object"] == "list" and [m["id"] for m in body["data"]] == ["tiny-gpt"]
    assert body["data"][0]["object"] == "model"


def test_model_name_option(gen):
    app = serve.create_app(gen, model_name="mine")
    try:
        with TestClient(app) as c:
            assert c.get("/v1/models").json()["data"][0]["id"] == "mine"
            assert complete(c, model="mine", prompt="a").status_code == 200
            error_of(complete(c, prompt="a"), 404, "the model 'tiny-gpt' does not exist; this server serves 'mine'",
                     "model", "model_not_found")
    finally:
        app.state.close()


def test_metrics_prometheus_text(client):
    assert complete(client, prompt="Hello").status_code == 200
    assert client.post("/v1/completions", content=b"{").status_code == 400
    response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    text = response.text
    for line in text.splitlines():  # the text format: comments, or `name{labels} value`
        assert line.startswith("# HELP ") or line.startswith("# TYPE ") or len(line.rsplit(" ", 1)) == 2, line
        if not line.startswith("#"):
            float(line.rsplit(" ", 1)[1])
    assert metric(text, "cpuformer_queue_depth") == 0
    assert metric(text, "cpuformer_generated_tokens_total") >= 10
    assert metric(text, 'cpuformer_requests_total{endpoint="/v1/completions",status="200"}') >= 1
    assert metric(text, 'cpuformer_requests_total{endpoint="/v1/completions",status="400"}') >= 1
    count = metric(text, 'cpuformer_request_duration_seconds_count{endpoint="/v1/completions"}')
    assert metric(text, 'cpuformer_request_duration_seconds_bucket{endpoint="/v1/completions",le="+Inf"}') == count
    assert metric(text, "cpuformer_batch_size_count") >= 1
    assert "# TYPE cpuformer_request_duration_seconds histogram" in text
    # The same prompt again: all but its last token come from the slot the first one left.
    reused = metric(text, "cpuformer_prefix_reused_tokens_total")
    prompt = "The same long prompt, sent twice in a row"
    assert complete(client, prompt=prompt, max_tokens=2).status_code == 200
    assert complete(client, prompt=prompt, max_tokens=2).status_code == 200
    after = metric(client.get("/metrics").text, "cpuformer_prefix_reused_tokens_total")
    assert after - reused >= len(client.app.app.state.server.model.tokenizer.encode(prompt)) - 1


# ---- completions and chat -------------------------------------------------------------------------


def test_greedy_completion_is_generate(client, gen):
    for prompt in PROMPTS[:4]:
        body = complete(client, prompt=prompt, max_tokens=12).json()
        assert body["object"] == "text_completion" and body["model"] == "tiny-gpt" and body["id"].startswith("cmpl-")
        (choice,) = body["choices"]
        assert choice["text"] == gen.generate(prompt, max_new_tokens=12)
        assert choice["index"] == 0
        n_prompt = len(gen.tokenizer.encode(prompt))
        result = gen.generate(prompt, max_new_tokens=12, return_scores=True)[0]
        assert choice["finish_reason"] == {"eos": "stop"}.get(result.finish_reason, result.finish_reason)
        assert body["usage"] == {"prompt_tokens": n_prompt, "completion_tokens": len(result.token_ids),
                                 "total_tokens": n_prompt + len(result.token_ids)}


def test_token_id_prompts_and_lists(client, gen):
    ids = gen.tokenizer.encode("The cat sat")
    body = complete(client, prompt=ids).json()
    assert body["choices"][0]["text"] == gen.tokenizer.decode(gen.generate(ids, max_new_tokens=10)[0])
    body = complete(client, prompt=["a b", "x y z"]).json()
    assert [c["text"] for c in body["choices"]] == gen.generate(["a b", "x y z"], max_new_tokens=10)
    assert [c["index"] for c in body["choices"]] == [0, 1]
    body = complete(client, prompt="a b", n=2).json()
    assert [c["text"] for c in body["choices"]] == [gen.generate("a b", max_new_tokens=10)] * 2


def test_finish_reason_length_and_stop(client, gen):
    long = complete(client, prompt="Hello there", max_tokens=30).json()["choices"][0]
    assert long["finish_reason"] == "length"
    stop = long["text"][5:8]
    body = complete(client, prompt="Hello there", max_tokens=30, stop=[stop]).json()
    assert body["choices"][0]["text"] == gen.generate("Hello there", max_new_tokens=30, stop=stop)
    assert body["choices"][0]["text"] == long["text"][:long["text"].find(stop)]
    assert body["choices"][0]["finish_reason"] == "stop"


def test_sampling_is_seeded(client, gen):
    options = dict(prompt="Once upon a time", max_tokens=12, temperature=0.8, top_p=0.9, top_k=20, seed=7)
    first = complete(client, **options).json()["choices"][0]["text"]
    assert complete(client, **options).json()["choices"][0]["text"] == first
    assert first == gen.generate("Once upon a time", max_new_tokens=12, do_sample=True, temperature=0.8, top_p=0.9,
                                 top_k=20, seed=7)


def test_chat_is_generator_chat(client, gen):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    body = client.post("/v1/chat/completions", json=dict(model="tiny-gpt", messages=messages, max_tokens=12,
                                                         temperature=0)).json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    (choice,) = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": gen.chat(messages, max_new_tokens=12)}
    ids = gen.tokenizer.encode(gen.apply_chat_template(messages, add_generation_prompt=True), add_special_tokens=False)
    assert body["usage"]["prompt_tokens"] == len(ids)
    # max_completion_tokens (the newer name) and text content parts
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]}]
    body = client.post("/v1/chat/completions", json=dict(model="tiny-gpt", messages=parts, max_completion_tokens=5,
                                                         temperature=0)).json()
    assert body["choices"][0]["message"]["content"] == gen.chat([{"role": "user", "content": "Hello there"}],
                                                                max_new_tokens=5)


def test_penalties_and_logit_bias_are_generates(client, gen):
    """presence_penalty, frequency_penalty and logit_bias (token ids as JSON's string keys) reach
    the batcher: a greedy answer is generate()'s with the same options, and they change it."""
    prompt = "Once upon a time"
    plain = gen.generate(prompt, max_new_tokens=16)
    first = gen.generate(prompt, max_new_tokens=1, return_scores=True)[0].token_ids[0]
    options = dict(presence_penalty=1.5, frequency_penalty=0.75, logit_bias={first: -100.0, 7: 2.5})
    expected = gen.generate(prompt, max_new_tokens=16, **options)
    assert expected != plain
    body = complete(client, prompt=prompt, max_tokens=16, presence_penalty=1.5, frequency_penalty=0.75,
                    logit_bias={str(first): -100, "7": 2.5}).json()
    assert body["choices"][0]["text"] == expected
    messages = [{"role": "user", "content": "Hello there"}]
    chat = client.post("/v1/chat/completions", json=dict(model="tiny-gpt", messages=messages, max_tokens=8,
                                                         temperature=0, logit_bias={str(first): 100})).json()
    assert chat["choices"][0]["message"]["content"] == gen.chat(messages, max_new_tokens=8,
                                                                logit_bias={first: 100.0})
    sampled = dict(prompt=prompt, max_tokens=12, temperature=0.8, seed=3, presence_penalty=-1, frequency_penalty=2)
    assert complete(client, **sampled).json()["choices"][0]["text"] == gen.generate(
        prompt, max_new_tokens=12, do_sample=True, temperature=0.8, seed=3, presence_penalty=-1.0,
        frequency_penalty=2.0)


def test_vllm_extensions(client, gen):
    """repetition_penalty, min_tokens and ignore_eos (vLLM's names) are generate()'s options."""
    prompt = "Once upon a time"
    body = complete(client, prompt=prompt, max_tokens=16, repetition_penalty=1.8).json()
    assert body["choices"][0]["text"] == gen.generate(prompt, max_new_tokens=16, repetition_penalty=1.8)
    eos = gen.eos_token_ids[0]
    forced = complete(client, prompt=prompt, max_tokens=3, logit_bias={str(eos): 100}).json()["choices"][0]
    assert forced["finish_reason"] == "stop"  # EOS at once
    late = complete(client, prompt=prompt, max_tokens=6, logit_bias={str(eos): 100}, min_tokens=4).json()
    assert late["usage"]["completion_tokens"] == 5 and late["choices"][0]["finish_reason"] == "stop"
    assert late["choices"][0]["text"] == gen.generate(prompt, max_new_tokens=6, min_new_tokens=4,
                                                      logit_bias={eos: 100.0})
    never = complete(client, prompt=prompt, max_tokens=6, logit_bias={str(eos): 100}, ignore_eos=True).json()
    assert never["usage"]["completion_tokens"] == 6 and never["choices"][0]["finish_reason"] == "length"
    error_of(complete(client, prompt="a", repetition_penalty=0), 400, "repetition_penalty must be > 0, got 0.0",
             "repetition_penalty")
    error_of(complete(client, prompt="a", max_tokens=3, min_tokens=4), 400,
             "min_tokens (4) must be at most max_tokens (3)", "min_tokens")
    error_of(complete(client, prompt="a", min_tokens=-1), 400, "min_tokens must be >= 0, got -1", "min_tokens")
    error_of(complete(client, prompt="a", ignore_eos=1), 400, "ignore_eos must be true or false, got 1", "ignore_eos")


def test_tokenize_and_detokenize(client, gen, enc_client, enc):
    text = "The cat sat"
    body = client.post("/tokenize", json={"model": "tiny-gpt", "prompt": text}).json()
    assert body == {"tokens": gen.tokenizer.encode(text), "count": len(gen.tokenizer.encode(text)),
                    "max_model_len": CONTEXT}
    assert client.post("/tokenize", json={"prompt": text}).json()["tokens"] == body["tokens"]  # model optional
    assert client.post("/detokenize", json={"tokens": body["tokens"]}).json() == {
        "prompt": gen.tokenizer.decode(body["tokens"], skip_special_tokens=True)}
    messages = [{"role": "user", "content": "Hello there"}]
    ids = gen.tokenizer.encode(gen.apply_chat_template(messages, add_generation_prompt=True), add_special_tokens=False)
    assert client.post("/tokenize", json={"messages": messages}).json()["tokens"] == ids
    assert enc_client.post("/tokenize", json={"prompt": "t5 t6"}).json()["tokens"] == enc.tokenizer.encode("t5 t6")
    error_of(client.post("/tokenize", json={"prompt": 5}), 400, "prompt must be a string (or send messages), got 5",
             "prompt")
    error_of(client.post("/tokenize", json={"model": "x", "prompt": "a"}), 404, "the model 'x' does not exist",
             "model", "model_not_found")
    error_of(enc_client.post("/tokenize", json={"messages": messages}), 400,
             "messages need a decoder with a chat template", "messages")
    error_of(client.post("/detokenize", json={"tokens": [1, VOCAB]}), 400,
             f"token id {VOCAB} in tokens is out of range [0, {VOCAB})", "tokens")
    error_of(client.post("/detokenize", json={"tokens": "1 2"}), 400, "tokens must be a list of token ids", "tokens")
    error_of(client.post("/detokenize", content=b"{"), 400, "the request body is not valid JSON")


def test_streamed_completion_joins_to_the_text(client, gen):
    for prompt in PROMPTS[:3]:
        plain = complete(client, prompt=prompt, max_tokens=15).json()["choices"][0]
        with client.stream("POST", "/v1/completions", json=dict(model="tiny-gpt", prompt=prompt, max_tokens=15,
                                                                temperature=0, stream=True)) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            chunks = events(response.read().decode())
        assert all(c["object"] == "text_completion" for c in chunks)
        assert "".join(c["choices"][0]["text"] for c in chunks) == plain["text"]
        assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == plain["finish_reason"]
        assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
        assert len(chunks) > 3  # piece by piece


def test_streamed_chat_and_usage(client, gen):
    messages = [{"role": "user", "content": "Why is the sky"}]
    plain = client.post("/v1/chat/completions", json=dict(model="tiny-gpt", messages=messages, max_tokens=12,
                                                          temperature=0, stop=["e"])).json()
    response = client.post("/v1/chat/completions", json=dict(model="tiny-gpt", messages=messages, max_tokens=12,
                                                             temperature=0, stop=["e"], stream=True,
                                                             stream_options={"include_usage": True}))
    chunks = events(response.text)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == \
        plain["choices"][0]["message"]["content"]
    assert chunks[-2]["choices"][0]["finish_reason"] == plain["choices"][0]["finish_reason"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == plain["usage"]


# ---- log-probabilities ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference(gen_dir):
    """log_softmax of transformers' logits for a token sequence [T, V]."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(gen_dir), torch_dtype=torch.float32).eval()

    def log_probs(ids):
        with torch.no_grad():
            return torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1).numpy()
    return log_probs


def _check_completion_logprobs(gen, logprobs, ids, first, reference, n):
    """logprobs (the completions shape) of tokens ids[first:] under the reference of ids; entry 0 is
    the prompt's first token when first == 0."""
    strings = [gen.tokenizer.decode([t], skip_special_tokens=False) for t in ids[first:]]
    assert logprobs["tokens"] == strings
    for k, (t, lp, top) in enumerate(zip(ids[first:], logprobs["token_logprobs"], logprobs["top_logprobs"])):
        position = first + k
        if position == 0:
            assert lp is None and top is None
            continue
        row = reference[position - 1]
        assert abs(lp - row[t]) < 1e-4, (position, lp, row[t])
        # the n most likely by text (two ids of one text: one entry), the chosen token's added
        expected = {gen.tokenizer.decode([int(b)], skip_special_tokens=False): row[b] for b in np.argsort(-row)[:n]}
        expected.setdefault(strings[k], row[t])
        assert set(top) == set(expected), (top, expected)
        for text, value in top.items():
            assert abs(value - expected[text]) < 1e-4


def completion_logprobs_of(client, ids):
    """The echoed prompt's part of a completion's logprobs (max_tokens 1, logprobs 2)."""
    whole = complete(client, prompt=ids, max_tokens=1, logprobs=2, echo=True).json()["choices"][0]["logprobs"]
    return {key: values[:len(ids)] for key, values in whole.items()}


def test_completion_logprobs_are_the_models(client, gen, reference):
    prompt = "The cat sat"
    ids = gen.tokenizer.encode(prompt)
    # Greedy, sampled (the raw distribution, not the tempered one), with a stop string.
    sampled = dict(temperature=1.0, seed=9)
    text = complete(client, prompt=prompt, max_tokens=12, **sampled).json()["choices"][0]["text"]
    stop = next(text[k] for k in range(3, len(text)) if text.find(text[k]) == k)  # first seen at k >= 3
    for options in (dict(), dict(temperature=0.8, top_k=20, seed=4), dict(sampled, stop=stop)):
        plain = complete(client, prompt=prompt, max_tokens=12, **options).json()["choices"][0]
        body = complete(client, prompt=prompt, max_tokens=12, logprobs=3, **options).json()
        (choice,) = body["choices"]
        assert choice["text"] == plain["text"] and choice["finish_reason"] == plain["finish_reason"]
        logprobs = choice["logprobs"]
        sampling = {k: v for k, v in options.items() if k != "stop"}
        generated = gen.generate(ids, max_new_tokens=12, **(dict(sampling, do_sample=True) if sampling else {}))[0]
        kept = len(logprobs["tokens"])
        assert kept == (len(generated) if "stop" not in options else kept) and 0 < kept <= len(generated)
        tokens = ids + generated[:kept]
        _check_completion_logprobs(gen, logprobs, tokens, len(ids), reference(tokens), 3)
        offsets = logprobs["text_offset"]
        assert offsets == sorted(offsets) and offsets[0] == 0 and all(o < len(choice["text"]) + 1 for o in offsets)
        for t, text, offset in zip(generated, logprobs["tokens"], offsets):  # whole, shown tokens
            if "\ufffd" not in text and gen.tokenizer.decode([t]) == text:
                assert choice["text"][offset:offset + len(text)] == text[:len(choice["text"]) - offset]
        if "stop" in options:  # only tokens that begin before the cut
            assert choice["finish_reason"] == "stop" and all(o < len(choice["text"]) for o in offsets)
    # echo: the prompt's text and its tokens first (the first one has no log-probability)
    body = complete(client, prompt=prompt, max_tokens=4, logprobs=2, echo=True).json()
    (choice,) = body["choices"]
    answer = complete(client, prompt=prompt, max_tokens=4).json()["choices"][0]["text"]
    assert choice["text"] == gen.tokenizer.decode(ids) + answer
    generated = gen.generate(ids, max_new_tokens=4)[0]
    tokens = ids + generated
    _check_completion_logprobs(gen, choice["logprobs"], tokens, 0, reference(tokens), 2)
    assert choice["logprobs"]["text_offset"][len(ids)] == len(gen.tokenizer.decode(ids))
    assert body["usage"]["completion_tokens"] == len(generated)
    plain = complete(client, prompt=prompt, max_tokens=4, echo=True).json()["choices"][0]
    assert plain["text"] == choice["text"] and plain["logprobs"] is None
    # max_tokens 0 with echo: the prompt alone, scored (what a harness asks to score a text)
    scoring = complete(client, prompt=[ids, ids[:2]], max_tokens=0, logprobs=2, echo=True).json()
    for choice, prompt_ids in zip(scoring["choices"], [ids, ids[:2]]):
        assert choice["text"] == gen.tokenizer.decode(prompt_ids) and choice["finish_reason"] == "length"
        assert choice["logprobs"] == completion_logprobs_of(client, prompt_ids)
    assert scoring["usage"]["completion_tokens"] == 0
    assert complete(client, prompt=prompt, max_tokens=0, echo=True).json()["choices"][0]["logprobs"] is None
    # echo with a stop string: every prompt token, then the generated ones before the cut
    cut = complete(client, prompt=prompt, max_tokens=12, stop=stop, **sampled).json()["choices"][0]
    echoed = complete(client, prompt=prompt, max_tokens=12, stop=stop, logprobs=1, echo=True, **sampled).json()
    (choice,) = echoed["choices"]
    kept = complete(client, prompt=prompt, max_tokens=12, stop=stop, logprobs=1, **sampled).json()
    assert choice["text"] == gen.tokenizer.decode(ids) + cut["text"]
    assert choice["logprobs"]["tokens"] == [gen.tokenizer.decode([t], skip_special_tokens=False) for t in ids] + \
        kept["choices"][0]["logprobs"]["tokens"]
    # a stream carries each piece's tokens: together, the whole answer's
    whole = complete(client, prompt=prompt, max_tokens=12, logprobs=2, echo=True).json()["choices"][0]
    response = client.post("/v1/completions", json=dict(model="tiny-gpt", prompt=prompt, max_tokens=12,
                                                         temperature=0, logprobs=2, echo=True, stream=True))
    chunks = [c["choices"][0] for c in events(response.text)]
    assert "".join(c["text"] for c in chunks) == whole["text"]
    joined = {key: [v for c in chunks if c["logprobs"] for v in c["logprobs"][key]] for key in whole["logprobs"]}
    assert joined == whole["logprobs"]


def test_chat_logprobs(client, gen, reference):
    messages = [{"role": "user", "content": "Hello there"}]
    request = dict(model="tiny-gpt", messages=messages, max_tokens=10, temperature=0)
    plain = client.post("/v1/chat/completions", json=request).json()["choices"][0]
    assert plain["logprobs"] is None
    choice = client.post("/v1/chat/completions", json=dict(request, logprobs=True, top_logprobs=2)).json()["choices"][0]
    assert choice["message"] == plain["message"]
    content = choice["logprobs"]["content"]
    assert choice["logprobs"]["refusal"] is None
    ids = gen.tokenizer.encode(gen.apply_chat_template(messages, add_generation_prompt=True), add_special_tokens=False)
    generated = gen.generate(ids, max_new_tokens=10)[0]
    rows = reference(ids + generated)
    assert len(content) == len(generated)
    for k, (entry, token) in enumerate(zip(content, generated)):
        row = rows[len(ids) - 1 + k]
        assert entry["token"] == gen.tokenizer.decode([token], skip_special_tokens=False)
        assert abs(entry["logprob"] - row[token]) < 1e-4
        assert len(entry["top_logprobs"]) == 2
        np.testing.assert_allclose([t["logprob"] for t in entry["top_logprobs"]], np.sort(row)[::-1][:2], atol=1e-4)
        for alternative in entry["top_logprobs"] + [entry]:
            assert alternative["bytes"] is not None
    # the bytes join to the text (whole characters or not); the end-of-text token decodes to nothing
    shown = [e for e, t in zip(content, generated) if gen.tokenizer.decode([t])]
    assert bytes(b for e in shown for b in e["bytes"]).decode() == plain["message"]["content"]
    only = client.post("/v1/chat/completions", json=dict(request, logprobs=True)).json()["choices"][0]["logprobs"]
    assert [e["top_logprobs"] for e in only["content"]] == [[]] * len(content)
    response = client.post("/v1/chat/completions", json=dict(request, logprobs=True, top_logprobs=2, stream=True))
    streamed = [e for c in events(response.text) if c["choices"] and c["choices"][0]["logprobs"]
                for e in c["choices"][0]["logprobs"]["content"]]
    assert streamed == content


# ---- errors ---------------------------------------------------------------------------------------


def test_request_errors(client):
    c = client
    error_of(c.post("/v1/completions", content=b"{not json"), 400, "the request body is not valid JSON")
    error_of(c.post("/v1/completions", json=[1, 2]), 400, "the request body must be a JSON object")
    error_of(complete(c, model="gpt-4"), 404, "the model 'gpt-4' does not exist; this server serves 'tiny-gpt'",
             "model", "model_not_found")
    error_of(c.post("/v1/completions", json={"prompt": "a"}), 400, "you must provide a model parameter", "model")
    error_of(c.post("/v1/completions", json={"model": "tiny-gpt"}), 400, "you must provide a prompt parameter",
             "prompt")
    error_of(c.post("/v1/chat/completions", json={"model": "tiny-gpt"}), 400, "you must provide a messages parameter",
             "messages")
    error_of(c.post("/v1/chat/completions", json={"model": "tiny-gpt", "messages": []}), 400,
             "messages must be a non-empty list", "messages")
    error_of(c.post("/v1/chat/completions", json={"model": "tiny-gpt", "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}), 400,
        "only text content parts are supported", "messages")
    error_of(complete(c, prompt="a", max_tokens=0), 400,
             "max_tokens must be at least 1 (0 only with echo: true), got 0", "max_tokens")
    error_of(complete(c, prompt="a", max_tokens=-3), 400, "max_tokens must be at least 1 (0 only with echo: true), "
             "got -3", "max_tokens")
    error_of(complete(c, prompt="a", max_tokens=-1, echo=True), 400, "max_tokens must be at least 1", "max_tokens")
    error_of(complete(c, prompt="a", max_tokens=0, echo=True, stream=True), 400,
             "max_tokens: 0 (scoring the prompt) is not supported with stream: true", "max_tokens")
    error_of(complete(c, prompt="a", max_tokens="5"), 400, "max_tokens must be an integer, got '5'", "max_tokens")
    error_of(complete(c, prompt="a", temperature=-1), 400, "temperature must be >= 0, got -1.0", "temperature")
    error_of(complete(c, prompt="a", temperature="hot"), 400, "temperature must be a number", "temperature")
    error_of(complete(c, prompt="a", top_p=0), 400, "top_p must be in (0, 1], got 0.0", "top_p")
    error_of(complete(c, prompt="a", top_k=-1), 400, "top_k must be >= 0, got -1", "top_k")
    error_of(complete(c, prompt="a", seed=-1), 400, "seed must be >= 0, got -1", "seed")
    error_of(complete(c, prompt="a", n=0), 400, "n must be >= 1, got 0", "n")
    error_of(complete(c, prompt="a", stop=[""]), 400, "stop must be a non-empty string or a list of them", "stop")
    long = error_of(complete(c, prompt="a", stop=[""] * 5000), 400, "stop must be a non-empty string", "stop")
    assert len(long["message"]) < 250 and "... (20000 characters)" in long["message"]  # not the whole value back
    error_of(complete(c, prompt="a", stream="yes"), 400, "stream must be true or false", "stream")
    error_of(complete(c, prompt="a", stream=True, n=2), 400, "stream: true takes one prompt and n = 1", "n")
    error_of(complete(c, prompt=["a", "b"], stream=True), 400, "stream: true takes one prompt and n = 1", "prompt")
    error_of(complete(c, prompt="a", logprobs=21), 400, "logprobs must be <= 20, got 21", "logprobs")
    error_of(complete(c, prompt="a", logprobs=-1), 400, "logprobs must be >= 0, got -1", "logprobs")
    error_of(complete(c, prompt="a", logprobs=True), 400, "logprobs must be an integer, got True", "logprobs")
    error_of(complete(c, prompt="a", echo="yes"), 400, "echo must be true or false, got 'yes'", "echo")
    for key in ("presence_penalty", "frequency_penalty"):
        error_of(complete(c, prompt="a", **{key: 2.5}), 400, f"{key} must be in [-2, 2], got 2.5", key)
        error_of(complete(c, prompt="a", **{key: "high"}), 400, f"{key} must be a number, got 'high'", key)
    error_of(complete(c, prompt="a", logit_bias=[[5, 1]]), 400,
             "logit_bias must be an object of token ids to numbers, got [[5, 1]]", "logit_bias")
    error_of(complete(c, prompt="a", logit_bias={"cat": 1}), 400, "logit_bias keys must be token ids (digits), got "
             "'cat'", "logit_bias")
    error_of(complete(c, prompt="a", logit_bias={"-5": 1}), 400, "logit_bias keys must be token ids (digits), got "
             "'-5'", "logit_bias")
    error_of(complete(c, prompt="a", logit_bias={str(VOCAB): 1}), 400,
             f"logit_bias token id {VOCAB} is out of range [0, {VOCAB})", "logit_bias")
    error_of(complete(c, prompt="a", logit_bias={"5": 101}), 400,
             "logit_bias of token 5 must be a number in [-100, 100], got 101", "logit_bias")
    error_of(complete(c, prompt="a", logit_bias={"5": True}), 400,
             "logit_bias of token 5 must be a number in [-100, 100], got True", "logit_bias")
    chat = dict(model="tiny-gpt", messages=[{"role": "user", "content": "a"}], max_tokens=2)
    error_of(c.post("/v1/chat/completions", json=dict(chat, logit_bias={"5": -101})), 400,
             "logit_bias of token 5 must be a number in [-100, 100], got -101", "logit_bias")
    error_of(c.post("/v1/chat/completions", json=dict(chat, echo=True)), 400,
             "echo is not supported by cpuformer serve", "echo", "unsupported_parameter")
    error_of(c.post("/v1/chat/completions", json=dict(chat, logprobs=2)), 400, "logprobs must be true or false, got 2",
             "logprobs")
    error_of(c.post("/v1/chat/completions", json=dict(chat, top_logprobs=2)), 400, "top_logprobs needs logprobs: true",
             "top_logprobs")
    error_of(c.post("/v1/chat/completions", json=dict(chat, logprobs=True, top_logprobs=21)), 400,
             "top_logprobs must be <= 20, got 21", "top_logprobs")
    assert complete(c, prompt="").status_code == 200  # this tokenizer adds BOS: one token
    error_of(complete(c, prompt=[]), 400, "prompt must be a non-empty string, a list of token ids", "prompt")
    error_of(complete(c, prompt=7), 400, "prompt must be a non-empty string, a list of token ids", "prompt")
    error_of(complete(c, prompt=[1, VOCAB]), 400, f"token id {VOCAB} in prompt is out of range [0, {VOCAB})", "prompt")
    error_of(complete(c, prompt=[5] * CONTEXT), 400, f"this model's maximum context length is {CONTEXT} tokens; "
             f"the prompt has {CONTEXT} tokens", "prompt", "context_length_exceeded")
    error_of(c.post("/v1/embeddings", json={"model": "tiny-gpt", "input": "a"}), 400,
             "/v1/embeddings needs an encoder (embedding) model; 'tiny-gpt' is a Generator (use /v1/completions and "
             "/v1/chat/completions)", "model", "wrong_model_kind")
    error_of(c.post("/v1/chat/completions", json={"model": "tiny-gpt", "messages": [{"role": "king", "content": "a"}]}),
             400, "message 0 has the unknown role 'king'; roles are")
    error_of(c.post("/v1/chat/completions", json={"model": "tiny-gpt", "messages": [{"role": "user"}]}), 400,
             "message 0 (user) needs a 'content' string, got None")
    error_of(complete(c, prompt="a", n=65), 400, "this request asks for 65 completions (prompts × n); at most 64 "
             "(--max-queue)", "n")
    error_of(c.get("/v1/nothing"), 404, "Not Found")
    error_of(c.get("/v1/completions"), 405, "Method Not Allowed")
    assert c.get("/health").status_code == 200  # still serving


_WILD = [None, True, False, 0, 1, -1, 2 ** 31, 2 ** 63, 2 ** 64, -2 ** 63, 10 ** 30, 0.5, -0.0, 1e308, float("nan"),
         float("inf"), -float("inf"), "", "a", "\x00", "é😀", "x" * 3000, [], [1], [[]], [[1, 2]], [None], ["a", 1], {},
         {"a": 1}, [1.5], [-1], [VOCAB - 1], [VOCAB], [[VOCAB]], [True]]
_FIELDS = ["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
           "seed", "n", "stop", "stream", "stream_options", "logprobs", "echo", "suffix", "best_of",
           "presence_penalty", "frequency_penalty", "logit_bias", "tools", "top_logprobs", "user", "input",
           "tool_choice", "parallel_tool_calls", "response_format", "repetition_penalty", "min_tokens", "ignore_eos",
           "tokens",
           "encoding_format", "dimensions"]


# Messages of Python's own TypeError/ValueError/KeyError/IndexError (not cpuformer's).
_PYTHON_ERRORS = ["can only concatenate", "unsupported operand", "not subscriptable", "has no attribute",
                  "index out of range", "unhashable type", "object of type", "argument of type", "object is not",
                  "invalid literal", "takes no arguments", "positional argument", "not supported between",
                  "must be str, not", "must be real number", "object cannot be interpreted"]


def _wild(rng, depth=0):
    r = rng.random()
    if depth < 2 and r < 0.1:
        return [_wild(rng, depth + 1) for _ in range(int(rng.integers(0, 4)))]
    if depth < 2 and r < 0.15:
        return {str(rng.choice(["role", "content", "type", "text", "x"])): _wild(rng, depth + 1)
                for _ in range(int(rng.integers(0, 4)))}
    return _WILD[int(rng.integers(len(_WILD)))]


def test_random_bodies_get_an_answer_or_an_openai_error(client, enc_client):
    """Valid requests with 1-3 fields replaced by random JSON values (NaN and ±Infinity included,
    which Python's JSON reader accepts), and random messages: each answer is a 200 with a JSON
    body or a stream without an error event, or a 4xx with the OpenAI error body — never a 500."""
    rng = np.random.default_rng(0)
    bases = {"/v1/completions": (client, {"model": "tiny-gpt", "prompt": "Hello there", "max_tokens": 3,
                                          "temperature": 0}),
             "/v1/chat/completions": (client, {"model": "tiny-gpt", "messages": [{"role": "user", "content": "Hi"}],
                                               "max_tokens": 3, "temperature": 0}),
             "/v1/embeddings": (enc_client, {"model": "bert", "input": "hello"}),
             "/tokenize": (client, {"model": "tiny-gpt", "prompt": "Hello there"}),
             "/detokenize": (client, {"model": "tiny-gpt", "tokens": [5, 6, 7]})}
    statuses = set()
    for _ in range(400):
        path = list(bases)[int(rng.integers(len(bases)))]
        c, base = bases[path]
        body = dict(base)
        if path == "/v1/chat/completions" and rng.random() < 0.5:
            body["messages"] = [{"role": rng.choice(["user", "system", "assistant", "tool"]) if rng.random() < 0.8
                                 else _wild(rng), "content": "hi" if rng.random() < 0.5 else _wild(rng)}
                                for _ in range(int(rng.integers(0, 4)))]
        for _ in range(int(rng.integers(1, 4))):
            body[_FIELDS[int(rng.integers(len(_FIELDS)))]] = _wild(rng)
        raw = json.dumps(body if rng.random() < 0.95 else _wild(rng), allow_nan=True).encode()
        response = c.post(path, content=raw, headers={"content-type": "application/json"})
        statuses.add(response.status_code)
        assert response.status_code in (200, 400, 404, 413, 429), (raw[:300], response.text[:300])
        if response.status_code != 200:
            error = response.json()
            assert set(error) == {"error"} and isinstance(error["error"]["message"], str), (raw[:300], error)
            # Library errors become 400s with their own message; Python's own would mean a slip.
            assert not any(p in error["error"]["message"] for p in _PYTHON_ERRORS), (raw[:300], error)
        elif "text/event-stream" in response.headers["content-type"]:
            assert '"error"' not in response.text, (raw[:300], response.text[:300])
        else:
            assert isinstance(response.json(), dict)
    assert {200, 400} <= statuses
    assert client.get("/health").status_code == 200 and enc_client.get("/health").status_code == 200


def test_body_limit(gen):
    app = serve.create_app(gen, max_body=1000)
    try:
        with TestClient(app) as c:
            error_of(complete(c, prompt="a" * 2000), 413, "the request body is larger than 1000 bytes (--max-body)",
                     code="request_too_large")

            def chunks():  # no content-length: counted while read
                yield b'{"model": "tiny-gpt", "prompt": "'
                for _ in range(100):
                    yield b"a" * 100
                yield b'"}'

            error_of(c.post("/v1/completions", content=chunks()), 413, "larger than 1000 bytes",
                     code="request_too_large")
            assert complete(c, prompt="a").status_code == 200
    finally:
        app.state.close()
    with pytest.raises(ValueError, match="max_batch, max_queue and max_body must be >= 1"):
        serve.create_app(gen, max_queue=0)


def test_empty_prompt_and_no_chat_template(tmp_path):
    directory = _bench.build_model("decoder", TINY["decoder"], str(tmp_path / "m"))  # no BOS
    with cf.load(directory) as model:
        app = serve.create_app(model)
        try:
            with TestClient(app) as c:
                error_of(complete(c, model="m", prompt=""), 400, "the prompt is empty (it encodes to no tokens)",
                         "prompt")
                assert complete(c, model="m", prompt="t5").status_code == 200
                no_template = c.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user",
                                                                                              "content": "t5"}]})
                error_of(no_template, 400, "has no chat template")
                # the library's message names the directory; the client sees the model name instead
                assert directory not in no_template.text and no_template.json()["error"]["message"].startswith("m ")
        finally:
            app.state.close()


def test_decoder_without_tokenizer_is_refused(tmp_path):
    directory = _bench.build_model("decoder", TINY["decoder"], str(tmp_path / "m"))
    os.remove(os.path.join(directory, "tokenizer.json"))
    with cf.load(directory) as model:
        with pytest.raises(ValueError, match=r"cpuformer serve needs a decoder's tokenizer \(the API answers with "
                                             r"text\)"):
            serve.create_app(model)


@pytest.fixture(scope="module")
def s2s(tmp_path_factory):
    directory = _bench.build_model("seq2seq", TINY["seq2seq"], str(tmp_path_factory.mktemp("serve") / "tiny-marian"))
    with cf.load(directory) as model:
        yield model


def test_seq2seq_completions(s2s):
    """An encoder-decoder model answers /v1/completions: each prompt a source, the text
    Seq2Seq.generate's with the same options (greedy, beams as the num_beams extension, seeded
    sampling); streamed as one chunk; chat is refused."""
    sources = ["t5 t6 t7", "t9 t10", "t11 t12 t13 t14"]
    app = serve.create_app(s2s, model_name="marian")
    try:
        with TestClient(app) as c:
            def texts(**body):
                answer = c.post("/v1/completions", json=dict(dict(model="marian", temperature=0), **body))
                assert answer.status_code == 200, answer.text
                return [choice["text"] for choice in answer.json()["choices"]]

            assert texts(prompt=sources, max_tokens=12) == s2s.generate(sources, max_new_tokens=12)
            many = [f"t{i} t{i + 2}" for i in range(70)]  # more than --max-batch (32): several generate calls
            assert texts(prompt=many, max_tokens=6) == s2s.generate(many, max_new_tokens=6)
            assert texts(prompt=sources[0]) == [s2s.generate(sources[0], max_new_tokens=63)]  # (64 positions)
            ids = s2s.tokenizer.encode(sources[1])
            assert texts(prompt=ids, max_tokens=12) == [s2s.tokenizer.decode(s2s.generate(ids, max_new_tokens=12)[0],
                                                                              skip_special_tokens=True)]
            assert texts(prompt=sources[0], max_tokens=12, n=2) == [s2s.generate(sources[0], max_new_tokens=12)] * 2
            assert texts(prompt=sources[0], max_tokens=12, num_beams=3, n=2) == s2s.generate(
                sources[0], max_new_tokens=12, num_beams=3, num_return_sequences=2)
            assert texts(prompt=sources[2], max_tokens=12, temperature=0.9, seed=5, n=2) == s2s.generate(
                sources[2], max_new_tokens=12, do_sample=True, temperature=0.9, seed=5, num_return_sequences=2)
            assert texts(prompt=sources[0], max_tokens=12, logit_bias={"91": -100}) == [
                s2s.generate(sources[0], max_new_tokens=12, logit_bias={91: -100.0})]
            body = c.post("/v1/completions", json=dict(model="marian", prompt=sources[0], max_tokens=12,
                                                       temperature=0)).json()
            result = s2s.generate(sources[0], max_new_tokens=12, return_scores=True)[0]
            assert body["choices"][0]["finish_reason"] == {"eos": "stop"}.get(result.finish_reason,
                                                                              result.finish_reason)
            n_prompt = len(s2s.tokenizer.encode(sources[0]))
            assert body["usage"] == {"prompt_tokens": n_prompt, "completion_tokens": len(result.token_ids),
                                     "total_tokens": n_prompt + len(result.token_ids)}
            chunks = events(c.post("/v1/completions", json=dict(model="marian", prompt=sources[0], max_tokens=12,
                                                                temperature=0, stream=True,
                                                                stream_options={"include_usage": True})).text)
            texts_streamed = [ch["choices"][0]["text"] for ch in chunks if ch["choices"]]
            assert "".join(texts_streamed) == body["choices"][0]["text"]
            assert len([t for t in texts_streamed if t]) > 3  # piece by piece (Seq2Seq.stream), not one chunk
            assert chunks[-2]["choices"][0]["finish_reason"] == body["choices"][0]["finish_reason"]
            assert chunks[-1]["usage"] == body["usage"]
            pieces = list(s2s.stream(sources[0], max_new_tokens=12))
            assert texts_streamed[:len(pieces)] == pieces
            # token ids or several choices: each completion as one chunk
            chunks = events(c.post("/v1/completions", json=dict(model="marian", prompt=[sources[0], sources[1]],
                                                                max_tokens=12, temperature=0, stream=True)).text)
            assert [ch["choices"][0]["text"] for ch in chunks if ch["choices"][0]["finish_reason"] is None] == \
                s2s.generate(sources[:2], max_new_tokens=12)
            base = dict(model="marian", prompt="t5", max_tokens=4)
            error_of(c.post("/v1/completions", json=dict(base, logprobs=2)), 400,
                     "logprobs is not supported for encoder-decoder models", "logprobs", "unsupported_parameter")
            error_of(c.post("/v1/completions", json=dict(base, echo=True)), 400,
                     "echo is not supported for encoder-decoder models", "echo", "unsupported_parameter")
            error_of(c.post("/v1/completions", json=dict(base, num_beams=2, temperature=0.5)), 400,
                     "num_beams > 1 is beam search: it needs temperature: 0", "num_beams")
            error_of(c.post("/v1/completions", json=dict(base, num_beams=2, n=3, temperature=0)), 400,
                     "n (3) must be at most num_beams (2)", "n")
            error_of(c.post("/v1/completions", json=dict(base, num_beams=0)), 400, "num_beams must be >= 1, got 0",
                     "num_beams")
            for extra in ({}, {"stream": True}):  # a bad language code: a 400 before anything is streamed
                error_of(c.post("/v1/completions", json=dict(base, tgt_lang="fr", **extra)), 400,
                         "tgt_lang='fr': this model's vocabulary has no language codes")
            error_of(c.post("/v1/completions", json=dict(base, tgt_lang=5)), 400,
                     "tgt_lang must be a language code string, got 5", "tgt_lang")
            error_of(c.post("/v1/completions", json=dict(base, prompt=[])), 400, "prompt must be a non-empty string",
                     "prompt")
            error_of(c.post("/v1/completions", json=dict(base, prompt=["a", ""])), 400,
                     "prompt must be a non-empty string", "prompt")
            error_of(c.post("/v1/completions", json=dict(base, prompt=[1, 999])), 400,
                     "token id 999 in prompt is out of range [0, 200)", "prompt")
            for extra in ({}, {"stream": True}):
                error_of(c.post("/v1/completions", json=dict(base, max_tokens=500, **extra)), 400,
                         "max_tokens 500 exceeds this model's maximum of 63 target tokens", "max_tokens",
                         "context_length_exceeded")
                error_of(c.post("/v1/completions", json=dict(base, prompt=" ".join(["t5"] * 100), **extra)), 400,
                         "this model's maximum source length is 64 tokens; a prompt has 100", "prompt",
                         "context_length_exceeded")
            error_of(c.post("/v1/chat/completions", json=dict(model="marian", messages=[{"role": "user",
                                                                                          "content": "a"}])),
                     400, "/v1/chat/completions needs a decoder (text generation) model; 'marian' is a Seq2Seq (use "
                     "/v1/completions)", "model", "wrong_model_kind")
            error_of(c.post("/v1/embeddings", json=dict(model="marian", input="a")), 400, "(use /v1/completions)",
                     "model", "wrong_model_kind")
            assert c.get("/health").status_code == 200
    finally:
        app.state.close()


def sent_while_busy(app, path, bodies):
    """Each body POSTed to ``path`` by its own client while the worker is held busy, released once
    all wait in the queue: (the answers in order, the /metrics text after them)."""
    release = threading.Event()
    results = {}
    try:
        with Running(app) as running:
            engine = app.state.engine
            engine.submit(serve._Job("run", lambda: release.wait(30)))  # holds the worker

            def send(i):
                with httpx.Client(base_url=running.url, timeout=60) as h:
                    results[i] = h.post(path, json=bodies[i]).json()

            threads = [threading.Thread(target=send, args=(i,)) for i in range(len(bodies))]
            for t in threads:
                t.start()
            deadline = time.time() + 30
            while engine.depth < len(bodies):
                assert time.time() < deadline, engine.depth
                time.sleep(0.01)
            release.set()
            for t in threads:
                t.join(60)
            text = httpx.get(running.url + "/metrics").text
    finally:
        release.set()
    return [results[i] for i in range(len(bodies))], text


def test_concurrent_seq2seq_requests_share_a_generate_call(s2s):
    """Completions with the same options that wait while the worker is busy run as one batch of
    sources (one generate call); each gets its own outputs, those of the source alone."""
    prompts = [[f"t{i} t{i + 1}"] * (1 + i % 2) for i in range(6)]
    results, text = sent_while_busy(serve.create_app(s2s, model_name="marian", max_batch=64), "/v1/completions",
                                    [{"model": "marian", "prompt": p, "max_tokens": 10, "temperature": 0}
                                     for p in prompts])
    assert metric(text, "cpuformer_batch_size_count") == 1
    assert metric(text, "cpuformer_batch_size_sum") == sum(len(p) for p in prompts)
    for i, p in enumerate(prompts):
        assert [c["text"] for c in results[i]["choices"]] == s2s.generate(p, max_new_tokens=10)


def test_max_length_bounds_each_request(gen):
    with pytest.raises(ValueError, match=r"prefill_slowdown must be 0 \(off\) or a finite number >= 1, got 0.5"):
        serve.create_app(gen, prefill_slowdown=0.5)
    app = serve.create_app(gen, max_length=48, max_batch=2, prefill_chunk=4)
    try:
        with TestClient(app) as c:
            assert app.state.engine.batcher.max_length == 48 and app.state.engine.batcher.capacity == 2
            error_of(complete(c, prompt=[5] * 48), 400, "this model's maximum context length is 48 tokens; the "
                     "prompt has 48 tokens", "prompt", "context_length_exceeded")
            error_of(complete(c, prompt=[5] * 20, max_tokens=29), 400,
                     "prompt length 20 + max_new_tokens 29 exceeds the batcher's max_length of 48 tokens")
            body = complete(c, prompt=[5] * 20, max_tokens=28, temperature=0).json()
            assert body["usage"]["completion_tokens"] == 28 or body["choices"][0]["finish_reason"] == "stop"
            chat = c.post("/v1/chat/completions", json=dict(model="tiny-gpt", temperature=0,
                                                            messages=[{"role": "user", "content": "Hi"}])).json()
            assert chat.get("usage"), chat
            assert chat["usage"]["total_tokens"] <= 48  # the default max_tokens fills the rest of the context
    finally:
        app.state.close()


def test_a_kv_cache_too_large_names_the_options(gen):
    with pytest.raises(ValueError, match=r"capacity 100000000 × max_length 4096 is too large.*\(--max-batch\) or "
                                         r"shorter ones \(--max-length\).*\(--kv-cache-dtype\)"):
        serve.create_app(gen, max_batch=10 ** 8)


def _blocking_stream(release):
    """A streamed sequence whose first text piece holds the worker until release is set: requests
    sent meanwhile stay queued."""
    return serve._Job("generate", ids=[1, 2], options=dict(max_new_tokens=40), put=lambda _piece: release.wait(60))


def test_full_queue_answers_429_at_once(gen):
    app = serve.create_app(gen, max_queue=2)
    release = threading.Event()
    try:
        with TestClient(app) as c:
            engine = app.state.engine
            blocker = engine.submit(_blocking_stream(release))
            deadline = time.time() + 10
            while engine.depth:  # the worker has taken the blocker
                assert time.time() < deadline
                time.sleep(0.01)
            waiting = [engine.submit(serve._Job("generate", ids=[3], options=dict(max_new_tokens=2)))
                       for _ in range(2)]
            start = time.time()
            error_of(complete(c, prompt="a"), 429, "the server is busy: 2 requests are waiting (--max-queue 2)",
                     code="queue_full")
            assert time.time() - start < 5
            assert metric(c.get("/metrics").text, "cpuformer_queue_depth") == 2
            assert metric(c.get("/metrics").text, "cpuformer_rejected_total") == 1
            release.set()
            for job in [blocker] + waiting:
                assert job.done.wait(10)
            assert complete(c, prompt="a").status_code == 200
    finally:
        release.set()
        app.state.close()


# ---- embeddings -----------------------------------------------------------------------------------


def embed(c, **body):
    return c.post("/v1/embeddings", json=dict(dict(model="bert"), **body))


def test_embeddings_match_the_api(enc_client, enc):
    texts = ["t5 t6 t7", "t9 t10", "t11 t12 t13 t14 t15"]
    body = embed(enc_client, input=texts).json()
    assert body["object"] == "list" and body["model"] == "bert"
    assert [d["index"] for d in body["data"]] == [0, 1, 2] and body["data"][0]["object"] == "embedding"
    np.testing.assert_allclose(np.array([d["embedding"] for d in body["data"]]), enc.embed(texts), atol=1e-5)
    assert body["usage"] == {"prompt_tokens": sum(len(enc.tokenizer.encode(t)) for t in texts),
                             "total_tokens": sum(len(enc.tokenizer.encode(t)) for t in texts)}
    one = embed(enc_client, input="t9 t10").json()["data"]
    assert len(one) == 1
    np.testing.assert_allclose(one[0]["embedding"], enc.embed(["t9 t10"])[0], atol=1e-6)
    ids = [[2, 7, 8, 3], [2, 9, 3]]
    got = embed(enc_client, input=ids).json()["data"]
    np.testing.assert_allclose([d["embedding"] for d in got], enc.embed(ids), atol=1e-5)
    got = embed(enc_client, input=ids[0]).json()["data"]
    np.testing.assert_allclose(got[0]["embedding"], enc.embed(ids[:1])[0], atol=1e-6)
    encoded = embed(enc_client, input=texts, encoding_format="base64").json()["data"]
    vectors = np.array([np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in encoded])
    np.testing.assert_allclose(vectors, enc.embed(texts), atol=1e-5)
    # dimensions: the first components, normalized again (this model's embeddings are unit vectors)
    full = enc.embed(texts)
    assert np.allclose(np.linalg.norm(full, axis=1), 1, atol=1e-5)
    short = np.array([d["embedding"] for d in embed(enc_client, input=texts, dimensions=8).json()["data"]])
    np.testing.assert_allclose(short, full[:, :8] / np.linalg.norm(full[:, :8], axis=1, keepdims=True), atol=1e-5)
    assert np.array(embed(enc_client, input=texts, dimensions=32).json()["data"][0]["embedding"]).shape == (32,)


def test_shortened_embeddings_of_a_model_without_normalize(enc_dir, tmp_path):
    """A sentence-transformers directory without a Normalize module: dimensions keeps the first
    components as they are (the vectors were not unit length to begin with)."""
    directory = tmp_path / "unnormalized"
    shutil.copytree(enc_dir, directory)
    (directory / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (directory / "1_Pooling").mkdir()
    (directory / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32,
                                                                     "pooling_mode_mean_tokens": True}))
    with cf.load(directory) as model:
        full = model.embed(["t5 t6", "t7"])
        assert np.linalg.norm(full[0]) > 1.5
        app = serve.create_app(model, model_name="u")
        try:
            with TestClient(app) as c:
                short = c.post("/v1/embeddings", json={"model": "u", "input": ["t5 t6", "t7"], "dimensions": 5}).json()
            np.testing.assert_allclose([d["embedding"] for d in short["data"]], full[:, :5], atol=1e-5)
        finally:
            app.state.close()


def test_embedding_errors(enc_client):
    c = enc_client
    error_of(c.post("/v1/embeddings", json={"model": "bert"}), 400, "you must provide an input parameter", "input")
    error_of(embed(c, input=[]), 400, "input must be a non-empty string, a list of strings", "input")
    error_of(embed(c, input=["a", 1]), 400, "input must be a non-empty string, a list of strings", "input")
    error_of(embed(c, input=[""]), 400, "input strings must not be empty", "input")
    error_of(embed(c, input=["a"] * 2049), 400, "input holds 2049 items; at most 2048 per request", "input")
    error_of(embed(c, input=[1, 200]), 400, "token id 200 in input is out of range [0, 200)", "input")
    error_of(embed(c, input=[1] * 65), 400, "an input has 65 tokens; this model's maximum is 64", "input",
             "context_length_exceeded")
    error_of(embed(c, input="a", encoding_format="int8"), 400, "encoding_format must be 'float' or 'base64'",
             "encoding_format")
    error_of(embed(c, input="a", dimensions=33), 400, "dimensions must be at most 32 (the model's), got 33",
             "dimensions")
    error_of(embed(c, input="a", dimensions=0), 400, "dimensions must be >= 1, got 0", "dimensions")
    error_of(embed(c, input="a", dimensions="8"), 400, "dimensions must be an integer, got '8'", "dimensions")
    error_of(embed(c, model="other", input="a"), 404, "the model 'other' does not exist", "model", "model_not_found")
    error_of(c.post("/v1/completions", json={"model": "bert", "prompt": "a"}), 400,
             "/v1/completions needs a decoder (text generation) model; 'bert' is a Encoder (use /v1/embeddings)",
             "model", "wrong_model_kind")
    error_of(c.post("/v1/chat/completions", json={"model": "bert", "messages": [{"role": "user", "content": "a"}]}),
             400, "/v1/chat/completions needs a decoder", "model", "wrong_model_kind")
    assert embed(c, input="t5").status_code == 200


def test_concurrent_embeddings_are_batched(enc):
    """Requests that wait while the worker is busy go into one embed call; each gets its rows,
    equal to the one-by-one embeddings within float tolerance (padding to the batch's longest
    input changes the matrix shapes, not the math)."""
    inputs = [[f"t{i} t{i + 1}"] + [f"t{i + 2}"] * (i % 3) for i in range(12)]
    results, text = sent_while_busy(serve.create_app(enc, model_name="bert", max_batch=64), "/v1/embeddings",
                                    [{"model": "bert", "input": x} for x in inputs])
    sizes = sum(len(x) for x in inputs)
    assert metric(text, "cpuformer_batch_size_count") == 1  # one embed call for all twelve requests
    assert metric(text, "cpuformer_batch_size_sum") == sizes
    for i, x in enumerate(inputs):
        got = np.array([d["embedding"] for d in results[i]["data"]])
        np.testing.assert_allclose(got, enc.embed(x), atol=1e-5, rtol=1e-5)


def _classifier(enc_dir, directory, labels):
    """A tiny random BertForSequenceClassification with ``labels`` on the tiny encoder's
    vocabulary and tokenizer, its scores spread apart; its directory."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    with open(os.path.join(enc_dir, "config.json")) as f:
        config = json.load(f)
    torch.manual_seed(3)
    model = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=config["vocab_size"], hidden_size=config["hidden_size"], id2label=dict(enumerate(labels)),
        num_hidden_layers=config["num_hidden_layers"], num_attention_heads=config["num_attention_heads"],
        intermediate_size=config["intermediate_size"], max_position_embeddings=config["max_position_embeddings"]))
    with torch.no_grad():
        model.classifier.weight.normal_(0.0, 8.0)
    model.save_pretrained(directory)
    shutil.copyfile(os.path.join(enc_dir, "tokenizer.json"), directory / "tokenizer.json")
    return directory


@pytest.fixture(scope="module")
def sentiment(enc_dir, tmp_path_factory):
    with cf.load(_classifier(enc_dir, tmp_path_factory.mktemp("serve") / "tiny-sentiment",
                             ["negative", "neutral", "positive"])) as loaded:
        yield loaded


def test_classify(sentiment, ce, client):
    """/classify (and /v1/classify), vLLM's shape: per input the most likely label and every
    label's probability in id order, as Encoder.classify; concurrent requests batched."""
    texts = ["t5 t9", "t7 t8 t9 t10", "t1"]
    expected = sentiment.classify(texts, top_k=None)
    app = serve.create_app(sentiment, model_name="sent")
    try:
        with TestClient(app) as c:
            for path in ("/classify", "/v1/classify"):
                body = c.post(path, json={"model": "sent", "input": texts}).json()
                assert [d["index"] for d in body["data"]] == [0, 1, 2] and body["model"] == "sent"
                for d, ranked in zip(body["data"], expected):
                    assert d["label"] == ranked[0]["label"] and d["num_classes"] == 3
                    scores = {r["label"]: r["score"] for r in ranked}
                    np.testing.assert_allclose(d["probs"], [scores[k] for k in ("negative", "neutral", "positive")],
                                               rtol=1e-5, atol=1e-6)
                    assert sum(d["probs"]) == pytest.approx(1.0, abs=1e-5)  # softmax over three labels
            one = c.post("/classify", json={"model": "sent", "input": texts[0]}).json()["data"]
            assert len(one) == 1 and one[0]["label"] == expected[0][0]["label"]
            error_of(c.post("/classify", json={"model": "sent", "input": []}), 400,
                     "input must be a non-empty string or a list of them, got []", "input")
            error_of(c.post("/classify", json={"model": "sent", "input": ["a", 3]}), 400,
                     "input must be a non-empty string or a list of them", "input")
            error_of(c.post("/classify", json={"model": "sent", "input": ["a"] * 2049}), 400,
                     "input holds 2049 items; at most 2048 per request", "input")
            error_of(c.post("/v1/rerank", json={"model": "sent", "query": "q", "documents": ["a"]}), 400,
                     "'sent' is an Encoder without a one-label sequence-classification head (use /v1/embeddings and "
                     "/classify)", "model", "wrong_model_kind")
    finally:
        app.state.close()
    # a cross-encoder classifies too: its one label, sigmoid
    app = serve.create_app(ce, model_name="ce")
    try:
        with TestClient(app) as c:
            body = c.post("/classify", json={"model": "ce", "input": ["t5 t9"]}).json()
            assert body["data"][0]["probs"] == [pytest.approx(ce.classify(["t5 t9"])[0][0]["score"], rel=1e-5)]
    finally:
        app.state.close()
    error_of(client.post("/classify", json={"model": "tiny-gpt", "input": "a"}), 400,
             "/classify needs a sequence classifier (a ...ForSequenceClassification checkpoint); 'tiny-gpt' is a "
             "Generator (use /v1/completions and /v1/chat/completions)", "model", "wrong_model_kind")
    results, text = sent_while_busy(serve.create_app(sentiment, model_name="sent", max_batch=64), "/classify",
                                    [{"model": "sent", "input": [t] * (i + 1)} for i, t in enumerate(texts)])
    assert metric(text, "cpuformer_batch_size_count") == 1 and metric(text, "cpuformer_batch_size_sum") == 6
    assert [[d["label"] for d in r["data"]] for r in results] == [[e[0]["label"]] * (i + 1)
                                                                  for i, e in enumerate(expected)]


@pytest.fixture(scope="module")
def ce(enc_dir, tmp_path_factory):
    """A tiny random cross-encoder (BertForSequenceClassification, one label)."""
    with cf.load(_classifier(enc_dir, tmp_path_factory.mktemp("serve") / "tiny-ce", ["LABEL_0"])) as loaded:
        yield loaded


DOCUMENTS = ["t7 t8 t9", "t1", "t20 t21 t22 t23 t24", "t5 t6", "t11 t3 t3 t9", "t40 t41"]


def test_rerank_is_score_sorted(ce):
    """/v1/rerank (and /rerank, /v2/rerank) answer Cohere's and Jina's shape: the documents by
    Encoder.score of (query, document), highest first; top_n, return_documents, {"text"} items."""
    expected = ce.score([("t5 t9", d) for d in DOCUMENTS])
    assert np.ptp(expected) > 1e-3  # spread: the order means something
    order = [int(i) for i in np.argsort(-expected, kind="stable")]
    app = serve.create_app(ce, model_name="ce")
    try:
        with TestClient(app) as c:
            for path in ("/v1/rerank", "/rerank", "/v2/rerank"):
                body = c.post(path, json={"model": "ce", "query": "t5 t9", "documents": DOCUMENTS}).json()
                assert [r["index"] for r in body["results"]] == order
                np.testing.assert_allclose([r["relevance_score"] for r in body["results"]], expected[order],
                                           rtol=1e-5, atol=1e-6)
                assert [r["document"]["text"] for r in body["results"]] == [DOCUMENTS[i] for i in order]
                assert body["model"] == "ce" and body["id"].startswith("rerank-")
                tokens = sum(len(ids) for ids in ce.tokenizer.encode_batch([("t5 t9", d) for d in DOCUMENTS]))
                assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
            body = c.post("/v1/rerank", json={"model": "ce", "query": "t5 t9", "top_n": 2, "return_documents": False,
                                              "documents": [{"text": d} for d in DOCUMENTS]}).json()
            assert body["results"] == [{"index": i, "relevance_score": pytest.approx(float(expected[i]), rel=1e-5,
                                                                                      abs=1e-6)} for i in order[:2]]
            assert len(c.post("/v1/rerank", json={"model": "ce", "query": "q", "documents": ["a"],
                                                   "top_n": 50}).json()["results"]) == 1
            # a cross-encoder still embeds (its base model's pooled states)
            assert c.post("/v1/embeddings", json={"model": "ce", "input": "t5"}).status_code == 200
            error_of(c.post("/v1/completions", json={"model": "ce", "prompt": "a"}), 400,
                     "(use /v1/embeddings, /v1/rerank and /classify)", "model", "wrong_model_kind")
            rerank = dict(model="ce", query="q", documents=["a"])
            error_of(c.post("/v1/rerank", json=dict(rerank, query="")), 400, "query must be a non-empty string, got ''",
                     "query")
            error_of(c.post("/v1/rerank", json=dict(rerank, query=["q"])), 400, "query must be a non-empty string",
                     "query")
            error_of(c.post("/v1/rerank", json=dict(rerank, documents=[])), 400,
                     "documents must be a non-empty list of strings", "documents")
            error_of(c.post("/v1/rerank", json=dict(rerank, documents="a")), 400,
                     "documents must be a non-empty list of strings", "documents")
            error_of(c.post("/v1/rerank", json=dict(rerank, documents=["a", 5])), 400,
                     "documents[1] must be a non-empty string or an object with a non-empty 'text', got 5", "documents")
            error_of(c.post("/v1/rerank", json=dict(rerank, documents=[{"txt": "a"}])), 400,
                     "documents[0] must be a non-empty string or an object", "documents")
            error_of(c.post("/v1/rerank", json=dict(rerank, documents=["a"] * 2049)), 400,
                     "documents holds 2049 items; at most 2048 per request", "documents")
            error_of(c.post("/v1/rerank", json=dict(rerank, top_n=0)), 400, "top_n must be >= 1, got 0", "top_n")
            error_of(c.post("/v1/rerank", json=dict(rerank, top_n="2")), 400, "top_n must be an integer, got '2'",
                     "top_n")
            error_of(c.post("/v1/rerank", json=dict(rerank, return_documents="no")), 400,
                     "return_documents must be true or false, got 'no'", "return_documents")
            error_of(c.post("/v1/rerank", json=dict(rerank, model="other")), 404, "the model 'other' does not exist",
                     "model", "model_not_found")
            metrics = c.get("/metrics").text
            assert 'cpuformer_requests_total{endpoint="/v1/rerank",status="200"}' in metrics
    finally:
        app.state.close()


def test_random_rerank_bodies_get_an_answer_or_an_error(ce):
    rng = np.random.default_rng(1)
    fields = ["model", "query", "documents", "top_n", "return_documents", "user"]
    app = serve.create_app(ce, model_name="ce")
    try:
        with TestClient(app) as c:
            for _ in range(150):
                body = {"model": "ce", "query": "t5", "documents": ["t1 t2", "t3"]}
                for _ in range(int(rng.integers(1, 3))):
                    body[fields[int(rng.integers(len(fields)))]] = _wild(rng)
                raw = json.dumps(body if rng.random() < 0.95 else _wild(rng), allow_nan=True).encode()
                response = c.post("/v1/rerank", content=raw, headers={"content-type": "application/json"})
                assert response.status_code in (200, 400, 404), (raw[:300], response.text[:300])
                if response.status_code != 200:
                    message = response.json()["error"]["message"]
                    assert not any(p in message for p in _PYTHON_ERRORS), (raw[:300], message)
                else:
                    assert isinstance(response.json()["results"], list)
            assert c.get("/health").status_code == 200
    finally:
        app.state.close()


def test_rerank_needs_a_cross_encoder(client, enc_client):
    body = dict(model="tiny-gpt", query="q", documents=["a"])
    error_of(client.post("/v1/rerank", json=body), 400, "/v1/rerank needs a cross-encoder (a "
             "...ForSequenceClassification checkpoint with one label); 'tiny-gpt' is a Generator (use /v1/completions "
             "and /v1/chat/completions)", "model", "wrong_model_kind")
    error_of(enc_client.post("/rerank", json=dict(body, model="bert")), 400, "'bert' is an Encoder without a one-label "
             "sequence-classification head (use /v1/embeddings)", "model", "wrong_model_kind")


def test_concurrent_reranks_are_batched(ce):
    """Rerank requests that wait while the worker is busy go into one score call; each gets its
    own documents' scores."""
    queries = [f"t{i} t{i + 3}" for i in range(8)]
    results, text = sent_while_busy(serve.create_app(ce, model_name="ce", max_batch=64), "/v1/rerank",
                                    [{"model": "ce", "query": q, "documents": DOCUMENTS[:i % 4 + 2]}
                                     for i, q in enumerate(queries)])
    assert metric(text, "cpuformer_batch_size_count") == 1  # one score call for all eight requests
    assert metric(text, "cpuformer_batch_size_sum") == sum(i % 4 + 2 for i in range(len(queries)))
    for i, query in enumerate(queries):
        expected = ce.score([(query, d) for d in DOCUMENTS[:i % 4 + 2]])
        got = {r["index"]: r["relevance_score"] for r in results[i]["results"]}
        np.testing.assert_allclose([got[j] for j in range(len(expected))], expected, rtol=1e-5, atol=1e-6)


# A hermes-style template (as Qwen2.5's): the tools in the system turn, calls as <tool_call> blocks.
HERMES = (
    "{%- if tools %}<|im_start|>system\nYou may call these functions:\n<tools>\n"
    "{%- for t in tools %}{{ t | tojson }}\n{% endfor %}</tools>\n"
    "Answer a call as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n"
    "{%- for c in m.tool_calls %}<tool_call>{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{{ c.function.arguments | tojson }}}</tool_call>{% endfor %}<|im_end|>\n"
    "{%- elif m.role == 'tool' %}<|im_start|>user\n<tool_response>{{ m.content }}</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture(scope="module")
def tool_gen(gen_dir, tmp_path_factory):
    directory = tmp_path_factory.mktemp("serve") / "tiny-tools"
    shutil.copytree(gen_dir, directory)
    write_config(directory, HERMES)
    with cf.load(directory) as model:
        yield model


class Scripted:
    """An app's batcher whose requests produce a script's tokens (then end with EOS) instead of the
    random model's: what a trained model would write. The real batcher runs underneath (EOS
    disabled, so it does not end a request first)."""

    def __init__(self, batcher, tokens):
        self.batcher, self.tokens, self.at = batcher, tokens, {}

    def __getattr__(self, name):
        return getattr(self.batcher, name)

    def submit(self, ids, **options):
        request = self.batcher.submit(ids, **dict(options, eos_token_id=[]))
        self.at[request] = 0
        return request

    def step(self):
        out = []
        for event in self.batcher.step():
            i = self.at[event.request]
            self.at[event.request] = i + 1
            last = i == len(self.tokens) - 1
            if last:
                self.batcher.cancel(event.request)
            out.append(event._replace(token=self.tokens[i], finish_reason="eos" if last else None))
        return out


def scripted_app(model, reply, **options):
    app = serve.create_app(model, model_name="tiny-gpt", **options)
    engine = app.state.engine
    engine.batcher = Scripted(engine.batcher, model.tokenizer.encode(reply, add_special_tokens=False))
    return app


def test_tool_calls(tool_gen):
    """A reply in the template's call format comes back as OpenAI tool_calls (finish_reason
    "tool_calls"), streamed or not; text before the call is the content; a plain reply stays
    content; the conversation continues with the call and its result."""
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    chat = dict(model="tiny-gpt", messages=messages, tools=TOOLS, max_tokens=200, temperature=0)
    for reply, content in ((CALL, None), ("Let me see." + CALL, "Let me see.")):
        app = scripted_app(tool_gen, reply)
        with TestClient(app) as c:
            body = c.post("/v1/chat/completions", json=chat).json()
            (choice,) = body["choices"]
            assert choice["finish_reason"] == "tool_calls"
            message = choice["message"]
            assert message["content"] == content and message["role"] == "assistant"
            (call,) = message["tool_calls"]
            assert call["type"] == "function" and call["id"].startswith("call_")
            assert call["function"]["name"] == "get_weather"
            assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
            chunks = events(c.post("/v1/chat/completions", json=dict(chat, stream=True)).text)
            deltas = [ch["choices"][0]["delta"] for ch in chunks]
            streamed = "".join(d.get("content") or "" for d in deltas)
            assert streamed.strip() == (content or "")
            calls = [t for d in deltas for t in d.get("tool_calls", [])]
            got = [(t["index"], t["function"]["name"], json.loads(t["function"]["arguments"])) for t in calls]
            assert got == [(0, "get_weather", {"city": "Paris"})]
            assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
        app.state.close()
    app = scripted_app(tool_gen, "It is sunny.")
    with TestClient(app) as c:
        body = c.post("/v1/chat/completions", json=chat).json()
        assert body["choices"][0]["message"] == {"role": "assistant", "content": "It is sunny."}
        assert body["choices"][0]["finish_reason"] == "stop"
        chunks = events(c.post("/v1/chat/completions", json=dict(chat, stream=True)).text)
        assert "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks) == "It is sunny."
    app.state.close()
    # two calls; parallel_tool_calls: false keeps the first
    app = scripted_app(tool_gen, CALL + CALL.replace("Paris", "Rome"))
    with TestClient(app) as c:
        calls = c.post("/v1/chat/completions", json=chat).json()["choices"][0]["message"]["tool_calls"]
        assert [json.loads(t["function"]["arguments"])["city"] for t in calls] == ["Paris", "Rome"]
        calls = c.post("/v1/chat/completions", json=dict(chat, parallel_tool_calls=False)).json()
        assert len(calls["choices"][0]["message"]["tool_calls"]) == 1
    app.state.close()


def test_tool_conversation_renders_as_transformers(tool_gen):
    """The prompt with tools, an assistant turn's calls (arguments as JSON text, content null) and
    a tool result is transformers' apply_chat_template of the same conversation (arguments as
    objects, as its templates read them)."""
    transformers = pytest.importorskip("transformers")
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]
    app = serve.create_app(tool_gen, model_name="tiny-gpt")
    try:
        server = app.state.server
        ids = server.chat_prompt({"messages": json.loads(json.dumps(messages))}, TOOLS)
        hf = transformers.AutoTokenizer.from_pretrained(str(tool_gen._model_dir.path))
        objects = json.loads(json.dumps(messages))
        objects[1]["tool_calls"][0]["function"]["arguments"] = {"city": "Paris"}
        text = hf.apply_chat_template(objects, tools=TOOLS, add_generation_prompt=True, tokenize=False)
        assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>' in text
        assert tool_gen.tokenizer.decode(ids, skip_special_tokens=False) == text
        with TestClient(app) as c:
            body = c.post("/v1/chat/completions", json=dict(model="tiny-gpt", messages=messages, tools=TOOLS,
                                                             max_tokens=3, temperature=0))
            assert body.status_code == 200
            assert body.json()["usage"]["prompt_tokens"] == len(ids)
    finally:
        app.state.close()


def test_tool_errors(tool_gen, client):
    chat = dict(model="tiny-gpt", messages=[{"role": "user", "content": "a"}], max_tokens=2, tools=TOOLS)
    app = serve.create_app(tool_gen, model_name="tiny-gpt")
    try:
        with TestClient(app) as c:
            for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
                error_of(c.post("/v1/chat/completions", json=dict(chat, tool_choice=choice)), 400,
                         "is not supported (it needs decoding constrained to a call", "tool_choice",
                         "unsupported_parameter")
            error_of(c.post("/v1/chat/completions", json=dict(chat, tool_choice="maybe")), 400,
                     "tool_choice must be 'auto', 'none', 'required' or {\"type\": \"function\", ...}, got 'maybe'",
                     "tool_choice")
            error_of(c.post("/v1/chat/completions", json=dict(chat, tools=[])), 400, "tools must be a non-empty list",
                     "tools")
            error_of(c.post("/v1/chat/completions", json=dict(chat, tools=[{"type": "code"}])), 400,
                     'tools[0] must be {"type": "function", "function": {...}}', "tools")
            error_of(c.post("/v1/chat/completions", json=dict(chat, tools=[{"type": "function", "function": {}}])),
                     400, "tools[0].function.name must be a non-empty string", "tools")
            error_of(c.post("/v1/chat/completions", json=dict(chat, tools=[
                {"type": "function", "function": {"name": "f", "parameters": [1]}}])), 400,
                "tools[0].function.parameters must be a JSON-schema object", "tools")
            error_of(c.post("/v1/chat/completions", json=dict(chat, parallel_tool_calls="yes")), 400,
                     "parallel_tool_calls must be true or false, got 'yes'", "parallel_tool_calls")
            error_of(c.post("/v1/chat/completions", json=dict(chat, tools=None, tool_choice="required")), 400,
                     "tool_choice needs tools", "tool_choice")
            error_of(c.post("/v1/chat/completions", json=dict(chat, stream=True, logprobs=True)), 400,
                     "logprobs with tools are not supported with stream: true", "logprobs")
            bad_call = [{"role": "assistant", "content": None, "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]}]
            error_of(c.post("/v1/chat/completions", json=dict(chat, messages=bad_call)), 400,
                     "messages[0]: a tool call's function.arguments must be JSON text, got '{not json'", "messages")
            for calls in (5, [5], [{"function": {"arguments": "{}"}}], [{"function": {"name": "f", "arguments": 5}}]):
                bad_calls = [{"role": "user", "content": "a"}, {"role": "assistant", "content": None,
                                                                 "tool_calls": calls}]
                error_of(c.post("/v1/chat/completions", json=dict(chat, messages=bad_calls)), 400,
                         'messages[1].tool_calls must be a list of {"type": "function", "function": {"name", '
                         '"arguments"}} objects', "messages")
            # tool_choice "none": the tools stay out of the prompt, the reply is content
            assert c.post("/v1/chat/completions", json=dict(chat, tool_choice="none")).status_code == 200
            error_of(c.post("/v1/chat/completions", json=dict(chat, response_format={"type": "json_object"})), 400,
                     "response_format {'type': 'json_object'} is not supported by cpuformer serve", "response_format",
                     "unsupported_parameter")
            assert c.post("/v1/chat/completions", json=dict(chat, response_format={"type": "text"})).status_code == 200
            error_of(c.post("/v1/completions", json=dict(model="tiny-gpt", prompt="a", tools=TOOLS)), 400,
                     "tools is not supported by cpuformer serve", "tools", "unsupported_parameter")
    finally:
        app.state.close()
    app = serve.create_app(tool_gen, model_name="tiny-gpt", tool_call_parser="none")
    try:
        with TestClient(app) as c:
            error_of(c.post("/v1/chat/completions", json=chat), 400,
                     "tools are turned off on this server (--tool-call-parser none)", "tools", "unsupported_parameter")
    finally:
        app.state.close()
    # a template without a call format (ChatML): refused, unless the server is told the format
    error_of(client.post("/v1/chat/completions", json=chat), 400, "tools need a chat template that asks for tool "
             "calls in a format cpuformer serve reads (hermes, llama3_json, mistral); this model's does not name one; "
             "start the server with --tool-call-parser FORMAT", "tools", "unsupported_parameter")
    with pytest.raises(ValueError, match="tool_call_parser must be 'auto', 'none' or one of hermes, llama3_json, "
                                         "mistral, got 'xml'"):
        serve.create_app(tool_gen, tool_call_parser="xml")


def test_random_tool_bodies_get_an_answer_or_an_error(tool_gen):
    """Chats with tools, malformed tool calls in the history and random tool fields: a 200 or a
    400 with cpuformer's message (never a 500, never Python's own error text)."""
    rng = np.random.default_rng(2)
    fields = ["tools", "tool_choice", "parallel_tool_calls", "stream", "response_format"]
    app = serve.create_app(tool_gen, model_name="tiny-gpt")
    try:
        with TestClient(app) as c:
            for _ in range(200):
                body = {"model": "tiny-gpt", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS,
                        "max_tokens": 3}
                r = rng.random()
                if r < 0.3:
                    body["messages"] += [{"role": "assistant", "content": _wild(rng), "tool_calls": _wild(rng)},
                                         {"role": "tool", "content": _wild(rng), "tool_call_id": _wild(rng)}]
                elif r < 0.5:
                    body["messages"].append({"role": "assistant", "content": None, "tool_calls": [
                        {"id": "a", "type": "function", "function": {"name": _wild(rng), "arguments": _wild(rng)}}]})
                for _ in range(int(rng.integers(0, 3))):
                    body[fields[int(rng.integers(len(fields)))]] = _wild(rng)
                if rng.random() < 0.3:
                    body["tools"] = [{"type": "function", "function": _wild(rng)}]
                raw = json.dumps(body, allow_nan=True).encode()
                response = c.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
                assert response.status_code in (200, 400), (raw[:300], response.text[:300])
                if response.status_code == 400:
                    message = response.json()["error"]["message"]
                    assert not any(p in message for p in _PYTHON_ERRORS + ["has no attribute"]), (raw[:300], message)
    finally:
        app.state.close()


def test_a_forced_tool_format_and_the_openai_client(gen, live):
    app = scripted_app(gen, CALL, tool_call_parser="hermes")  # the ChatML model, told the format
    try:
        with Running(app) as running:
            client = openai.OpenAI(base_url=running.url + "/v1", api_key="none", max_retries=0)
            reply = client.chat.completions.create(model="tiny-gpt", messages=[{"role": "user", "content": "a"}],
                                                   tools=TOOLS, max_tokens=200)
            (call,) = reply.choices[0].message.tool_calls
            assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
            assert reply.choices[0].finish_reason == "tool_calls"
    finally:
        app.state.close()


def test_a_failing_input_does_not_fail_its_batch():
    """When a batched embed call fails, each request is embedded alone: only the bad one fails."""
    calls = []

    class Model:
        def embed(self, inputs, batch_size):
            calls.append(list(inputs))
            if "bad" in inputs:
                raise ValueError("a bad input")
            return np.array([[len(x)] for x in inputs], dtype=np.float32)

    engine = serve.Engine(Model(), max_batch=8, max_queue=8)
    release = threading.Event()
    try:
        engine.submit(serve._Job("run", lambda: release.wait(30)))  # holds the worker
        jobs = [serve._Job("embed", inputs=x) for x in (["a", "bb"], ["bad"], ["cccc"])]
        engine.submit(*jobs)
        release.set()
        for job in jobs:
            assert job.done.wait(10)
    finally:
        release.set()
        engine.close()
    assert calls == [["a", "bb", "bad", "cccc"], ["a", "bb"], ["bad"], ["cccc"]]
    assert jobs[0].result.tolist() == [[1], [2]] and jobs[2].result.tolist() == [[4]]
    assert isinstance(jobs[1].error, ValueError) and jobs[1].result is None


# ---- concurrency, cancellation, uvicorn and the openai client ---------------------------------------


def test_concurrent_completions_equal_one_at_a_time(live, gen):
    """32 clients at once, streaming or not, greedy or seeded sampling, prompts and lengths of
    every size: each answer is the one generate() gives that request alone, and the sequences
    shared the batcher's forward passes."""
    prompts = [f"{PROMPTS[i % 12]} {'and then ' * (i % 5)}{i}" for i in range(32)]
    sampling = [dict(temperature=0.8, top_p=0.9, seed=100 + i) if i % 4 == 3 else dict(temperature=0)
                for i in range(32)]
    lengths = [4 + (7 * i) % 29 for i in range(32)]
    expected = {}
    for i, p in enumerate(prompts):
        options = dict(do_sample=True, temperature=0.8, top_p=0.9, seed=100 + i) if i % 4 == 3 else {}
        expected[i] = gen.generate(p, max_new_tokens=lengths[i], **options)
    before = httpx.get(live.url + "/metrics").text
    results = {}

    def send(i):
        body = dict(model="tiny-gpt", prompt=prompts[i], max_tokens=lengths[i], **sampling[i])
        with httpx.Client(base_url=live.url, timeout=120) as h:
            if i % 2:
                with h.stream("POST", "/v1/completions", json=dict(body, stream=True)) as r:
                    chunks = events(r.read().decode())
                results[i] = "".join(c["choices"][0]["text"] for c in chunks)
            else:
                results[i] = h.post("/v1/completions", json=body).json()["choices"][0]["text"]

    threads = [threading.Thread(target=send, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == expected
    after = httpx.get(live.url + "/metrics").text
    steps = metric(after, "cpuformer_batch_size_count") - metric(before, "cpuformer_batch_size_count")
    sequences = metric(after, "cpuformer_batch_size_sum") - metric(before, "cpuformer_batch_size_sum")
    assert sequences > steps  # several sequences per forward pass


@pytest.fixture
def slow_steps(live, monkeypatch):
    """Each batch step of the live server's engine waits 2 ms first, so that a generation of
    CONTEXT - 10 tokens lasts seconds on any machine: the disconnect tests need it still running when
    the client goes away (on a fast CPU the tiny model generated them within the 0.2 s timeout)."""
    engine = live.app.state.engine
    step = engine._generation_step

    def slowed(jobs):
        time.sleep(0.002)
        return step(jobs)

    monkeypatch.setattr(engine, "_generation_step", slowed)


def test_disconnect_cancels_the_generation(live, slow_steps):
    before = metric(httpx.get(live.url + "/metrics").text, "cpuformer_generated_tokens_total")
    with httpx.Client(base_url=live.url, timeout=60) as h:
        with h.stream("POST", "/v1/completions", json=dict(model="tiny-gpt", prompt="Hello", temperature=0,
                                                           max_tokens=CONTEXT - 10, stream=True)) as r:
            first = next(r.iter_lines())
            assert first.startswith("data: ")
        # leaving the block closes the connection mid-stream
    deadline = time.time() + 30
    while True:
        text = httpx.get(live.url + "/metrics").text
        if metric(text, "cpuformer_cancelled_total") >= 1:
            break
        assert time.time() < deadline, "the generation was not cancelled"
        time.sleep(0.05)
    time.sleep(0.2)
    generated = metric(httpx.get(live.url + "/metrics").text, "cpuformer_generated_tokens_total") - before
    assert generated < CONTEXT - 10
    assert httpx.post(live.url + "/v1/completions", json=dict(model="tiny-gpt", prompt="a", max_tokens=3)) \
        .status_code == 200


def test_disconnect_cancels_a_non_streaming_request(live, slow_steps):
    before = metric(httpx.get(live.url + "/metrics").text, "cpuformer_cancelled_total")
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the connection
        httpx.post(live.url + "/v1/completions", json=dict(model="tiny-gpt", prompt="Hello", temperature=0,
                                                            max_tokens=CONTEXT - 10), timeout=0.2)
    deadline = time.time() + 30
    while metric(httpx.get(live.url + "/metrics").text, "cpuformer_cancelled_total") <= before:
        assert time.time() < deadline, "the generation was not cancelled"
        time.sleep(0.05)
    assert httpx.post(live.url + "/v1/completions", json=dict(model="tiny-gpt", prompt="a", max_tokens=3)) \
        .status_code == 200


def test_many_connections_at_once(gen):
    """300 clients at once against a queue of 4 and a busy worker: 4 are answered 200 once the
    worker is free, the others 429 at once; the server keeps serving."""
    app = serve.create_app(gen, max_queue=4)
    release = threading.Event()
    try:
        with Running(app) as running:
            app.state.engine.submit(_blocking_stream(release))

            async def flood():
                limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
                async with httpx.AsyncClient(base_url=running.url, timeout=60, limits=limits) as h:
                    async def one(i):
                        return await h.post("/v1/completions", json=dict(model="tiny-gpt", prompt=PROMPTS[i % 12],
                                                                         max_tokens=3, temperature=0))

                    tasks = [asyncio.ensure_future(one(i)) for i in range(300)]
                    while sum(t.done() for t in tasks) < 296:
                        await asyncio.sleep(0.05)
                    assert httpx.get(running.url + "/health").status_code == 200
                    release.set()
                    return await asyncio.gather(*tasks)

            responses = asyncio.run(flood())
            statuses = [r.status_code for r in responses]
            assert statuses.count(200) == 4 and statuses.count(429) == 296, statuses
            for r in responses:
                if r.status_code == 429:
                    error_of(r, 429, "the server is busy", code="queue_full")
            assert httpx.post(running.url + "/v1/completions", json=dict(model="tiny-gpt", prompt="a",
                                                                         max_tokens=2)).status_code == 200
    finally:
        release.set()


def test_openai_client(live, enc_live, gen, enc):
    client = openai.OpenAI(base_url=live.url + "/v1", api_key="none", max_retries=0)
    assert [m.id for m in client.models.list()] == ["tiny-gpt"]
    completion = client.completions.create(model="tiny-gpt", prompt="The cat sat", max_tokens=10, temperature=0)
    assert completion.choices[0].text == gen.generate("The cat sat", max_new_tokens=10)
    assert completion.usage.completion_tokens == 10
    messages = [{"role": "user", "content": "Hello there"}]
    chat = client.chat.completions.create(model="tiny-gpt", messages=messages, max_tokens=10, temperature=0)
    assert chat.choices[0].message.content == gen.chat(messages, max_new_tokens=10)
    assert chat.choices[0].finish_reason in ("stop", "length")
    pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="tiny-gpt", messages=messages, max_tokens=10, temperature=0, stream=True) if c.choices]
    assert "".join(pieces) == chat.choices[0].message.content
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="tiny-gpt", prompt="The cat sat", max_tokens=10, temperature=0, stream=True))
    assert streamed == completion.choices[0].text
    scored = client.completions.create(model="tiny-gpt", prompt="The cat sat", max_tokens=10, temperature=0,
                                       logprobs=2, echo=True)
    assert scored.choices[0].text.endswith(completion.choices[0].text)
    assert scored.choices[0].logprobs.token_logprobs[0] is None and len(scored.choices[0].logprobs.tokens) > 10
    scored = client.chat.completions.create(model="tiny-gpt", messages=messages, max_tokens=10, temperature=0,
                                            logprobs=True, top_logprobs=3)
    assert len(scored.choices[0].logprobs.content) == chat.usage.completion_tokens
    assert all(len(t.top_logprobs) == 3 and t.logprob <= 0 for t in scored.choices[0].logprobs.content)
    penalised = client.completions.create(model="tiny-gpt", prompt="The cat sat", max_tokens=10, temperature=0,
                                          presence_penalty=1.0, frequency_penalty=0.5, logit_bias={"7": 3})
    assert penalised.choices[0].text == gen.generate("The cat sat", max_new_tokens=10, presence_penalty=1.0,
                                                     frequency_penalty=0.5, logit_bias={7: 3})
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="gpt-4", prompt="a", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="max_tokens must be at least 1"):  # 0 without echo
        client.completions.create(model="tiny-gpt", prompt="a", max_tokens=0)

    embedder = openai.OpenAI(base_url=enc_live.url + "/v1", api_key="none", max_retries=0)
    texts = ["t5 t6 t7", "t9 t10"]
    result = embedder.embeddings.create(model="bert", input=texts)  # the client asks for base64
    np.testing.assert_allclose([d.embedding for d in result.data], enc.embed(texts), atol=1e-5)
    result = embedder.embeddings.create(model="bert", input="t5", encoding_format="float")
    np.testing.assert_allclose(result.data[0].embedding, enc.embed(["t5"])[0], atol=1e-6)


# ---- the command line -----------------------------------------------------------------------------


def test_cli_serve_end_to_end(gen_dir):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    environment = dict(os.environ)
    environment["PYTHONPATH"] = PACKAGE_PARENT + os.pathsep + environment.get("PYTHONPATH", "")
    process = subprocess.Popen([sys.executable, "-m", "cpuformer", "serve", str(gen_dir), "--port", str(port),
                                "--model-name", "m", "--threads", "1", "--log-level", "warning"],
                               env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while True:
            assert process.poll() is None, process.communicate()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.time() < deadline, "the server did not start"
            time.sleep(0.1)
        body = httpx.post(f"http://127.0.0.1:{port}/v1/completions",
                          json=dict(model="m", prompt="Hello there", max_tokens=6, temperature=0)).json()
        with cf.load(gen_dir) as model:
            assert body["choices"][0]["text"] == model.generate("Hello there", max_new_tokens=6)
    finally:
        process.terminate()
        _, err = process.communicate(timeout=30)
    # 32 slots × 4096 positions × 2 layers × (keys + values) × 32 wide × 4 bytes
    assert "cpuformer serve: 32 sequences × 4096 positions; KV cache float32, 64 MiB" in err, err


def test_cli_serve_errors(gen_dir, tmp_path, monkeypatch, capsys):
    vision = tmp_path / "vit"
    vision.mkdir()
    (vision / "config.json").write_text(json.dumps({"architectures": ["ViTForImageClassification"],
                                                    "model_type": "vit"}))
    save_safetensors(str(vision / "model.safetensors"), {"w": np.zeros(1, np.float32)})
    assert_user_error(run_cli("serve", str(vision)), "serve", "holds", "`cpuformer serve` serves decoders")
    assert_user_error(run_cli("serve", str(tmp_path / "missing")), "serve", "does not exist")
    out = run_cli("serve", "--help")
    assert out.returncode == 0 and "--max-queue" in out.stdout and "cpuformer[serve]" in out.stdout
    for bad in ("0.5", "-1", "inf", "x"):
        expected = "expected a number" if bad == "x" else "expected a finite number" if bad == "inf" else \
            "expected 0 (off) or a number >= 1"
        assert_user_error(run_cli("serve", gen_dir, "--prefill-slowdown", bad), "serve",
                          f"argument --prefill-slowdown: {expected}, got '{bad}'")
    real_import = builtins.__import__

    def no_fastapi(name, *args, **kwargs):
        if name.split(".")[0] == "fastapi":
            raise ImportError("No module named 'fastapi'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_fastapi)
    assert cli.main(["serve", str(gen_dir)]) == 2
    err = capsys.readouterr().err
    assert 'cpuformer serve: error: cpuformer serve needs FastAPI and uvicorn: pip install "cpuformer[serve]"' in err
    with pytest.raises(ImportError, match=r'pip install "cpuformer\[serve\]"'):
        serve.create_app(None)
