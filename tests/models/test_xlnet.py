"""XLNet (Transformer-XL relative attention) against transformers on the same random weights.

The configurations cover what the family declares: every feed-forward activation, clamped
relative distances, head counts of 3 and 5 with hidden sizes that are not multiples of 16, token
types (segment ids compared for equality, any integer), left- and right-padded batches (XLNet's
tokenizer pads on the left), and sequences long enough that the attention bias is built in query
blocks. Every position is compared, padded ones included: cpuformer applies transformers' mask
exactly (a padded query still attends to itself).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import cpuformer as cf  # noqa: E402

from ._hf import assert_close, cosine_rows, save_random_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# initializer_range 0.3 (transformers: 0.02) makes the position and segment terms large enough
# that a distance one off, or a segment compared wrongly, changes the outputs beyond the tolerance.
_BASE = dict(vocab_size=91, d_model=36, n_layer=2, n_head=3, d_inner=41, initializer_range=0.3, pad_token_id=5)

#: name -> config keyword arguments
CONFIGS = {
    "gelu": _BASE,
    # Five heads of 10; distances clamped to ±4, shorter than the sequences.
    "relu_clamped": dict(_BASE, d_model=50, n_head=5, ff_activation="relu", clamp_len=4),
    "gelu_new": dict(_BASE, ff_activation="gelu_new", n_layer=3),
    "silu": dict(_BASE, d_model=40, n_head=5, ff_activation="silu"),
}


def _build(directory, kwargs, model_class="XLNetModel", seed=0):
    model = save_random_model(directory, getattr(transformers, model_class), transformers.XLNetConfig(**kwargs), seed)
    return getattr(model, "transformer", model)


def _reference(hf, ids, mask=None, types=None, mems=None):
    with torch.no_grad():
        out = hf(input_ids=torch.tensor(ids), attention_mask=None if mask is None else torch.tensor(mask),
                 token_type_ids=None if types is None else torch.tensor(types),
                 mems=None if mems is None else [torch.tensor(m) for m in mems], use_mems=True)
    return out.last_hidden_state.numpy(), [m.numpy() for m in out.mems]


def _padded(rng, vocab, lengths, left):
    T = max(lengths)
    ids = rng.integers(0, vocab, size=(len(lengths), T))
    mask = np.zeros_like(ids)
    for b, n in enumerate(lengths):
        if left:
            mask[b, T - n:] = 1
        else:
            mask[b, :n] = 1
    ids[mask == 0] = 5
    return ids, mask


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_against_transformers(name, tmp_path):
    kwargs = CONFIGS[name]
    hf = _build(tmp_path, kwargs)
    model = cf.load(tmp_path)
    assert model.family == "xlnet"
    rng = np.random.default_rng(1)
    for left in (True, False):
        ids, mask = _padded(rng, kwargs["vocab_size"], [13, 6, 9], left)
        # XLNet's tokenizer gives 0 / 1 for the two texts and 2 for <cls>; any integers are segment ids.
        types = rng.integers(0, 3, size=ids.shape)
        types[1] = 7
        for t in (types, None):
            ours = model(ids, mask, t)
            assert_close(ours, _reference(hf, ids, mask, t)[0])
        # A padded batch gives each sequence what it gives alone (at its unpadded positions).
        alone = model(ids[1:2, mask[1] == 1])
        assert_close(ours[1, mask[1] == 1], alone[0], tolerance=1e-5)
    ids = rng.integers(0, kwargs["vocab_size"], size=(2, 7))
    assert_close(model(ids), _reference(hf, ids)[0])  # no mask at all
    assert_close(model(ids[:1, :1]), _reference(hf, ids[:1, :1])[0])  # one token


def test_long_sequences_in_query_blocks(tmp_path):
    """A sequence whose attention bias exceeds the scratch budget is built in blocks of queries;
    several short sequences share one tile."""
    kwargs = dict(_BASE, d_model=16, n_head=2, n_layer=1, d_inner=24)
    hf = _build(tmp_path, kwargs)
    model = cf.load(tmp_path)
    rng = np.random.default_rng(2)
    ids, mask = _padded(rng, kwargs["vocab_size"], [1500, 1100], left=True)
    types = rng.integers(0, 2, size=ids.shape)
    assert_close(model(ids, mask, types), _reference(hf, ids, mask, types)[0])


def test_segment_limit(tmp_path):
    _build(tmp_path, dict(_BASE, n_layer=1))
    model = cf.load(tmp_path)
    assert model.max_seq_len == 4096
    too_long = np.ones((1, 4097), dtype=np.int64)
    message = r"sequence length 4097 exceeds the model's maximum of 4096 tokens \(cpuformer's longest XLNet segment; "
    with pytest.raises(ValueError, match=message + r".*encode_with_memory\)"):
        model(too_long)
    with pytest.raises(ValueError, match=message):
        model.encode_with_memory(too_long)


@pytest.fixture(scope="module")
def quantized_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("xlnet")
    # transformers' default initializer range, as for the other families' bounds.
    _build(directory, dict(_BASE, d_model=64, n_head=4, d_inner=96, initializer_range=0.02), seed=3)
    return str(directory)


def _ids(seed=0):
    return np.random.default_rng(seed).integers(0, 91, size=(3, 21), dtype=np.int64)


def test_int8_and_16_bit_bounds(quantized_dir):
    """The bounds of docs/precision.md: int8 per-token cosine ≥ 0.99, float16 / bfloat16 within
    0.005 / 0.02 of max|float32|."""
    ids = _ids()
    types = np.random.default_rng(4).integers(0, 2, size=ids.shape)
    ref = cf.load(quantized_dir)(ids, None, types)
    int8 = cf.load(quantized_dir, dtype="int8")(ids, None, types)
    assert cosine_rows(int8, ref).min() >= 0.99
    assert not np.array_equal(int8, ref)
    for dtype, bound in (("float16", 0.005), ("bfloat16", 0.02)):
        ours = cf.load(quantized_dir, dtype=dtype)(ids, None, types)
        err = np.abs(ours - ref).max()
        assert 0 < err <= bound * np.abs(ref).max(), (dtype, err)


def test_int8_with_memory(quantized_dir):
    """The memory's keys and values go through the same quantized projections: the second
    segment's hidden states keep the int8 bound."""
    ids = _ids()
    outputs = {}
    for dtype in ("float32", "int8"):
        model = cf.load(quantized_dir, dtype=dtype)
        _, mems = model.encode_with_memory(ids[:, :12])
        outputs[dtype] = model.encode_with_memory(ids[:, 12:], mems=mems)[0]
    assert cosine_rows(outputs["int8"], outputs["float32"]).min() >= 0.99


