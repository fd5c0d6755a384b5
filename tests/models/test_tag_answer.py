"""``tag`` and ``answer`` against transformers on the same random-weight checkpoint and tokenizer
(a tiny BERT with the all-MiniLM-L6-v2 WordPiece tokenizer).

``tag`` is compared with transformers' token-classification pipeline. transformers 5 no longer has
the question-answering pipeline, so ``answer`` is compared with the 4.x pipeline's steps run here
(``_reference_answers``): transformers' fast tokenizer with the same arguments, the PyTorch model,
and transformers' own ``select_starts_ends`` (kept in its document-question-answering pipeline)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import cpuformer as cf

from .test_heads import _WORDPIECE_BERT, _save, _with_tokenizer, minilm_dir  # noqa: F401 (a fixture)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

NER_LABELS = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC", 5: "MISC"}
TEXTS = ["My name is Wolfgang Amadeus and I live in Berlin, Germany.",
         "Unbelievably, the xyzzyq café near Zürich serves pre-war recipes!",
         "Okay."]
LONG_TEXT = ("Ada Lovelace met Charles Babbage in London in 1833, and their friendship lasted for many years "
             "while the Analytical Engine was designed, discussed, and never quite finished by anyone. ") * 2


def _limit_tokenizer(directory, length):
    """Sets tokenizer_config.json's model_max_length (what the pipelines read as the window)."""
    path = directory / "tokenizer_config.json"
    settings = json.loads(path.read_text())
    settings["model_max_length"] = length
    path.write_text(json.dumps(settings))


@pytest.fixture
def tagger(tmp_path, minilm_dir):  # noqa: F811 (the fixture imported above)
    _save(tmp_path, "BertForTokenClassification", "BertConfig", **_WORDPIECE_BERT, id2label=NER_LABELS)
    _with_tokenizer(tmp_path, minilm_dir)
    _limit_tokenizer(tmp_path, _WORDPIECE_BERT["max_position_embeddings"])
    return tmp_path


def _assert_same_entities(ours, expected):
    assert len(ours) == len(expected), (ours, expected)
    for a, b in zip(ours, expected):
        assert set(a) == set(b), (a, b)
        for key in a:
            if key == "score":
                assert abs(a["score"] - float(b["score"])) <= 1e-4, (a, b)
            else:
                assert a[key] == b[key], (key, a, b)


@pytest.mark.parametrize("strategy", ["none", "simple", "first", "average", "max"])
def test_tag_matches_the_pipeline(tagger, strategy):
    pipe = transformers.pipeline("token-classification", model=str(tagger), device="cpu",
                                 aggregation_strategy=strategy)
    m = cf.load(tagger)
    texts = TEXTS + [LONG_TEXT]  # the long text is truncated to max_tokens by both
    for ignore in (None, []):
        kwargs = {} if ignore is None else {"ignore_labels": ignore}
        expected = pipe(texts, **kwargs)
        ours = m.tag(texts, aggregation_strategy=strategy, batch_size=2, **kwargs)
        assert len(ours) == len(texts)
        for a, b in zip(ours, expected):
            _assert_same_entities(a, b)
    everything = m.tag(TEXTS[1], aggregation_strategy=strategy, ignore_labels=[])
    assert everything, "the test text gives no entities: it tests nothing"
    for entity in everything:  # offsets point into the text
        assert 0 <= entity["start"] < entity["end"] <= len(TEXTS[1])
    _assert_same_entities(everything, pipe(TEXTS[1], ignore_labels=[]))


@pytest.mark.parametrize("strategy", ["simple", "first", "max"])
def test_tag_long_text_with_stride_matches_the_pipeline(tagger, strategy):
    pipe = transformers.pipeline("token-classification", model=str(tagger), device="cpu",
                                 aggregation_strategy=strategy, stride=16)
    m = cf.load(tagger)
    text = LONG_TEXT * 2
    assert len(m._get_tokenizer().encode(text).ids) == m.max_tokens  # it is truncated without a stride
    for ignore in (None, []):
        kwargs = {} if ignore is None else {"ignore_labels": ignore}
        ours = m.tag(text, aggregation_strategy=strategy, stride=16, **kwargs)
        _assert_same_entities(ours, pipe(text, **kwargs))
    assert max(e["end"] for e in m.tag(text, aggregation_strategy=strategy, stride=16, ignore_labels=[])) > \
        max(e["end"] for e in m.tag(text, aggregation_strategy=strategy, ignore_labels=[]))


