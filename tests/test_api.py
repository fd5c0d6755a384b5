"""repr(), num_parameters, close() and context-manager support of the model classes."""

import re

import pytest

import cpuformer as cf
from cpuformer import _bench

TINY = {
    "encoder": dict(name="tiny-bert", vocab_size=200, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=64, max_position_embeddings=64),
    "decoder": dict(name="tiny-gpt2", vocab_size=200, n_embd=32, n_layer=2, n_head=4, n_positions=64),
    "seq2seq": dict(name="tiny-marian", vocab_size=200, d_model=32, encoder_layers=2, decoder_layers=2,
                    encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                    max_position_embeddings=64),
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return {kind: _bench.build_model(kind, shape, str(root / kind)) for kind, shape in TINY.items()}


def _expected_parameters(kind):
    s = TINY[kind]
    if kind == "encoder":
        H, I, V, P = s["hidden_size"], s["intermediate_size"], s["vocab_size"], s["max_position_embeddings"]
        layer = 4 * (H * H + H) + (I * H + I) + (H * I + H) + 4 * H
        return V * H + P * H + 2 * H + 2 * H + s["num_hidden_layers"] * layer + H * H + H
    if kind == "decoder":
        H, V, P = s["n_embd"], s["vocab_size"], s["n_positions"]
        layer = 4 * H + (3 * H * H + 3 * H) + (H * H + H) + (4 * H * H + 4 * H) + (4 * H * H + H)
        return V * H + P * H + s["n_layer"] * layer + 2 * H
    d, F, V = s["d_model"], s["encoder_ffn_dim"], s["vocab_size"]
    attention = 4 * (d * d + d) + 2 * d
    ffn = (F * d + F) + (d * F + d) + 2 * d
    return V * d + s["encoder_layers"] * (attention + ffn) + s["decoder_layers"] * (2 * attention + ffn) + V


@pytest.mark.parametrize("kind,cls,shape_text", [
    ("encoder", "Encoder", "BertModel, layers=2, hidden=32, heads=4"),
    ("decoder", "Generator", "GPT2LMHeadModel, layers=2, hidden=32, heads=4/4"),
    ("seq2seq", "Seq2Seq", "MarianMTModel, layers=2+2, d_model=32, heads=4"),
])
def test_repr_shows_architecture_dtype_parameters_isa_threads(tiny, kind, cls, shape_text):
    n = _expected_parameters(kind)
    model = cf.load(tiny[kind], num_threads=1)
    assert type(model).__name__ == cls
    assert model.num_parameters == n
    isa = cf.cpu_info()["isa"]
    count = f"{n / 1e3:.1f}K"
    assert repr(model) == f"{cls}({shape_text}, dtype=float32, parameters={count}, isa={isa}, threads=1)"
    model.close()
    assert model.closed
    assert repr(model) == f"{cls}({shape_text}, dtype=float32, parameters={count}, isa={isa}, threads=1, closed)"
    auto = cf.load(tiny[kind])
    assert repr(auto).endswith(f"threads=auto({cf.get_num_threads()}))")
    auto.close()


def test_format_count():
    from cpuformer.models._base import format_count

    assert [format_count(n) for n in (999, 1234, 124_439_808, 1_100_048_384)] == ["999", "1.2K", "124.4M", "1.10B"]


def test_context_manager_closes(tiny):
    with cf.load(tiny["encoder"]) as enc:
        assert isinstance(enc, cf.Encoder) and not enc.closed
        out = enc([[5, 6, 7]])
        assert out.shape == (1, 3, 32)
    assert enc.closed
    with pytest.raises(ValueError, match="this Encoder is closed"):
        enc([[5, 6, 7]])
    with pytest.raises(ValueError, match="this Encoder is closed"):
        enc.embed([[5, 6]])


def test_context_manager_closes_on_error(tiny):
    with pytest.raises(RuntimeError, match="boom"):
        with cf.Generator(tiny["decoder"]) as gen:
            raise RuntimeError("boom")
    assert gen.closed
    with pytest.raises(ValueError, match="this Generator is closed"):
        gen.generate([1, 2])
    with pytest.raises(ValueError, match="this Generator is closed"):
        gen.stream([1, 2])
    with pytest.raises(ValueError, match="this Generator is closed"):
        gen.logits([[1, 2]])


def test_seq2seq_close_and_twice(tiny):
    with cf.Seq2Seq(tiny["seq2seq"]) as s2s:
        tokens = s2s.generate([[5, 6, 7]], max_new_tokens=3)
        assert len(tokens) == 1 and 1 <= len(tokens[0]) <= 3
    s2s.close()  # closing again is harmless
    with pytest.raises(ValueError, match="this Seq2Seq is closed"):
        s2s.generate([[5, 6, 7]])
    with pytest.raises(ValueError, match="this Seq2Seq is closed"):
        s2s.encode([[5, 6, 7]])


def test_typing_files_ship():
    import os

    package = os.path.dirname(cf.__file__)
    assert os.path.isfile(os.path.join(package, "py.typed"))
    with open(os.path.join(package, "_core.pyi")) as f:
        stub = f.read()
    from cpuformer import _core

    public = [n for n in dir(_core) if not n.startswith("__")]
    for name in public:
        assert re.search(rf"^(def|class) {name}\b", stub, re.M), f"_core.pyi does not declare {name}"


def test_benchmark_checkpoints_match_transformers(tiny):
    """The NumPy-written benchmark checkpoints are read the same way by transformers: the peers of
    `cpuformer bench --compare` run the very same model."""
    import torch
    import transformers
    ids = [[5, 17, 42, 99, 3, 150]]
    x = torch.tensor(ids)
    with torch.inference_mode():
        with cf.load(tiny["encoder"]) as enc:
            ref = transformers.AutoModel.from_pretrained(tiny["encoder"]).eval()(x).last_hidden_state.numpy()
            assert abs(enc(ids) - ref).max() < 1e-5
        with cf.load(tiny["decoder"]) as gen:
            ref = transformers.AutoModelForCausalLM.from_pretrained(tiny["decoder"]).eval()(x).logits.numpy()
            assert abs(gen.logits(ids) - ref).max() < 1e-5
        with cf.load(tiny["seq2seq"]) as s2s:
            model = transformers.AutoModelForSeq2SeqLM.from_pretrained(tiny["seq2seq"]).eval()
            target = [[199, 7, 8, 9]]
            ref = model(input_ids=x, decoder_input_ids=torch.tensor(target)).logits.numpy()
            assert abs(s2s.logits(ids, target) - ref).max() < 1e-5
            expected = model.generate(x, max_new_tokens=6, num_beams=1, do_sample=False).tolist()
            assert [[199] + t for t in s2s.generate(ids, max_new_tokens=6)] == expected
