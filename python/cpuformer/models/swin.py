"""Swin Transformer image models (arch/swin.py): ``ImageEncoder`` / ``ImageClassifier`` subclasses that
loop over the stages in Python and run each block in C++ (``_core.SwinBlock``, csrc/layers/window_attention.h).

Swin's stages have different widths, so it does not fit the uniform C++ encoder graph. A block
(transformers' SwinLayer) is ONE ``_core.SwinBlock`` call that updates the tokens x [B · H · W, C]
(row-major (row, column) order) in place, with the weights packed once at load in the model's dtype:

* LayerNorm fused with the window gather: each windowed row is the norm of the token ``source``
  names (``_Grid``: the cyclic shift (roll by -shift), the zero padding to a multiple of the window
  and the window partition folded into one index, computed once per block and input size), or
  zeros in the padding (transformers pads after layernorm_before);
* q, k and v from ONE GEMM (the three weights concatenated); the attention kernel reads them in
  place in that buffer (strides, no transpose) with the additive mask [1 | nW, heads, ws², ws²]:
  the relative position bias (table rows picked by the relative position index, computed here)
  plus, in a shifted block, the shifted windows' mask (-100 between the regions the roll brought
  together), one per window; cached per block and input size. An unshifted block attends all the
  batch's windows in one call (one mask for every window), a shifted one image by image;
* the output projection over the windowed rows, then the scatter back to token order (``inverse``;
  the padding dropped) fused with the residual add;
* the MLP: LayerNorm, the up projection with its activation fused, the down projection accumulating
  into x (the residual).

Scratch (the windowed rows, q/k/v and the MLP's hidden) comes from the model's ``_core.SwinScratch``:
reused by every block and call, one set per concurrent call.

Windows: when a stage's resolution is at most the window (min(H, W) <= window_size), the window is
min(H, W) and there is no shift (transformers' set_shift_and_window_size, applied per call: the
model keeps no state between inputs). The bias of such a smaller window w is the table's entries of
the offsets inside it (index (dh + ws - 1) · (2 · ws - 1) + dw + ws - 1 in the full window's
table): the bias of the same offsets in the trained window (transformers 5.24 fails on these
inputs; docs/vision.md).

Patch merging: the 2x2 neighbours concatenated in transformers' order (x0 = (even row, even column),
x1 = (odd, even), x2 = (even, odd), x3 = (odd, odd)) after zero padding odd sizes and the LayerNorm,
in one C++ pass (``_core.swin_patch_merge``), then the reduction Linear without bias. The patch
embedding is a GEMM over the patches of the image padded on the right and bottom to a multiple of
the patch size (transformers' maybe_pad), then the embeddings LayerNorm and, with
use_absolute_embeddings, the position embeddings (bicubically interpolated for other sizes with
``interpolate_pos_encoding``, as ViT's). The output: last_hidden_state [B, tokens, C_last] after
the final LayerNorm, pooler_output its mean over the tokens (transformers' AdaptiveAvgPool1d),
logits the classifier on the pooler output.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import numpy as np

from .. import _core
from .._arguments import check_integer
from .._model_dir import ModelDir
from ..arch import find
from ..arch.heads import Head
from ..weights import Checkpoint
from .vision import ImageClassifier, ImageEncoder, _batches, check_pixel_array, interpolate_positions, open_image_model

PathLike = Union[str, "os.PathLike[str]"]

#: transformers' mask value between the regions of a shifted window.
_SHIFT_MASK = -100.0
#: Input sizes whose window layout and mask each block keeps (the oldest one is dropped).
_GRIDS = 8


def relative_position_index(window: int, frame: int) -> np.ndarray:
    """[window², window²] rows of the relative position bias table of a (2 · frame - 1)² table for
    the tokens of a window × window window: (dh + frame - 1) · (2 · frame - 1) + dw + frame - 1 of
    the offsets (dh, dw) between query and key (transformers' relative_position_index when
    window = frame)."""
    rows, cols = np.meshgrid(np.arange(window), np.arange(window), indexing="ij")
    rows, cols = rows.reshape(-1), cols.reshape(-1)
    dh = rows[:, None] - rows[None, :] + frame - 1
    dw = cols[:, None] - cols[None, :] + frame - 1
    return dh * (2 * frame - 1) + dw


def _shift_mask(height: int, width: int, window: int, shift: int) -> np.ndarray:
    """[nW, ws², ws²] transformers' get_attn_mask: 0 within a region, -100 across regions."""
    def regions(size: int) -> np.ndarray:
        index = np.arange(size)
        return (index >= size - window).astype(np.int64) + (index >= size - shift)

    image = regions(height)[:, None] * 3 + regions(width)[None, :]
    windows = image.reshape(height // window, window, width // window, window).transpose(0, 2, 1, 3)
    windows = windows.reshape(-1, window * window)
    return np.where(windows[:, None, :] != windows[:, :, None], np.float32(_SHIFT_MASK),
                    np.float32(0)).astype(np.float32)


class _Grid:
    """The window layout of one block at one resolution: the gather of the windows (roll, padding
    and partition in one index), its inverse and the attention mask."""

    def __init__(self, height: int, width: int, window_size: int, shift_size: int, table: np.ndarray):
        if min(height, width) <= window_size:  # transformers' set_shift_and_window_size
            shift_size, window = 0, min(height, width)
        else:
            window = window_size
        self.window, self.shift = window, shift_size
        hp, wp = -(-height // window) * window, -(-width // window) * window
        nh, nw = hp // window, wp // window
        self.windows = nh * nw
        # Windowed position (window row, window column, row in window, column in window) -> position in the
        # padded, rolled map; rolling by -shift reads the padded map at (r + shift) mod size.
        r = (np.arange(nh)[:, None] * window + np.arange(window)[None, :]).reshape(-1)  # [hp] in window order
        c = (np.arange(nw)[:, None] * window + np.arange(window)[None, :]).reshape(-1)
        r, c = (r + shift_size) % hp, (c + shift_size) % wp
        rr = r.reshape(nh, 1, window, 1)
        cc = c.reshape(1, nw, 1, window)
        rows = np.broadcast_to(rr, (nh, nw, window, window)).reshape(-1)
        cols = np.broadcast_to(cc, (nh, nw, window, window)).reshape(-1)
        padding = (rows >= height) | (cols >= width)
        # The token of each windowed row, -1 in the padding; for each token, its windowed row.
        self.source = np.where(padding, -1, rows * width + cols).astype(np.int64)
        self.inverse = np.empty(height * width, dtype=np.int64)
        keep = ~padding
        self.inverse[self.source[keep]] = np.nonzero(keep)[0]
        area = window * window
        heads = table.shape[1]
        bias = table[relative_position_index(window, window_size).reshape(-1)]  # [area², heads]
        bias = bias.reshape(area, area, heads).transpose(2, 0, 1)  # [heads, area, area]
        # Shifted: a mask per window [nW, heads, area, area]; unshifted: the bias alone [1, heads, area,
        # area], the same for every window.
        if shift_size > 0:
            mask = bias[None] + _shift_mask(hp, wp, window, shift_size)[:, None]
        else:
            mask = bias[None]
        self.mask = np.ascontiguousarray(mask, dtype=np.float32)


class _Block:
    """One Swin block: the C++ ``_core.SwinBlock`` (weights packed once) and its window layouts."""

    def __init__(self, arrays: Dict[str, np.ndarray], c: str, heads: int, window_size: int, shift: int, eps: float,
                 activation: str, dtype: str, group_size: int, zero_point: bool, scratch: Any):
        self.heads, self.window_size, self.shift, self.eps = heads, window_size, shift, eps
        tensors = {key[len(c):]: value for key, value in arrays.items()
                   if key.startswith(c) and key != c + "bias_table"}
        self.core = _core.SwinBlock(tensors, heads, eps, activation, dtype, group_size, zero_point, scratch)
        self.table = np.ascontiguousarray(arrays[c + "bias_table"])
        self._grids: Dict[Tuple[int, int], _Grid] = {}
        self._lock = threading.Lock()  # the cache is shared by the threads calling the model

    def grid(self, height: int, width: int) -> _Grid:
        """The layout at this resolution (cached; the cache keeps the last _GRIDS sizes)."""
        key = (height, width)
        with self._lock:
            grid = self._grids.get(key)
            if grid is None:
                grid = _Grid(height, width, self.window_size, self.shift, self.table)
                if len(self._grids) >= _GRIDS:
                    self._grids.pop(next(iter(self._grids)))
                self._grids[key] = grid
            return grid

    def __call__(self, x: np.ndarray, batch: int, height: int, width: int, threads: int) -> np.ndarray:
        """x [B · H · W, C] -> the block's output, computed in place in x (``threads``: num_threads)."""
        g = self.grid(height, width)
        self.core(x, batch, g.source, g.inverse, g.mask, threads)
        return x


class _Swin:
    """The packed model: patch embedding, stages of blocks and patch merging, final norm, classifier."""

    def __init__(self, arrays: Dict[str, np.ndarray], shape: Any, dtype: str, settings: Mapping[str, Any]):
        group_size, zero_point = settings["group_size"], settings["zero_point"]
        self.shape = shape
        self.patch = _core.Linear(arrays["swin.patch"], arrays["swin.patch.bias"], None, dtype, group_size, zero_point)
        self.norm = (arrays["swin.norm"], arrays["swin.norm.bias"])
        self.positions = arrays.get("swin.positions")
        self.interpolated: Dict[Tuple[int, int], np.ndarray] = {}
        self.stages: List[Tuple[List[_Block], Optional[Tuple[np.ndarray, np.ndarray, Any]]]] = []
        ws = shape.window_size
        self.scratch = _core.SwinScratch()  # the blocks' scratch, reused across blocks and calls
        for stage, depth in enumerate(shape.depths):
            blocks = [_Block(arrays, f"s{stage}.b{block}.", shape.num_heads[stage], ws, ws // 2 if block % 2 else 0,
                             shape.eps, shape.activation, dtype, group_size, zero_point, self.scratch)
                      for block in range(depth)]
            merge = None
            if stage < len(shape.depths) - 1:
                merge = (arrays[f"s{stage}.merge_norm"], arrays[f"s{stage}.merge_norm.bias"],
                         _core.Linear(arrays[f"s{stage}.merge"], None, None, dtype, group_size, zero_point))
            self.stages.append((blocks, merge))
        self.final_norm = (arrays["final_norm"], arrays["final_norm.bias"])
        self.classifier = None
        if "head.classifier" in arrays:
            self.classifier = _core.Linear(arrays["head.classifier"], arrays["head.classifier.bias"], None,
                                           settings["lm_head"], group_size, zero_point)

    @property
    def hidden_size(self) -> int:
        return int(self.shape.num_features)

    def embeddings(self, x: np.ndarray, positions: Optional[np.ndarray], threads: int) -> Tuple[np.ndarray, int, int]:
        """Patch embeddings [B · rows · cols, embed_dim] after the embeddings norm (and positions)."""
        B, C, H, W = x.shape
        ph, pw = self.shape.patch_size
        rows, cols = -(-H // ph), -(-W // pw)
        if (rows * ph, cols * pw) != (H, W):  # transformers' maybe_pad: zeros on the right and bottom
            padded = np.zeros((B, C, rows * ph, cols * pw), dtype=np.float32)
            padded[:, :, :H, :W] = x
            x = padded
        patches = x.reshape(B, C, rows, ph, cols, pw).transpose(0, 2, 4, 1, 3, 5).reshape(B * rows * cols, C * ph * pw)
        embedded = self.patch(np.ascontiguousarray(patches), None, threads)
        # nn.LayerNorm's default eps, as transformers' embeddings norm
        embedded = _core.layer_norm(embedded, self.norm[0], self.norm[1], 1e-5, num_threads=threads)
        if positions is not None:
            embedded = (embedded.reshape(B, rows * cols, -1) + positions).reshape(B * rows * cols, -1)
        return embedded, rows, cols

    def forward(self, x: np.ndarray, positions: Optional[np.ndarray], threads: int) -> np.ndarray:
        batch = x.shape[0]
        hidden, height, width = self.embeddings(x, positions, threads)
        for blocks, merge in self.stages:
            for block in blocks:
                hidden = block(hidden, batch, height, width, threads)
            if merge is not None:
                hidden, height, width = _merge(hidden, batch, height, width, *merge, threads)
        out = _core.layer_norm(hidden, self.final_norm[0], self.final_norm[1], self.shape.eps, num_threads=threads)
        return out.reshape(batch, height * width, -1)


def _merge(x: np.ndarray, batch: int, height: int, width: int, weight: np.ndarray, bias: np.ndarray,
           reduction: Any, threads: int) -> Tuple[np.ndarray, int, int]:
    """transformers' SwinPatchMerging: [B · H · W, C] -> [B · ceil(H/2) · ceil(W/2), 2C]. The 2x2 gather
    (odd sizes zero-padded) and the LayerNorm (nn.LayerNorm(4 · dim): default eps) in one C++ pass."""
    merged = _core.swin_patch_merge(x, batch, height, width, weight, bias, 1e-5, num_threads=threads)
    return reduction(merged, None, threads), (height + 1) // 2, (width + 1) // 2


class SwinImageEncoder(ImageEncoder):
    """A Swin image model (module docstring), the ``ImageEncoder`` API: ``enc(pixel_values,
    interpolate_pos_encoding=False, return_pooler=False)`` returns transformers' last_hidden_state
    float32 [B, tokens, C_last] (tokens: the last stage's grid, row-major), with ``return_pooler``
    also pooler_output [B, C_last] (the mean over the tokens); ``pooler_output(...)``;
    ``embed(images, pooling="mean", normalize=False)``. Inputs: pixel_values or images, as
    ``ImageEncoder``'s. Any image size works unless the checkpoint has absolute position embeddings
    (use_absolute_embeddings): then the checkpoint's patch count, or ``interpolate_pos_encoding``."""

    #: What ``embed`` pools by default (and ``cpuformer embed --images``): Swin has no CLS token.
    default_pooling = "mean"

    def _open_vision(self, path: Union[PathLike, ModelDir], dtype: Optional[str], num_threads: Optional[int],
                     quantization: Optional[Mapping[str, Any]]) -> None:
        model_dir = self._open_dir(path, dtype, num_threads)
        try:
            arch, name, settings = self._read_config(model_dir, dtype, quantization)
            if not getattr(arch, "hierarchical", False):
                raise ValueError(f"{name} is not a hierarchical (Swin) image model; open it with cpuformer.load")
            if self._stored_dtype is not None:
                raise NotImplementedError(f"{model_dir.path}: a directory converted by `cpuformer convert` "
                                          f"({self._stored_dtype}) cannot be opened as a {arch.title} model; open "
                                          "the original checkpoint with dtype=")
            shape = arch.swin(model_dir.config, name)  # type: ignore[attr-defined]
            if self._classifier and not shape.heads:
                raise ValueError(f"{model_dir.path}: {name} has no classification head; open it with "
                                 "cpuformer.ImageEncoder (or cpuformer.load)")
            self.vision = shape
            declared = Head("image_classification", (), dict(shape.tensors), dict(shape.shapes), shape.labels)
            checkpoint = Checkpoint(model_dir, arch, self.hparams, None, declared, settings)
            wanted = shape.tensors if self._classifier else shape.body_tensors
            arrays, _ = checkpoint.read(wanted, shape.shapes)
            arrays = {key: np.array(value, dtype=np.float32) for key, value in arrays.items()}  # own copies
            self._model = _Swin(arrays, shape, self.dtype, settings)
        finally:
            model_dir.close()

    # ---- properties ------------------------------------------------------------------------

    @property
    def hidden_size(self) -> int:
        """The last stage's width (embed_dim · 2^(stages - 1))."""
        return int(self._live().hidden_size)

    @property
    def has_pooler(self) -> bool:
        """Always: Swin's pooler is the mean over the tokens (no weights)."""
        self._live()
        return True

    def _shape_text(self) -> str:
        s = self.vision
        h, w = s.image_size
        ph, pw = s.patch_size
        return (f"depths={list(s.depths)}, embed_dim={s.embed_dim}, heads={list(s.num_heads)}, "
                f"window={s.window_size}, image={h}x{w}, patch={ph}x{pw}")

    # ---- inputs ----------------------------------------------------------------------------

    def _pixel_values(self, pixel_values: Any, interpolate: bool) -> np.ndarray:
        """Checked float32 [B, C, H, W] (ValueError / TypeError naming what is wrong)."""
        check_pixel_array(pixel_values, self.num_channels, interpolate)
        if not np.isfinite(pixel_values).all():
            raise ValueError("pixel_values contain NaN or infinite values")
        return np.ascontiguousarray(pixel_values)

    def _position_table(self, height: int, width: int, interpolate: bool) -> Optional[np.ndarray]:
        """The absolute position embeddings [patches, embed_dim] for an image of height x width, or
        None (use_absolute_embeddings false). transformers' rules: without interpolation the patch
        count must be the table's; with it, the table itself when the patch count is the table's and
        the image is square, else the square table resized bicubically to (H // ph, W // pw)."""
        model, s = self._live(), self.vision
        table = model.positions
        if table is None:
            return None
        (ph, pw), (h, w) = s.patch_size, s.image_size
        rows, cols = -(-height // ph), -(-width // pw)
        if rows * cols == table.shape[0] and (not interpolate or height == width):
            return table
        if not interpolate:
            raise ValueError(f"pixel_values are {height}x{width} (height x width) but the model's image size is "
                             f"{h}x{w} and it has absolute position embeddings; resize the images, or pass "
                             "interpolate_pos_encoding=True to interpolate the position embeddings")
        if height % ph or width % pw:
            raise ValueError(f"interpolate_pos_encoding needs an image size that is a multiple of the patch size "
                             f"{ph}x{pw}, got {height}x{width} (transformers cannot interpolate it either)")
        key = (rows, cols)
        if key not in model.interpolated:
            side = int(round(table.shape[0] ** 0.5))
            if side * side != table.shape[0]:
                raise ValueError(f"interpolate_pos_encoding needs a square grid of position embeddings; this "
                                 f"checkpoint's is {s.grid[0]}x{s.grid[1]} (image_size {list(s.image_size)})")
            grid = table.reshape(side, side, -1)
            model.interpolated[key] = interpolate_positions(grid, rows, cols).reshape(rows * cols, -1)
        return model.interpolated[key]

    def embeddings(self, pixel_values: Any, interpolate_pos_encoding: bool = False) -> np.ndarray:
        """The patch embeddings [B, patches, embed_dim] after the embeddings norm and positions
        (transformers' ``embeddings`` module output)."""
        model = self._live()
        x = self._pixel_values(self._preprocess(pixel_values), interpolate_pos_encoding)
        positions = self._position_table(x.shape[2], x.shape[3], interpolate_pos_encoding)
        embedded, rows, cols = model.embeddings(x, positions, self.num_threads)
        return embedded.reshape(x.shape[0], rows * cols, -1)

    # ---- forward ---------------------------------------------------------------------------

    def __call__(self, pixel_values: Any, interpolate_pos_encoding: bool = False,
                 return_pooler: bool = False) -> Any:
        """last_hidden_state [B, tokens, C_last]; with return_pooler, (last_hidden_state, pooler_output).
        ``pixel_values``: pixel_values or images (``ImageEncoder``)."""
        if not isinstance(return_pooler, bool):
            raise TypeError(f"return_pooler must be True or False, got {return_pooler!r}")
        model = self._live()
        x = self._pixel_values(self._preprocess(pixel_values), interpolate_pos_encoding)
        positions = self._position_table(x.shape[2], x.shape[3], interpolate_pos_encoding)
        hidden = model.forward(x, positions, self.num_threads)
        if return_pooler:
            return hidden, hidden.mean(axis=1, dtype=np.float32)
        return hidden

    forward = __call__

    def pooler_output(self, pixel_values: Any, interpolate_pos_encoding: bool = False) -> np.ndarray:
        """transformers' pooler_output [B, C_last]: the mean of last_hidden_state over the tokens."""
        return self(pixel_values, interpolate_pos_encoding, return_pooler=True)[1]

    def embed(self, images: Any, pooling: Optional[str] = None, normalize: bool = False, batch_size: int = 32,
              interpolate_pos_encoding: bool = False) -> np.ndarray:
        """Image embeddings float32 [N, C_last], in input order: pooler_output ("mean", the default,
        and "pooler" are the same vectors; there is no CLS token). ``normalize``: L2-normalize each
        vector. ``images``: pixel_values or images, ``batch_size`` at a time."""
        pooling = self.default_pooling if pooling is None else pooling
        if pooling not in ("mean", "pooler"):
            raise ValueError(f"pooling must be 'mean' or 'pooler' for {self._arch.title} models (they have no CLS "
                             f"token), got {pooling!r}")
        if not isinstance(normalize, bool):
            raise TypeError(f"normalize must be True or False, got {normalize!r}")
        batch_size = check_integer("batch_size", batch_size, 1)
        self._live()
        parts = [self.pooler_output(self._preprocess(batch, offset), interpolate_pos_encoding)
                 for offset, batch in _batches(images, batch_size)]
        out = np.concatenate(parts)
        if normalize:
            out = out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), np.float32(1e-12))
        return out.astype(np.float32, copy=False)


class SwinImageClassifier(SwinImageEncoder, ImageClassifier):
    """A Swin classification checkpoint: ``logits(pixel_values)`` (the classifier on pooler_output,
    at the ``quantization["lm_head"]`` dtype) and ``classify(images, top_k=5)``, besides everything
    ``SwinImageEncoder`` has."""

    def logits(self, pixel_values: Any, interpolate_pos_encoding: bool = False) -> np.ndarray:
        """transformers' ``logits`` [B, num_labels]."""
        pooled = self.pooler_output(pixel_values, interpolate_pos_encoding)
        classifier = self._live().classifier
        assert classifier is not None
        return classifier(np.ascontiguousarray(pooled), None, self.num_threads)


def open_vision_model(path: Union[PathLike, ModelDir], dtype: Optional[str] = None, num_threads: Optional[int] = None,
                      quantization: Optional[Mapping[str, Any]] = None) -> ImageEncoder:
    """``cpuformer.load`` for the "vision" kind: the Swin classes for a hierarchical family, else
    ``open_image_model`` (ViT, DeiT)."""
    model_dir = path if isinstance(path, ModelDir) else ModelDir(path)
    try:
        arch, name = find(model_dir.config)
    except BaseException:
        model_dir.close()
        raise
    if not getattr(arch, "hierarchical", False):
        return open_image_model(model_dir, dtype=dtype, num_threads=num_threads, quantization=quantization)
    cls = SwinImageClassifier if name in getattr(arch, "classifiers", {}) else SwinImageEncoder
    return cls(model_dir, dtype=dtype, num_threads=num_threads, quantization=quantization)


__all__ = ["SwinImageClassifier", "SwinImageEncoder", "open_vision_model", "relative_position_index"]