def test_tag_bad_input(tagger):
    m = cf.load(tagger)
    with pytest.raises(ValueError, match=r"^aggregation_strategy must be one of 'none', 'simple', 'first', 'average', "
                                         r"'max', got 'longest'$"):
        m.tag("x", aggregation_strategy="longest")
    with pytest.raises(ValueError, match=r"^tag\(\) needs at least one text, got an empty list$"):
        m.tag([])
    with pytest.raises(TypeError, match=r"^tag\(\) takes strings; inputs\[1\] is int 5$"):
        m.tag(["a", 5])
    with pytest.raises(TypeError, match=r"^tag\(\) takes a string or a list of strings, got bytes b'x'$"):
        m.tag(b"x")
    with pytest.raises(TypeError, match=r"^ignore_labels must be a list of strings, got str 'O'$"):
        m.tag("x", ignore_labels="O")
    with pytest.raises(ValueError, match=r'^tag\(\): stride needs an aggregation_strategy other than "none"'):
        m.tag("x", aggregation_strategy="none", stride=4)
    with pytest.raises(ValueError, match=r"^stride must be an integer from 0 to 61 \(max_tokens 64 less the special "
                                         r"tokens, less 1\), got 62$"):
        m.tag("x", stride=62)
    with pytest.raises(ValueError, match=r"^answer\(\) needs a question answering head; this "
                                         r"BertForTokenClassification model has a token classification head$"):
        m.answer("q", "c")
    assert m.tag("") == []


def test_tag_without_tokenizer(tmp_path):
    _save(tmp_path, "BertForTokenClassification", "BertConfig", **_WORDPIECE_BERT, id2label=NER_LABELS)
    with pytest.raises(ValueError, match=r"^tag\(\) needs the model directory's tokenizer.json, but .* has none$"):
        cf.load(tmp_path).tag("text")


# ---- answer --------------------------------------------------------------------------------------