@pytest.mark.parametrize("dtype", ["int8", "bfloat16"])
def test_converted_directory_gives_identical_outputs(quantized_dir, tmp_path, dtype):
    cf.convert(quantized_dir, tmp_path / "converted", dtype, progress=False)
    ids = _ids(1)
    np.testing.assert_array_equal(cf.load(tmp_path / "converted")(ids), cf.load(quantized_dir, dtype=dtype)(ids))


def _with_config(directory, **changes):
    path = directory / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


@pytest.mark.parametrize("changes, error, message", [
    (dict(attn_type="uni"), NotImplementedError, r"attn_type 'uni' is not supported; only 'bi'"),
    (dict(bi_data=True), NotImplementedError, r"bi_data .* is not supported"),
    (dict(ff_activation="tanh"), NotImplementedError, r"ff_activation 'tanh' is not supported"),
    (dict(d_model=37, n_head=1, d_head=37), ValueError, r"d_model 37 must be even"),
    (dict(n_head=5), ValueError, r"d_model 36 is not a multiple of n_head 5"),
    (dict(d_head=10), ValueError, r"d_head 10 must be d_model / n_head = 12"),
    (dict(mem_len=-1), ValueError, r"'mem_len' must be an integer >= 0"),
    (dict(reuse_len=-2), ValueError, r"'reuse_len' must be an integer >= 0"),
])
def test_config_errors(tmp_path, changes, error, message):
    _build(tmp_path, dict(_BASE, n_layer=1))
    _with_config(tmp_path, **changes)
    with pytest.raises(error, match=message):
        cf.load(tmp_path)


