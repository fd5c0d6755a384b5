"""The key/value cache's reorder, which beam search runs after every step: row r takes the old
row source[r] in every layer's keys and values (cpuformer._core._kv_cache_reorder builds a cache
from arrays, reorders it and reads it back). It copies rows in place along chains and cycles of
the source map, so the cases are permutations (cycles), forks (one row read by several), dropped
rows and identities, on one thread and on several (layers' buffers split across threads)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpuformer import _core


def reorder(k, v, source, threads):
    return _core._kv_cache_reorder(k, v, np.asarray(source, dtype=np.int64), threads)


def cache(layers, rows, heads, length, dim, seed=0):
    rng = np.random.default_rng(seed)
    shape = (layers, rows, heads, length, dim)
    return rng.standard_normal(shape, dtype=np.float32), rng.standard_normal(shape, dtype=np.float32)


@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize("source", [
    [0, 1, 2, 3, 4, 5],  # every beam kept its history
    [1, 0, 2, 3, 4, 5],  # a swap: a 2-cycle
    [1, 2, 3, 4, 5, 0],  # one 6-cycle
    [1, 0, 3, 2, 5, 4],  # three 2-cycles
    [0, 0, 1, 2, 3, 4],  # a chain: every row read before it is overwritten
    [2, 2, 2, 2, 2, 2],  # one beam forked into all
    [3, 3, 0, 1, 2, 5],  # a cycle and a fork into it
    [5, 4, 3, 2, 1, 0],  # reversal
])
def test_reorder_matches_indexing(source, threads):
    k, v = cache(2, 6, 3, 5, 8)
    k_out, v_out = reorder(k, v, source, threads)
    np.testing.assert_array_equal(k_out, k[:, source])
    np.testing.assert_array_equal(v_out, v[:, source])


@pytest.mark.parametrize("threads", [1, 2])
def test_reorder_large_cache_on_threads(threads):
    # Large enough (> 256 KB copied) for the buffers to be split across threads.
    k, v = cache(3, 8, 4, 64, 64, seed=1)
    source = [7, 0, 0, 5, 6, 3, 4, 1]  # a fork, a chain and a cycle (3 -> 5 -> 3), row 2 dropped
    k_out, v_out = reorder(k, v, source, threads)
    np.testing.assert_array_equal(k_out, k[:, source])
    np.testing.assert_array_equal(v_out, v[:, source])


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_reorder_any_source_map(data):
    rows = data.draw(st.integers(1, 9), label="rows")
    source = data.draw(st.lists(st.integers(0, rows - 1), min_size=rows, max_size=rows), label="source")
    threads = data.draw(st.sampled_from([1, 2]), label="threads")
    length = data.draw(st.integers(1, 4), label="length")
    k, v = cache(2, rows, 2, length, 3, seed=rows)
    k_out, v_out = reorder(k, v, source, threads)
    np.testing.assert_array_equal(k_out, k[:, source])
    np.testing.assert_array_equal(v_out, v[:, source])


def test_reorder_hook_rejects_bad_arguments():
    k, v = cache(1, 3, 1, 2, 4)
    with pytest.raises(ValueError, match=r"source indices must be in \[0, rows\)"):
        reorder(k, v, [0, 3, 1], 1)
    with pytest.raises(ValueError, match="source must hold one index per row"):
        reorder(k, v, [0, 1], 1)
    with pytest.raises(ValueError, match="k and v must have the same shape"):
        reorder(k, v[:, :2].copy(), [0, 1, 2], 1)
    with pytest.raises(TypeError, match="k and v must be 5-D float32 arrays"):
        reorder(k[0], v[0], [0, 1, 2], 1)
    with pytest.raises(ValueError, match="k and v must not have an empty dimension"):
        reorder(k[:, :, :, :0].copy(), v[:, :, :, :0].copy(), [0, 1, 2], 1)
    with pytest.raises(ValueError, match="num_threads must be >= 1"):
        reorder(k, v, [0, 1, 2], 0)
