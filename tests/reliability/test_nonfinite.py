"""Non-finite values (docs/reliability.md, "Non-finite values").

Attention: a key a query row cannot see — outside its causal or sliding-window range, or removed by
a -inf mask value (boolean False, key padding) — must not affect that row whatever its k and v hold:
the row is bitwise the result with finite values there. Rows that do see a NaN/±inf key or value get
what the float rules give (NaN in k: a NaN row; NaN / ±inf in v: NaN / ±inf). Covered: both SIMD
engines (rows in lanes, keys in lanes), several key blocks, grouped-query heads, every mask layout
the kernel distinguishes, and the split-key decode path.

Linear: a NaN or ±inf in an input row gives a non-finite value in every output of that row for
float32, float16, bfloat16 and int8 weights (int8 cannot represent inf: NaN), and leaves the other
rows bitwise unchanged.

Encoder: a padded position whose embedding is NaN does not reach the unpadded positions.

The checks run at the process's ISA level and, through one child pytest, at every other level the
CPU supports.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import cpuformer as cf
from cpuformer import _core

from .conftest import build_bert

ops = cf.ops
LEVELS = ["scalar", "avx2", "avx512"]
CHILD_BERTS = "CPUFORMER_TEST_NONFINITE_BERTS"  # set in the child process: the checkpoints to use

BAD_VALUES = {  # where the value goes, what it is
    "v_nan": ("v", np.nan), "v_posinf": ("v", np.inf), "v_neginf": ("v", -np.inf),
    "k_nan": ("k", np.nan), "k_posinf": ("k", np.inf),
}

# name: B, H, Hkv, Tq, Tk, D, causal, window, mask kind. Rows of one (batch, kv head) go to the
# "narrow" engine below half a vector (4 on avx2) and to the "wide" one from there; decode shapes
# (few rows, Tk ≥ 512) are split over the keys and merged.
ATTENTION_CASES = {
    "causal_narrow": (1, 2, 2, 3, 3, 16, True, 0, None),
    "causal_wide_blocks": (1, 2, 2, 130, 130, 24, True, 0, None),
    "causal_gqa": (1, 8, 2, 37, 37, 9, True, 0, None),
    "causal_cached": (2, 2, 1, 5, 70, 17, True, 0, None),  # queries at the end of the keys
    "sliding_window": (1, 2, 1, 100, 100, 16, True, 16, None),
    "key_padding": (3, 2, 2, 21, 21, 8, False, 0, "key_padding"),
    "query_mask": (2, 3, 3, 20, 20, 16, False, 0, "per_query"),
    "head_mask_causal": (1, 4, 2, 19, 19, 7, True, 0, "per_head"),
    "decode_split": (1, 2, 2, 1, 1100, 16, False, 0, "key_padding"),
    "decode_gqa_split": (1, 8, 1, 1, 1030, 16, True, 0, "key_padding"),
    "beam_decode": (16, 2, 2, 1, 40, 16, False, 0, "key_padding"),
}


def normal(seed, shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def make_mask(kind, B, H, Tq, Tk, seed):
    """A -inf/0 mask of the given layout, broadcast to [B, H, Tq, Tk] (strides 0 where it broadcasts)."""
    rng = np.random.default_rng(seed)
    if kind is None:
        return None
    if kind == "key_padding":  # padding at the end, and a hole inside (not trimmed from the range)
        keep = np.ones((B, 1, 1, Tk), bool)
        for b in range(B):
            keep[b, 0, 0, Tk - 1 - b:] = False
            keep[b, 0, 0, Tk // 3: Tk // 3 + 3] = False
    elif kind == "per_query":
        keep = rng.random((1, 1, Tq, Tk)) < 0.6
        keep[0, 0, 0, :] = False  # a row that sees no key at all
    else:  # per_head
        keep = rng.random((1, H, Tq, Tk)) < 0.6
    mask = np.where(keep, 0.0, -np.inf).astype(np.float32)
    return np.broadcast_to(mask, (B, H, Tq, Tk))


def visible(B, H, Tq, Tk, causal, window, mask):
    """[B, H, Tq, Tk]: whether query row (b, h, i) sees key j."""
    i = np.arange(Tq)[:, None] + (Tk - Tq)
    j = np.arange(Tk)[None, :]
    seen = np.ones((Tq, Tk), bool)
    if causal:
        seen &= j <= i
        if window > 0:
            seen &= j > i - window
    seen = np.broadcast_to(seen, (B, H, Tq, Tk))
    if mask is not None:
        seen = seen & (mask != -np.inf)
    return seen


def run_views(q, k, v, causal, window, mask):
    out = np.full(q.shape, 7.0, np.float32)
    Tq, Tk = q.shape[2], k.shape[2]
    _core._attention_views(q, k, v, out, causal, Tk - Tq, window, mask, 1.0 / np.sqrt(q.shape[3]))
    return out


def bad_positions(seen, group, Tk):
    """Keys (b, kv head, j) that some rows of the group see and others do not, plus one nobody sees."""
    B = seen.shape[0]
    picks = []
    for b in range(B):
        for hk in range(seen.shape[1] // group):
            counts = seen[b, hk * group:(hk + 1) * group].sum(axis=(0, 1))  # [Tk]
            rows = seen.shape[2] * group
            mixed = np.flatnonzero((counts > 0) & (counts < rows))
            unseen = np.flatnonzero(counts == 0)
            if len(mixed):
                picks.append((b, hk, int(mixed[len(mixed) // 2])))
            if len(unseen):
                picks.append((b, hk, int(unseen[0])))
    assert picks, "the case has no key that a row cannot see"
    return picks[:3]


def expected_seeing(kind, value, q_rows, k_bad, scale):
    """For rows that see the bad key: 'nan', 'posinf' or 'neginf' per row (float rules)."""
    where, _ = BAD_VALUES[kind]
    if where == "v":
        return {"v_nan": "nan", "v_posinf": "posinf", "v_neginf": "neginf"}[kind]
    with np.errstate(all="ignore"):
        score = (q_rows.astype(np.float64) * k_bad.astype(np.float64)).sum(axis=-1) * scale
    # a NaN or +inf score makes the softmax NaN; -inf only gives the key weight 0 (its v is finite)
    return np.where(np.isneginf(score), "finite", "nan")


@pytest.mark.parametrize("case", sorted(ATTENTION_CASES))
@pytest.mark.parametrize("bad", sorted(BAD_VALUES))
def test_attention_removed_keys_do_not_reach_rows(case, bad):
    B, H, Hkv, Tq, Tk, D, causal, window, mask_kind = ATTENTION_CASES[case]
    group = H // Hkv
    q, k, v = normal(1, (B, H, Tq, D)), normal(2, (B, Hkv, Tk, D)), normal(3, (B, Hkv, Tk, D))
    mask = make_mask(mask_kind, B, H, Tq, Tk, 4)
    seen = visible(B, H, Tq, Tk, causal, window, mask)
    clean = run_views(q, k, v, causal, window, mask)
    where, value = BAD_VALUES[bad]
    for b, hk, j in bad_positions(seen, group, Tk):
        k2, v2 = k.copy(), v.copy()
        (k2 if where == "k" else v2)[b, hk, j, :] = value
        got = run_views(q, k2, v2, causal, window, mask)
        heads = slice(hk * group, (hk + 1) * group)
        sees = np.zeros((B, H, Tq), bool)
        sees[b, heads] = seen[b, heads, :, j]
        # rows that cannot see key j (and every other batch / head): bitwise the clean result
        np.testing.assert_array_equal(got[~sees], clean[~sees], err_msg=f"{case} {bad} key {(b, hk, j)} leaked")
        if not sees.any():
            continue
        expect = expected_seeing(bad, value, q[sees], k2[b, hk, j], 1.0 / np.sqrt(D))
        rows = got[sees]  # [rows, D]
        if isinstance(expect, str):
            expect = np.full(len(rows), expect)
        for row, e in zip(rows, expect):
            if e == "nan":
                assert np.isnan(row).all(), f"{case} {bad}: a row that sees key {j} is {row}"
            elif e == "posinf":
                assert np.isposinf(row).all(), f"{case} {bad}: a row that sees key {j} is {row}"
            elif e == "neginf":
                assert np.isneginf(row).all(), f"{case} {bad}: a row that sees key {j} is {row}"
            else:
                assert np.isfinite(row).all(), f"{case} {bad}: a row that sees key {j} is {row}"


def test_attention_row_without_keys_is_zeros_whatever_the_values():
    B, H, T, D = 1, 2, 20, 16
    q, k, v = normal(5, (B, H, T, D)), normal(6, (B, H, T, D)), normal(7, (B, H, T, D))
    mask = np.zeros((T, T), np.float32)
    mask[3] = -np.inf  # query 3 sees nothing
    k[:, :, ::2] = np.nan
    v[:, :, 1::2] = np.inf
    out = ops.attention(q, k, v, mask=mask)
    np.testing.assert_array_equal(out[:, :, 3], 0.0)
    assert np.isnan(np.delete(out, 3, axis=2)).all()


@pytest.mark.parametrize("layout", ["bool", "additive_2d", "key_padding_4d"])
def test_ops_attention_masks_and_causal(layout):
    """ops.attention (the public op, which copies its inputs) with `mask=` and `causal=`."""
    B, H, T, D = 2, 3, 50, 16
    q, k, v = normal(8, (B, H, T, D)), normal(9, (B, H, T, D)), normal(10, (B, H, T, D))
    rng = np.random.default_rng(11)
    if layout == "bool":
        mask = rng.random((T, T)) < 0.5
        removed = ~mask
    elif layout == "additive_2d":
        mask = np.where(rng.random((T, T)) < 0.5, rng.standard_normal((T, T)), -np.inf).astype(np.float32)
        removed = mask == -np.inf
    else:
        mask = np.zeros((B, 1, 1, T), np.float32)
        mask[:, :, :, 17:20] = -np.inf
        removed = np.broadcast_to(mask[:, 0, 0, None, :] == -np.inf, (B, T, T))
    j = 18  # removed for some rows in every layout, and beyond the diagonal for the causal rows before it
    for causal in (False, True):
        clean = ops.attention(q, k, v, causal=causal, mask=mask)
        for name, (where, value) in BAD_VALUES.items():
            k2, v2 = k.copy(), v.copy()
            (k2 if where == "k" else v2)[:, :, j] = value
            got = ops.attention(q, k2, v2, causal=causal, mask=mask)
            blind = np.broadcast_to(removed[..., j] if removed.ndim == 3 else removed[:, j], (B, T))
            if causal:
                blind = blind | (np.arange(T) < j)
            blind = np.broadcast_to(blind[:, None, :], (B, H, T))
            np.testing.assert_array_equal(got[blind], clean[blind], err_msg=f"{layout} causal={causal} {name}")
            if name in ("v_nan", "k_nan"):
                assert np.isnan(got[~blind]).all()


def test_attention_nan_mask_value_makes_only_its_row_nan():
    B, H, T, D = 1, 2, 40, 16
    q, k, v = normal(12, (B, H, T, D)), normal(13, (B, H, T, D)), normal(14, (B, H, T, D))
    mask = np.zeros((T, T), np.float32)
    clean = ops.attention(q, k, v, mask=mask)
    for value in (np.nan, np.inf):
        bad = mask.copy()
        bad[5, 30] = value  # a visible key of query 5 only
        got = ops.attention(q, k, v, mask=bad)
        assert np.isnan(got[:, :, 5]).all()
        np.testing.assert_array_equal(np.delete(got, 5, axis=2), np.delete(clean, 5, axis=2))


# ---- Linear ------------------------------------------------------------------------------------

DTYPES = ["float32", "float16", "bfloat16", "int8"]


@pytest.mark.parametrize("activation", [None, "gelu", "silu"])
@pytest.mark.parametrize("functional", [False, True])
def test_linear_nonfinite_rows_follow_the_rule_in_every_dtype(activation, functional):
    M, K, N = 9, 37, 19  # row and column tails of every register tile
    x = normal(20, (M, K))
    w = normal(21, (N, K)) / np.float32(np.sqrt(K))
    bias = normal(22, (N,))
    bad = x.copy()
    bad[1, 5] = np.nan
    bad[4, 0] = np.inf
    bad[6, K - 1] = -np.inf
    bad[7, :] = np.nan
    bad_rows = [1, 4, 6, 7]
    good = np.setdiff1d(np.arange(M), bad_rows)
    nan_patterns = {}
    for dtype in DTYPES:
        if functional:
            def run(a, dtype=dtype):
                return ops.linear(a, w, bias, activation, dtype=dtype)
        else:
            layer = ops.Linear(w, bias, activation, dtype=dtype)
            run = layer
        clean, got = run(x), run(bad)
        np.testing.assert_array_equal(got[good], clean[good], err_msg=f"{dtype}: a non-finite row reached another row")
        assert np.isnan(got[[1, 7]]).all(), f"{dtype}: a NaN input row must give NaN in every output"
        if activation is None:
            if dtype == "int8":
                assert np.isnan(got[[4, 6]]).all(), "int8 cannot represent inf: an inf row gives NaN"
            else:
                assert not np.isfinite(got[[4, 6]]).any(), f"{dtype}: an inf row gives ±inf or NaN in every output"
        nan_patterns[dtype] = np.isnan(got[[1, 7] + list(good)])
    for dtype in DTYPES[1:]:
        np.testing.assert_array_equal(nan_patterns[dtype], nan_patterns["float32"])


def test_linear_residual_and_nan_row_int8():
    M, K, N = 5, 64, 32
    x, w, residual = normal(23, (M, K)), normal(24, (N, K)), normal(25, (M, N))
    layer = ops.Linear(w, None, "relu", dtype="int8")
    bad = x.copy()
    bad[2, 10] = np.nan
    clean, got = layer(x, residual), layer(bad, residual)
    assert np.isnan(got[2]).all()  # relu(NaN) is NaN, NaN + residual is NaN
    np.testing.assert_array_equal(np.delete(got, 2, axis=0), np.delete(clean, 2, axis=0))


# ---- Encoder -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def nan_pad_berts(tmp_path_factory):
    """Two tiny BERTs, equal but for the padding token's embedding row, which is NaN in the second
    (the child process at another level reuses the parent's: building them imports torch)."""
    if os.environ.get(CHILD_BERTS):
        return tuple(os.environ[CHILD_BERTS].split(os.pathsep))
    safetensors_torch = pytest.importorskip("safetensors.torch")
    clean = tmp_path_factory.mktemp("bert_clean")
    build_bert(clean, seed=3)
    poisoned = tmp_path_factory.mktemp("bert_nan_pad")
    build_bert(poisoned, seed=3)
    path = os.path.join(poisoned, "model.safetensors")
    tensors = safetensors_torch.load_file(path)
    name = next(n for n in tensors if n.endswith("word_embeddings.weight"))
    tensors[name][0] = float("nan")  # pad_token_id 0
    safetensors_torch.save_file(tensors, path, metadata={"format": "pt"})
    return str(clean), str(poisoned)


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_encoder_nan_padding_does_not_reach_tokens(nan_pad_berts, dtype):
    clean_dir, poisoned_dir = nan_pad_berts
    ids = np.array([[5, 7, 9, 11, 13, 0, 0, 0],
                    [0, 0, 4, 6, 8, 10, 12, 14],   # left padding
                    [3, 5, 0, 0, 7, 9, 2, 0]], np.int64)  # holes inside the sequence
    mask = (ids != 0).astype(np.int64)
    real = mask.astype(bool)
    with cf.Encoder(clean_dir, dtype=dtype, num_threads=1) as clean, \
            cf.Encoder(poisoned_dir, dtype=dtype, num_threads=1) as poisoned:
        want, got = clean(ids, mask), poisoned(ids, mask)
        assert np.isnan(got[~real]).all()  # the padded positions themselves are NaN
        assert np.isfinite(got[real]).all()
        np.testing.assert_array_equal(got[real], want[real])
        sequences = [[5, 7, 9], [4, 6, 8, 10, 12, 14, 16]]
        np.testing.assert_array_equal(poisoned.embed(sequences), clean.embed(sequences))


@pytest.fixture(scope="module")
def nonfinite_weight_berts(nan_pad_berts, tmp_path_factory):
    """The clean BERT with one weight of layer 0's intermediate projection set to NaN, and to inf
    (NumPy only: the child process at another level reuses the parent's directories)."""
    from safetensors.numpy import load_file, save_file

    directories = {}
    for name, value in (("nan", np.nan), ("inf", np.inf)):
        directory = os.path.join(os.path.dirname(nan_pad_berts[0]), f"bert_{name}_weight")
        if not os.path.isdir(directory):
            shutil.copytree(nan_pad_berts[0], directory)
            path = os.path.join(directory, "model.safetensors")
            tensors = load_file(path)
            key = next(n for n in tensors if n.endswith("layer.0.intermediate.dense.weight"))
            tensors[key][3, 5] = value
            save_file(tensors, path, metadata={"format": "pt"})
        directories[name] = directory
    return directories


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int8"])
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_nonfinite_weight_reaches_outputs_in_every_dtype(nonfinite_weight_berts, dtype, value):
    """A non-finite weight makes its output channel NaN/inf in float32, which the next layers spread
    to every output. int8 cannot hold it: that channel's scale is NaN (before: a NaN weight was cast
    to int8, which is undefined, and an inf row quantized to zeros), so the outputs are NaN too."""
    ids = np.array([[5, 7, 9, 11, 13]], np.int64)
    with cf.Encoder(nonfinite_weight_berts[value], dtype=dtype, num_threads=1) as encoder:
        out = encoder(ids)
    if value == "nan" or dtype == "int8":
        assert np.isnan(out).all()
    else:
        assert not np.isfinite(out).any()


def test_convert_to_int8_refuses_a_nonfinite_weight_naming_it(nonfinite_weight_berts, tmp_path):
    with pytest.raises(ValueError, match=r"tensor \S*layer\.0\.intermediate\.dense\.weight: w has a non-finite "
                                         r"value at flat index \d+; int8 needs finite weights"):
        cf.convert(nonfinite_weight_berts["nan"], tmp_path / "int8", "int8", progress=False)


# ---- the other ISA levels ----------------------------------------------------------------------

def test_nonfinite_at_other_levels(nan_pad_berts):
    """The same rules hold at every level: this file again in a child process at each level this
    CPU supports other than the current one."""
    assert CHILD_BERTS not in os.environ, "the child process must not start children of its own"
    best, current = cf.cpu_info()["best_isa"], cf.cpu_info()["isa"]
    for level in [lv for lv in LEVELS[: LEVELS.index(best) + 1] if lv != current]:
        env = dict(os.environ, CPUFORMER_ISA=level)
        env[CHILD_BERTS] = os.pathsep.join(nan_pad_berts)
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", __file__,
                              "-k", "not test_nonfinite_at_other_levels"],
                             env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, f"at CPUFORMER_ISA={level}:\n{out.stdout[-6000:]}\n{out.stderr[-3000:]}"
        assert "skipped" not in out.stdout.splitlines()[-1]