def test_language_model_head_is_refused_and_head_false_opens_the_encoder(tmp_path):
    """XLNetLMHeadModel (the class of the published xlnet-base-cased / xlnet-large-cased): its
    permutation-LM head is not run; head=False opens the encoder."""
    hf = _build(tmp_path, dict(_BASE, n_layer=1), model_class="XLNetLMHeadModel")
    with pytest.raises(NotImplementedError, match=r"XLNetLMHeadModel: cpuformer does not run the language-model "
                                                  r"head of XLNet checkpoints; .*head=False"):
        cf.load(tmp_path)
    ids = _ids()
    assert_close(cf.Encoder(tmp_path, head=False)(ids), _reference(hf, ids)[0])


def test_shape_errors_name_the_weight(tmp_path):
    """A checkpoint whose split projection does not match the config is refused naming the tensor."""
    _build(tmp_path, dict(_BASE, n_layer=1))
    _with_config(tmp_path, n_head=4, d_head=9)
    with pytest.raises(ValueError, match=r"layer\.0\.rel_attn\.q.* has shape \[36, 3, 12\], expected \[36, 4, 9\]"):
        cf.load(tmp_path)


# ---- memory (Transformer-XL segment recurrence) ----------------------------------------------------

def _hf_mems(mems):
    """cpuformer's batch-first mems [B, M, H] as transformers' [M, B, H]."""
    return None if mems is None else [np.ascontiguousarray(m.transpose(1, 0, 2)) for m in mems]


@pytest.mark.parametrize("memory, kept", [(dict(), 9 + 6 + 4), (dict(mem_len=7), 7),
                                          (dict(mem_len=30, reuse_len=4), 4 + 4 + 4)],
                         ids=["keep_all", "mem_len", "reuse_len"])
@pytest.mark.parametrize("left", [True, False], ids=["left_padded", "right_padded"])
def test_segments_with_memory_against_transformers(tmp_path, memory, kept, left):
    """Three consecutive segments, each attending to the memory of the ones before: outputs and
    new mems equal transformers' XLNetModel(mems=..., use_mems=True)."""
    kwargs = dict(CONFIGS["relu_clamped"], clamp_len=-1, **memory)  # distances beyond ±4 too
    if "mem_len" not in memory:
        kwargs["mem_len"] = None
    hf = _build(tmp_path, kwargs)
    model = cf.load(tmp_path)
    rng = np.random.default_rng(5)
    mems = ref_mems = None
    for segment, lengths in enumerate(([9, 5], [6, 6], [4, 2])):
        ids, mask = _padded(rng, kwargs["vocab_size"], lengths, left)
        types = rng.integers(0, 2, size=ids.shape) if segment != 1 else None
        ours, mems = model.encode_with_memory(ids, mask, types, mems)
        ref, ref_mems = _reference(hf, ids, mask, types, ref_mems)
        assert_close(ours, ref)
        assert len(mems) == kwargs["n_layer"]
        for layer, (m, r) in enumerate(zip(mems, ref_mems)):
            assert m.dtype == np.float32 and m.flags.c_contiguous
            assert m.shape == (2, r.shape[0], kwargs["d_model"]), layer
            assert_close(m, r.transpose(1, 0, 2))
        ref_mems = [r.copy() for r in ref_mems]
    assert mems[0].shape[1] == kept


def test_memory_of_one_segment_is_the_plain_call(tmp_path):
    hf = _build(tmp_path, dict(_BASE, mem_len=None))
    model = cf.load(tmp_path)
    ids, mask = _padded(np.random.default_rng(6), 91, [8, 3], left=True)
    out, mems = model.encode_with_memory(ids, mask)
    np.testing.assert_array_equal(out, model(ids, mask))
    assert [m.shape for m in mems] == [(2, 8, 36)] * 2
    # Layer 0's memory is the word embeddings themselves.
    np.testing.assert_array_equal(mems[0], hf.word_embedding.weight.detach().numpy()[ids])


@pytest.fixture(scope="module")
def memory_model(tmp_path_factory):
    directory = tmp_path_factory.mktemp("xlnet_memory")
    _build(directory, dict(_BASE, mem_len=None))
    model = cf.load(directory)
    ids = np.random.default_rng(7).integers(0, 91, size=(2, 5))
    return model, ids, model.encode_with_memory(ids)[1]


