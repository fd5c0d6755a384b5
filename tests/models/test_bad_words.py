"""bad_words_ids (transformers' NoBadWordsLogitsProcessor) against transformers' generate on the
registry's tiny checkpoints: one-token and multi-token sequences, greedy and beam search, from a
call and from generation_config.json."""

from __future__ import annotations

import json

import numpy as np
import pytest

import cpuformer as cf

from .test_registry import _build

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

NEW = 12


def _reference(hf, kind, prompt, **kwargs):
    ids = torch.tensor([prompt])
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, min_new_tokens=NEW,
                      do_sample=False, pad_token_id=0, **kwargs)[0].tolist()
    return out[len(prompt):] if kind == "decoder" else out[1:]


@pytest.mark.parametrize("family", ["gpt2", "llama", "t5", "bart"])
def test_bad_words_match_transformers(family, tmp_path):
    hf = _build(family, tmp_path)
    model = cf.load(tmp_path)
    kind = model.hparams.kind
    prompt = [int(x) for x in np.random.default_rng(1).integers(3, model.vocab_size - 2, 9)]
    plain = model.generate(prompt, max_new_tokens=NEW, min_new_tokens=NEW)[0]
    # Ban a token the plain output uses, and a pair that it produces (its second token only right
    # after the first), plus a long sequence that never matches.
    bad = [[plain[2]], [plain[4], plain[5]], [1, 2, 3, 4]]
    with torch.no_grad():
        for beams in (1, 3):
            expected = _reference(hf, kind, prompt, bad_words_ids=bad, num_beams=beams)
            ours = model.generate(prompt, max_new_tokens=NEW, min_new_tokens=NEW, num_beams=beams,
                                  bad_words_ids=bad)[0]
            assert ours == expected, (family, beams)
    assert plain[2] not in ours
    # From generation_config.json, the same.
    with open(tmp_path / "generation_config.json") as f:
        generation = json.load(f)
    generation["bad_words_ids"] = bad
    with open(tmp_path / "generation_config.json", "w") as f:
        json.dump(generation, f)
    assert cf.load(tmp_path).generate(prompt, max_new_tokens=NEW, min_new_tokens=NEW, num_beams=3)[0] == ours


def test_bad_words_errors(tmp_path):
    _build("gpt2", tmp_path)
    model = cf.load(tmp_path)
    for bad in ([[]], [1, 2], [[model.vocab_size]], [[-1]], [[1.0]], "x", [[True]]):
        with pytest.raises(ValueError, match=r"'bad_words_ids' must be a list of non-empty lists of token ids "
                                             r"\(integers in \[0, 101\)\), got"):
            model.generate([5, 6], bad_words_ids=bad)