def _reference_answers(directory, question, context, top_k=1, doc_stride=None, max_answer_len=15,
                       handle_impossible_answer=False):
    """transformers 4.x QuestionAnsweringPipeline (fast tokenizer, question first, align_to_words),
    step by step."""
    from transformers.pipelines.document_question_answering import select_starts_ends

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
    model = transformers.AutoModelForQuestionAnswering.from_pretrained(str(directory)).eval()
    max_seq_len = min(tokenizer.model_max_length, 384)
    doc_stride = min(max_seq_len // 2, 128) if doc_stride is None else doc_stride
    encoded = tokenizer(text=question, text_pair=context, padding="do_not_pad", truncation="only_second",
                        max_length=max_seq_len, stride=doc_stride, return_token_type_ids=True,
                        return_overflowing_tokens=True, return_offsets_mapping=True,
                        return_special_tokens_mask=True)
    min_null_score = 1000000
    answers = []
    for span in range(len(encoded["input_ids"])):
        ids = encoded["input_ids"][span]
        p_mask = [token != 1 for token in encoded.sequence_ids(span)]
        for cls_index in np.nonzero(np.array(ids) == tokenizer.cls_token_id)[0]:
            p_mask[cls_index] = 0
        with torch.inference_mode():
            out = model(input_ids=torch.tensor([ids]),
                        attention_mask=torch.tensor([encoded["attention_mask"][span]]),
                        token_type_ids=torch.tensor([encoded["token_type_ids"][span]]))
        starts, ends, scores, min_null_score = select_starts_ends(
            out.start_logits.numpy(), out.end_logits.numpy(), np.array([p_mask], dtype=np.int64),
            np.array([encoded["attention_mask"][span]]), min_null_score, top_k * 2 + 10, handle_impossible_answer,
            max_answer_len)
        enc = encoded[span]
        for s, e, score in zip(starts, ends, scores):
            try:
                start_index = enc.word_to_chars(enc.token_to_word(s), sequence_index=1)[0]
                end_index = enc.word_to_chars(enc.token_to_word(e), sequence_index=1)[1]
            except Exception:
                start_index, end_index = enc.offsets[s][0], enc.offsets[e][1]
            target = context[start_index:end_index]
            same = next((a for a in answers if a["answer"].lower() == target.lower()), None)
            if same:
                same["score"] += score.item()
            else:
                answers.append({"score": score.item(), "start": start_index, "end": end_index, "answer": target})
    if handle_impossible_answer:
        answers.append({"score": min_null_score, "start": 0, "end": 0, "answer": ""})
    return sorted(answers, key=lambda x: x["score"], reverse=True)[:top_k], len(encoded["input_ids"])


def _assert_same_answers(ours, expected):
    assert [(a["start"], a["end"], a["answer"]) for a in ours] == \
        [(b["start"], b["end"], b["answer"]) for b in expected]
    np.testing.assert_allclose([a["score"] for a in ours], [b["score"] for b in expected], rtol=1e-4, atol=1e-6)


@pytest.fixture
def reader(tmp_path, minilm_dir):  # noqa: F811 (the fixture imported above)
    _save(tmp_path, "BertForQuestionAnswering", "BertConfig", **_WORDPIECE_BERT)
    _with_tokenizer(tmp_path, minilm_dir)
    _limit_tokenizer(tmp_path, _WORDPIECE_BERT["max_position_embeddings"])
    return tmp_path


QUESTION = "Where did Ada meet Babbage?"
SHORT_CONTEXT = "Ada Lovelace met Charles Babbage in London in 1833."


@pytest.mark.parametrize("top_k, handle_impossible_answer, max_answer_len", [(1, False, 15), (5, False, 15),
                                                                             (3, True, 4), (1, True, 30)])
def test_answer_matches_the_pipeline(reader, top_k, handle_impossible_answer, max_answer_len):
    m = cf.load(reader)
    options = dict(top_k=top_k, handle_impossible_answer=handle_impossible_answer, max_answer_len=max_answer_len)
    for context in (SHORT_CONTEXT, LONG_TEXT):
        expected, windows = _reference_answers(reader, QUESTION, context, **options)
        ours = m.answer(QUESTION, context, **options)
        _assert_same_answers([ours] if top_k == 1 else ours, expected)
        for a in [ours] if top_k == 1 else ours:
            assert a["answer"] == context[a["start"]:a["end"]]
    assert windows > 1  # the long context was read in windows


def test_answer_long_context_small_stride_and_pairs(reader):
    m = cf.load(reader)
    context = LONG_TEXT * 3
    expected, windows = _reference_answers(reader, QUESTION, context, top_k=4, doc_stride=5)
    assert windows >= 4  # a context several times longer than the model's positions
    _assert_same_answers(m.answer(QUESTION, context, top_k=4, doc_stride=5), expected)
    pairs = [(QUESTION, context), ("Who finished it?", SHORT_CONTEXT), ("When?", LONG_TEXT)]
    ours = m.answer(pairs, top_k=2, doc_stride=5, batch_size=3)
    assert len(ours) == 3
    for (question, passage), got in zip(pairs, ours):
        _assert_same_answers(got, _reference_answers(reader, question, passage, top_k=2, doc_stride=5)[0])
    single = m.answer(pairs)
    assert all(isinstance(a, dict) for a in single)


def test_answer_bad_input(reader):
    m = cf.load(reader)
    long_question = " ".join(["why"] * 70)
    with pytest.raises(ValueError, match=r"^answer\(\): the question has 61 tokens, which leaves no room for the "
                                         r"context in a window of max_seq_len=64 tokens \(3 special tokens\); "
                                         r"shorten the question or lower max_question_len$"):
        m.answer(long_question, LONG_TEXT, max_question_len=61)
    with pytest.raises(ValueError, match=r"^answer\(\): doc_stride \(32\) must be smaller than the context tokens a "
                                         r"window holds \(21 = max_seq_len 64 - question 40 - 3 special tokens\); "
                                         r"lower doc_stride$"):
        m.answer(long_question, LONG_TEXT, max_question_len=40)  # the default doc_stride: 64 // 2
    assert m.answer(long_question, LONG_TEXT, max_question_len=40, doc_stride=8)["answer"]
    with pytest.raises(ValueError, match=r"^answer\(\): the question has 64 tokens, which leaves no room"):
        m.answer(long_question, SHORT_CONTEXT)  # cut to max_question_len=64 tokens: still the whole window
    assert m.answer(long_question, "Ada.", max_question_len=50)["answer"] in ("Ada", ".", "Ada.")  # one window
    with pytest.raises(ValueError, match=r"^answer\(\): the context is empty$"):
        m.answer("Who?", "")
    with pytest.raises(ValueError, match=r"^answer\(\): inputs\[1\]: the question is empty$"):
        m.answer([("Who?", "Ada."), ("  ", "Ada.")])
    with pytest.raises(TypeError, match=r"^answer\(\): the context must be a string, got int 3$"):
        m.answer("Who?", 3)
    with pytest.raises(TypeError, match=r"^answer\(\): inputs\[0\]: the question must be a string, got NoneType None$"):
        m.answer([(None, "Ada.")])
    with pytest.raises(TypeError, match=r"^answer\(\) takes \(question, context\) pairs; inputs\[0\] is str 'Who\?'$"):
        m.answer(["Who?"])
    with pytest.raises(TypeError, match=r"^answer\(\) takes a question and a context, or a list of \(question, "
                                        r"context\) pairs; got int 7$"):
        m.answer(7)
    with pytest.raises(ValueError, match=r"^answer\(\) needs at least one \(question, context\) pair, got an empty "
                                         r"list$"):
        m.answer([])
    with pytest.raises(ValueError, match=r"^max_answer_len must be an integer >= 1, got 0$"):
        m.answer("Who?", "Ada.", max_answer_len=0)
    with pytest.raises(ValueError, match=r"^max_seq_len must be an integer from 1 to max_tokens \(64\), got 65$"):
        m.answer("Who?", "Ada.", max_seq_len=65)
    with pytest.raises(ValueError, match=r"^doc_stride must be an integer >= 0, got -1$"):
        m.answer("Who?", "Ada.", doc_stride=-1)
    with pytest.raises(ValueError, match=r"^tag\(\) needs a token classification head; this "
                                         r"BertForQuestionAnswering model has a question answering head$"):
        m.tag("x")