@pytest.mark.parametrize("change, error, message", [
    (lambda m: m[:1], ValueError, r"mems must hold one array per layer: 2 \(n_layer\), got 1"),
    (lambda m: m + m[:1], ValueError, r"mems must hold one array per layer: 2 \(n_layer\), got 3"),
    (lambda m: [x[:1] for x in m], ValueError, r"mems\[0\] must have shape \[batch 2, memory length, hidden 36\] "
                                               r"\(batch first\), got \[1, 5, 36\]"),
    (lambda m: [x[:, :, :35] for x in m], ValueError, r"mems\[0\] must have shape .*got \[2, 5, 35\]"),
    (lambda m: [x.transpose(1, 0, 2) for x in m], ValueError, r"mems\[0\] must have shape .*got \[5, 2, 36\]"),
    (lambda m: [m[0], m[1][:, :4]], ValueError, r"mems\[1\] holds 4 tokens but mems\[0\] holds 5; every layer's "
                                                r"memory has the same length"),
    (lambda m: [x.astype(np.float64) for x in m], ValueError, r"mems\[0\] must have dtype float32 \(as "
                                                              r"encode_with_memory returns it\), got float64"),
    (lambda m: [m[0], m[1].astype(np.int64)], ValueError, r"mems\[1\] must have dtype float32"),
    (lambda m: [m[0], np.where(np.arange(36) == 3, np.nan, m[1]).astype(np.float32)], ValueError,
     r"mems\[1\] holds non-finite values \(NaN or ±inf\)"),
    (lambda m: [np.full_like(m[0], np.inf), m[1]], ValueError, r"mems\[0\] holds non-finite values"),
    (lambda m: m[0], TypeError, r"mems must be None or a list of 2 arrays"),
    (lambda m: [x.tolist() for x in m], TypeError, r"mems\[0\] must be a NumPy array, got list"),
])
def test_bad_mems(memory_model, change, error, message):
    model, ids, mems = memory_model
    with pytest.raises(error, match=message):
        model.encode_with_memory(ids, None, None, change(mems))


def test_memory_needs_a_transformer_xl_family(tmp_path):
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=20, max_position_embeddings=16)
    transformers.BertModel(config).save_pretrained(tmp_path, safe_serialization=True)
    with pytest.raises(NotImplementedError, match=r"encode_with_memory needs a model with a Transformer-XL memory "
                                                  r"\(XLNet\); BERT models have none"):
        cf.load(tmp_path).encode_with_memory(np.ones((1, 3), dtype=np.int64))


def test_binding_checks_the_memory(memory_model, tmp_path):
    """The C++ binding checks what it is given too (the Python layer checks first and words it for users)."""
    model, ids, mems = memory_model
    graph = model._live()
    with pytest.raises(TypeError, match=r"memory must be None or a list of 2 arrays, got numpy.ndarray"):
        graph.forward_memory(ids, None, None, mems[0])
    with pytest.raises(ValueError, match=r"memory must hold one array per layer \(2\), got 1"):
        graph.forward_memory(ids, None, None, mems[:1])
    with pytest.raises(TypeError, match=r"memory\[1\] must have dtype float32, got float64"):
        graph.forward_memory(ids, None, None, [mems[0], mems[1].astype(np.float64)])
    with pytest.raises(ValueError, match=r"memory\[0\] must have 3 dimensions \[batch, memory_len, hidden\]"):
        graph.forward_memory(ids, None, None, [mems[0][0], mems[1]])
    with pytest.raises(ValueError, match=r"memory\[1\] must have shape \[2, 5, 36\] \(batch, the memory length of "
                                         r"memory\[0\], hidden\), got \[2, 4, 36\]"):
        graph.forward_memory(ids, None, None, [mems[0], mems[1][:, 1:]])
    out, layer_inputs = graph.forward_memory(ids, None, None, [m[:, :0] for m in mems])  # an empty memory
    np.testing.assert_array_equal(out, model(ids))
    assert layer_inputs.shape == (2, 2, 5, 36)
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=20, max_position_embeddings=16)
    transformers.BertModel(config).save_pretrained(tmp_path, safe_serialization=True)
    with pytest.raises(ValueError, match=r"forward_memory needs a model with Transformer-XL attention \(XLNet\)"):
        cf.load(tmp_path)._live().forward_memory(np.ones((1, 3), dtype=np.int64))
