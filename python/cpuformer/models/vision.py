"""``cpuformer.ImageEncoder`` and ``cpuformer.ImageClassifier``: the registry's image models (model
kind "vision": ViT, DeiT; arch/vit.py) on preprocessed pixel values.

The encoder stack is the C++ encoder graph (``EncoderModel.forward_embeddings``). In front of it,
in NumPy and cpuformer's kernels: the patch embedding — the Conv2d with stride = kernel = patch
size is one GEMM: the image [B, C, H, W] is cut into patches reshaped to rows
[B · patches, C · ph · pw] (channel, row, column order, the Conv2d weight's), multiplied by the
flattened weight packed once at load in the model's dtype (``_core.Linear``) — then the CLS (and
distillation) tokens and the position embeddings, bicubically interpolated as transformers does
for another image size (``interpolate_pos_encoding=True``, ``interpolate_positions`` below).
After it, the classifier heads (a Linear on the CLS token; DeiT with teacher: the average of the
CLS and the distillation heads).

Inputs (``images`` below): already preprocessed float32 ``pixel_values`` [batch, channels, height,
width], or images — file paths, PIL images, NumPy arrays (uint8 in [0, 255], float in [0, 1]; HW,
HWC, CHW, NHWC, NCHW), or a list of these — preprocessed as the checkpoint's
``preprocessor_config.json`` says (``cpuformer._images.preprocess``; read at first use). The rule
(``is_pixel_values``, shared with CLIP): a float32 4-D array with ``num_channels`` entries in axis
1 is pixel_values; everything else is images.
"""

from __future__ import annotations

import os
import re
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

import numpy as np

from .. import _core, _images
from .._arguments import check_integer, check_num_threads
from .._model_dir import ModelDir
from ..arch import find, wrong_kind
from ..arch.heads import Head
from ..weights import Checkpoint, check_dtype, graph_format, resolve_dtype
from . import _graph
from ._base import ModelBase

PathLike = Union[str, "os.PathLike[str]"]


def _cubic_weights(t: np.ndarray) -> np.ndarray:
    """PyTorch's bicubic convolution weights (A = -0.75) of the four taps at floor - 1 .. floor + 2
    for fractional offsets t: [len(t), 4]."""
    A = -0.75

    def near(x: np.ndarray) -> np.ndarray:  # |x| <= 1
        return ((A + 2) * x - (A + 3)) * x * x + 1

    def far(x: np.ndarray) -> np.ndarray:  # 1 < |x| < 2
        return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A

    return np.stack([far(t + 1), near(t), near(1 - t), far(2 - t)], axis=1)


def _resize_matrix(size: int, out: int) -> np.ndarray:
    """[out, size]: the rows of torch.nn.functional.interpolate(mode="bicubic", align_corners=False)
    along one axis (source index scale · (i + 0.5) - 0.5 with scale = size / out in float32, as
    PyTorch computes it; taps beyond the border clamped to it)."""
    scale = np.float32(size) / np.float32(out)
    source = scale * (np.arange(out, dtype=np.float32) + np.float32(0.5)) - np.float32(0.5)
    first = np.floor(source)
    weights = _cubic_weights((source - first).astype(np.float64))
    matrix = np.zeros((out, size), dtype=np.float64)
    rows = np.arange(out)
    for tap in range(4):
        index = np.clip(first.astype(np.int64) - 1 + tap, 0, size - 1)
        np.add.at(matrix, (rows, index), weights[:, tap])
    return matrix


def interpolate_positions(grid: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bicubic resize of a position grid [rows, cols, dim] to [height, width, dim], as
    ``torch.nn.functional.interpolate(..., mode="bicubic", align_corners=False)`` (float64 inside,
    float32 out)."""
    rows = _resize_matrix(grid.shape[0], height)
    cols = _resize_matrix(grid.shape[1], width)
    out = np.einsum("ia,jb,abd->ijd", rows, cols, grid.astype(np.float64), optimize=True)
    return out.astype(np.float32)


def check_pixel_array(pixel_values: Any, channels: int, interpolate: bool) -> Tuple[int, int, int, int]:
    """(B, C, H, W) of pixel_values that are a float32 [batch, channels, height, width] array of at
    least one image of at least one pixel; TypeError / ValueError naming what is wrong (every image
    model's common checks: the model checks the size it needs and the values)."""
    if not isinstance(interpolate, bool):
        raise TypeError(f"interpolate_pos_encoding must be True or False, got {interpolate!r}")
    if not isinstance(pixel_values, np.ndarray):
        raise TypeError(f"pixel_values must be a float32 NumPy array [batch, {channels}, height, width], "
                        f"got {type(pixel_values).__name__}")
    if pixel_values.dtype != np.float32:
        raise TypeError(f"pixel_values must be float32 (preprocessed images), got dtype {pixel_values.dtype}")
    if pixel_values.ndim != 4:
        hint = "; add the batch axis (pixel_values[None])" if pixel_values.ndim == 3 else ""
        raise ValueError(f"pixel_values must have 4 dimensions [batch, {channels}, height, width], got "
                         f"shape {list(pixel_values.shape)}{hint}")
    B, C, H, W = pixel_values.shape
    if B == 0 or H == 0 or W == 0:
        raise ValueError(f"pixel_values must hold at least one image of at least one pixel, got shape "
                         f"{list(pixel_values.shape)}")
    if C != channels:
        raise ValueError(f"pixel_values must have {channels} channels (axis 1, channels first: "
                         f"[batch, channels, height, width]), got shape {list(pixel_values.shape)}")
    return B, C, H, W


class ImageEncoder(ModelBase):
    """An image model loaded from a Hugging Face model directory: the registry's vision transformers
    (``cpuformer.arch.supported("vision")``: ViT, DeiT), base models or classification checkpoints
    (whose classifier is then not used; ``ImageClassifier`` runs it).

    ``ImageEncoder(path, dtype=None, num_threads=None, quantization=None)``; dtype "float32",
    "float16", "bfloat16", "int8" or "int4" (docs/precision.md, docs/vision.md).

    ``enc(pixel_values, interpolate_pos_encoding=False, return_pooler=False)`` (also
    ``enc.forward``) returns transformers' ``last_hidden_state`` float32 [B, tokens, hidden]
    (tokens = CLS (+ distillation) + patches); with ``return_pooler``, ``(last_hidden_state,
    pooler_output)`` for checkpoints with a pooler (``has_pooler``); ``enc.pooler_output(...)``
    returns just that; ``enc.embed(images, pooling="cls", normalize=False)`` pooled vectors
    [N, hidden]. ``pixel_values``: float32 [B, num_channels, H, W], already preprocessed; H and
    W must be the checkpoint's ``image_size`` unless ``interpolate_pos_encoding`` (then any size of
    at least one patch; as transformers' Conv2d, the pixels past the last whole patch are not used).
    Or images (file paths, PIL images, NumPy arrays, a list of them), preprocessed with the
    checkpoint's preprocessor_config.json (``image_config``, ``preprocess``): a float32 4-D array
    with num_channels entries in axis 1 is pixel_values, everything else is images.
    """

    #: Whether the class needs a classification checkpoint.
    _classifier = False

    def __init__(self, path: Union[PathLike, ModelDir], dtype: Optional[str] = None,
                 num_threads: Optional[int] = None, quantization: Optional[Mapping[str, Any]] = None):
        self._open_vision(path, dtype, num_threads, quantization)

    def _open_vision(self, path: Union[PathLike, ModelDir], dtype: Optional[str], num_threads: Optional[int],
                     quantization: Optional[Mapping[str, Any]]) -> None:
        """ModelBase._open for image models: the encoder graph, plus the patch embedding, tokens,
        positions (and the classifier heads) packed or copied here; the weights maps are closed
        after, loaded or not."""
        model_dir = self._open_dir(path, dtype, num_threads)
        try:
            arch, name, settings = self._read_config(model_dir, dtype, quantization)
            if getattr(arch, "hierarchical", False):  # Swin: models/swin.py
                raise ValueError(f"{name} ({arch.title}) runs stage by stage; open it with cpuformer.load")
            vision = arch.vision(model_dir.config, self.hparams, name)  # type: ignore[attr-defined]
            if self._classifier and not vision.heads:
                raise ValueError(f"{model_dir.path}: {name} has no classification head; open it with "
                                 "cpuformer.ImageEncoder (or cpuformer.load)")
            self.vision = vision
            # Every vision tensor (the heads too) is declared, so that the loader accounts for them.
            declared = Head("image_classification", (), dict(vision.tensors), dict(vision.shapes), vision.labels)
            # A converted directory (cpuformer convert) stores the layers' matrices in its dtype and the
            # vision tensors in float32 (packed here, as a plain checkpoint's).
            checkpoint = Checkpoint(model_dir, arch, self.hparams, self._stored_dtype, declared, settings)
            for tensor in vision.required:
                if checkpoint.checkpoint_name(tensor) is None:
                    raise ValueError(f"{model_dir.path}: {vision.required_by}, but the checkpoint has no tensor "
                                     f"{checkpoint.prefix + tensor.name!r}")
            wanted = vision.tensors if self._classifier else vision.body_tensors
            arrays, _ = checkpoint.read(wanted, vision.shapes)
            arrays = {key: np.array(value, dtype=np.float32) for key, value in arrays.items()}  # own copies
            self._model = _graph.build(checkpoint, graph_format(self.dtype, settings))
            self._pack(arrays, settings)
        finally:
            model_dir.close()

    def _open_dir(self, path: Union[PathLike, ModelDir], dtype: Optional[str], num_threads: Optional[int]) -> ModelDir:
        """The first step of opening an image model: the arguments checked, the directory opened."""
        check_dtype(dtype)
        self.num_threads = check_num_threads(num_threads)
        model_dir = path if isinstance(path, ModelDir) else ModelDir(path)
        self._model_dir = model_dir
        self._model = None
        return model_dir

    def _read_config(self, model_dir: ModelDir, dtype: Optional[str],
                     quantization: Optional[Mapping[str, Any]]) -> Tuple[Any, str, Dict[str, Any]]:
        """(arch, architecture name, quantization settings) of an image checkpoint, with the dtype,
        family and hyperparameters set on the model; a model of another kind is refused."""
        self.dtype, self._stored_dtype, settings = resolve_dtype(dtype, model_dir.config, quantization)
        self.quantization = settings
        arch, name = find(model_dir.config)
        if arch.kind != "vision":
            raise wrong_kind(arch.kind, name)
        self.architecture, self.family, self._arch = name, arch.family, arch
        self._path = model_dir.path
        self._image_config: Optional[_images.ImageConfig] = None
        self.hparams = arch.hparams(model_dir.config)
        self.config = self.hparams.as_dict()
        return arch, name, settings

    def _pack(self, arrays: Dict[str, np.ndarray], settings: Mapping[str, Any]) -> None:
        v = self.vision
        group_size, zero_point = settings["group_size"], settings["zero_point"]
        self._patch = _core.Linear(arrays["vision.patch"], arrays["vision.patch.bias"], None, self.dtype, group_size,
                                   zero_point)
        self._tokens = np.concatenate([arrays[f"vision.token{i}"] for i in range(v.prefix_tokens)])  # [k, hidden]
        self._positions = arrays["vision.positions"]
        self._interpolated: Dict[Tuple[int, int], np.ndarray] = {}
        self._heads = [(_core.Linear(arrays[name], arrays[name + ".bias"], None, settings["lm_head"], group_size,
                                     zero_point), token) for name, token in v.heads if name in arrays]

    # ---- properties ------------------------------------------------------------------------

    @property
    def hidden_size(self) -> int:
        return self._live().hidden_size

    @property
    def has_pooler(self) -> bool:
        return self._live().has_pooler

    @property
    def image_size(self) -> Tuple[int, int]:
        """(height, width) of the checkpoint's images (config.json image_size)."""
        return self.vision.image_size

    @property
    def patch_size(self) -> Tuple[int, int]:
        return self.vision.patch_size

    @property
    def num_channels(self) -> int:
        return self.vision.num_channels

    def _shape_text(self) -> str:
        hp = self.hparams
        h, w = self.vision.image_size
        ph, pw = self.vision.patch_size
        return (f"layers={hp.num_layers}, hidden={hp.hidden_size}, heads={hp.num_heads}, image={h}x{w}, "
                f"patch={ph}x{pw}")

    # ---- inputs ----------------------------------------------------------------------------

    @property
    def image_config(self) -> _images.ImageConfig:
        """The checkpoint's preprocessing (its preprocessor_config.json, read at first use; a file
        without a type is read as the family's image processor). ValueError without the file."""
        if self._image_config is None:
            self._image_config = read_model_image_config(self._path, type(self).__name__, self.num_channels,
                                                         getattr(self._arch, "image_processor", None))
        return self._image_config

    def _is_pixel_values(self, images: Any) -> bool:
        """The rule of the inputs (is_pixel_values)."""
        return is_pixel_values(images, self.num_channels)

    def _preprocess(self, images: Any, offset: Optional[int] = None) -> np.ndarray:
        """Images (file paths, PIL images, NumPy arrays, a list of them) -> float32 pixel_values as the
        checkpoint's preprocessor_config.json says; pixel_values as they are (to_pixel_values)."""
        return to_pixel_values(images, self.num_channels, lambda: self.image_config, offset)

    def preprocess(self, images: Any) -> np.ndarray:
        """float32 pixel_values [B, channels, H, W] of images as the checkpoint's preprocessor_config.json
        says (pixel_values are returned as they are)."""
        self._live()
        return self._preprocess(images)

    def _pixel_values(self, pixel_values: Any, interpolate: bool) -> np.ndarray:
        """Checked float32 [B, C, H, W] (ValueError / TypeError naming what is wrong)."""
        _, _, H, W = check_pixel_array(pixel_values, self.num_channels, interpolate)
        (h, w), (ph, pw) = self.vision.image_size, self.vision.patch_size
        if not interpolate and (H, W) != (h, w):
            raise ValueError(f"pixel_values are {H}x{W} (height x width) but the model's image size is {h}x{w}; "
                             "resize the images, or pass interpolate_pos_encoding=True to interpolate the position "
                             "embeddings")
        if H < ph or W < pw:
            raise ValueError(f"pixel_values are {H}x{W} (height x width), smaller than one patch ({ph}x{pw})")
        if not np.isfinite(pixel_values).all():
            raise ValueError("pixel_values contain NaN or infinite values")
        return np.ascontiguousarray(pixel_values)

    def _position_table(self, height: int, width: int, interpolate: bool) -> np.ndarray:
        """[k + patches, hidden]: transformers' interpolate_pos_encoding (the table itself when the
        patch count is the table's and the image is square, else the grid resized bicubically)."""
        v = self.vision
        k, table = v.prefix_tokens, self._positions
        rows, cols = height // v.patch_size[0], width // v.patch_size[1]
        if not interpolate:
            return table
        positions = table.shape[0] - k
        if rows * cols == positions and height == width:
            return table
        key = (rows, cols)
        if key not in self._interpolated:
            side = int(positions ** 0.5)
            if side * side != positions:
                raise ValueError(f"interpolate_pos_encoding needs a square grid of position embeddings; this "
                                 f"checkpoint's is {v.grid[0]}x{v.grid[1]} (image_size {list(v.image_size)})")
            grid = table[k:].reshape(side, side, -1)
            resized = interpolate_positions(grid, rows, cols).reshape(rows * cols, -1)
            self._interpolated[key] = np.concatenate([table[:k], resized])
        return self._interpolated[key]

    def embeddings(self, pixel_values: Any, interpolate_pos_encoding: bool = False) -> np.ndarray:
        """The encoder's input embeddings [B, k + patches, hidden]: the patch embeddings after the
        CLS (and distillation) tokens, plus the position embeddings (transformers' ``embeddings``
        module output). ``pixel_values``: pixel_values or images (module docstring)."""
        self._live()
        x = self._pixel_values(self._preprocess(pixel_values), interpolate_pos_encoding)
        B, C, H, W = x.shape
        (ph, pw), k = self.vision.patch_size, self.vision.prefix_tokens
        rows, cols = H // ph, W // pw
        x = x[:, :, :rows * ph, :cols * pw]  # Conv2d with stride = kernel: the partial patches are not used
        patches = x.reshape(B, C, rows, ph, cols, pw).transpose(0, 2, 4, 1, 3, 5).reshape(B * rows * cols, C * ph * pw)
        embedded = self._patch(np.ascontiguousarray(patches), None, self.num_threads).reshape(B, rows * cols, -1)
        out = np.empty((B, k + rows * cols, embedded.shape[2]), dtype=np.float32)
        out[:, :k] = self._tokens
        out[:, k:] = embedded
        out += self._position_table(H, W, interpolate_pos_encoding)
        return out

    # ---- forward ---------------------------------------------------------------------------

    def __call__(self, pixel_values: Any, interpolate_pos_encoding: bool = False,
                 return_pooler: bool = False) -> Any:
        """last_hidden_state [B, tokens, hidden]; with return_pooler, (last_hidden_state, pooler_output).
        ``pixel_values``: pixel_values or images (module docstring)."""
        if not isinstance(return_pooler, bool):
            raise TypeError(f"return_pooler must be True or False, got {return_pooler!r}")
        if return_pooler and not self.has_pooler:
            raise ValueError(f"{self.architecture}: this checkpoint has no pooler (pooler.dense weights); "
                             "return_pooler needs one")
        return self._forward(pixel_values, interpolate_pos_encoding, return_pooler)

    forward = __call__

    def _forward(self, pixel_values: Any, interpolate_pos_encoding: bool, return_pooler: bool = False,
                 first_only: bool = False) -> Any:
        """What __call__ returns; first_only: the caller reads the CLS token only (row 0 of each
        image; the other rows come back zero, the last layer is computed for the CLS token alone)."""
        embeddings = self.embeddings(pixel_values, interpolate_pos_encoding)
        return self._live().forward_embeddings(embeddings, None, return_pooler, self.num_threads, False, first_only)

    def pooler_output(self, pixel_values: np.ndarray, interpolate_pos_encoding: bool = False) -> np.ndarray:
        """transformers' pooler_output [B, hidden]: tanh(dense(last_hidden_state[:, 0]))."""
        return self._forward(pixel_values, interpolate_pos_encoding, return_pooler=True, first_only=True)[1]


    def embed(self, images: Any, pooling: str = "cls", normalize: bool = False, batch_size: int = 32,
              interpolate_pos_encoding: bool = False) -> np.ndarray:
        """Image embeddings float32 [N, hidden], in input order. ``images``: pixel_values or images (a
        list is preprocessed and run ``batch_size`` images at a time). ``pooling``: "cls" the CLS
        token of last_hidden_state (after the final norm), "mean" the mean of the patch tokens (the
        CLS and distillation tokens left out, as timm's average pooling), "pooler" pooler_output
        (checkpoints with a pooler). ``normalize``: L2-normalize each vector."""
        if pooling not in ("cls", "mean", "pooler"):
            raise ValueError(f"pooling must be 'cls', 'mean' or 'pooler', got {pooling!r}")
        if not isinstance(normalize, bool):
            raise TypeError(f"normalize must be True or False, got {normalize!r}")
        batch_size = check_integer("batch_size", batch_size, 1)
        self._live()
        if pooling == "pooler" and not self.has_pooler:
            raise ValueError(f"{self.architecture}: this checkpoint has no pooler (pooler.dense weights); use "
                             "pooling='cls' or 'mean'")
        parts = []
        for offset, batch in _batches(images, batch_size):
            batch = self._preprocess(batch, offset)
            if pooling == "pooler":
                vectors = self._forward(batch, interpolate_pos_encoding, return_pooler=True, first_only=True)[1]
            else:
                hidden = self._forward(batch, interpolate_pos_encoding, first_only=pooling == "cls")
                vectors = hidden[:, 0] if pooling == "cls" else hidden[:, self.vision.prefix_tokens:].mean(axis=1)
            parts.append(np.ascontiguousarray(vectors, dtype=np.float32))
        out = np.concatenate(parts)
        if normalize:
            norms = np.linalg.norm(out, axis=1, keepdims=True)
            out = out / np.maximum(norms, np.float32(1e-12))
        return out.astype(np.float32, copy=False)


def is_pixel_values(images: Any, num_channels: int) -> bool:
    """The one rule that tells already preprocessed pixel_values from images, for every image model
    (ImageEncoder, ImageClassifier, CLIP, CLIPVision): a float32 NumPy array of 4 dimensions whose
    axis 1 has ``num_channels`` entries is pixel_values [batch, channels, height, width]; everything
    else (file paths, PIL images, uint8 arrays, float16 / float64 arrays, float32 arrays of another
    rank or layout, lists) is images, preprocessed with the checkpoint's preprocessor_config.json."""
    return (isinstance(images, np.ndarray) and images.dtype == np.float32 and images.ndim == 4
            and images.shape[1] == num_channels)


def read_model_image_config(path: PathLike, owner: str, num_channels: int,
                            default_type: Optional[str]) -> _images.ImageConfig:
    """The preprocessor_config.json of model directory ``path`` (a file without a type read as
    ``default_type``); ValueError naming ``owner`` (the model class) when the file is missing."""
    file = os.path.join(path, _images.CONFIG_NAME)
    if not os.path.isfile(file):
        raise ValueError(f"{path} has no {_images.CONFIG_NAME}, so {owner} cannot preprocess images; give float32 "
                         f"pixel_values [batch, {num_channels}, height, width], preprocessed as the checkpoint's "
                         "image processor does")
    return _images.read_image_config(file, default_type=default_type)


def to_pixel_values(images: Any, num_channels: int, image_config: Callable[[], _images.ImageConfig],
                    offset: Optional[int] = None) -> np.ndarray:
    """pixel_values as they are (is_pixel_values), images preprocessed with ``image_config()``.
    ``offset``: the first index of this batch in the whole input when it is a part of it
    (``_batches``), so that errors name the image by its index there. A rejected array that has
    the pixel_values layout but another dtype gets a hint that pixel_values must be float32."""
    if is_pixel_values(images, num_channels):
        return images
    try:
        config = image_config()
    except ValueError as error:
        if isinstance(images, np.ndarray):
            got = f"a {images.dtype} array of shape {list(images.shape)}"
        else:
            got = f"{type(images).__name__}"
        raise ValueError(f"{error} (got {got})") from None
    try:
        return _images.preprocess(images, config)
    except (ValueError, TypeError) as error:
        message = _renumber(str(error), offset, images)
        if isinstance(error, ValueError) and isinstance(images, np.ndarray) and images.ndim == 4 \
                and images.shape[1] == num_channels:
            message += f" (pixel_values, already preprocessed, must be float32; got {images.dtype})"
        if message == str(error):
            raise
        raise type(error)(message) from None


def _batches(images: Any, batch_size: int) -> List[Tuple[Optional[int], Any]]:
    """The input in batches of at most batch_size images, with each batch's first index: a list by
    its items, a 4-D array along axis 0; anything else (one image, a small array) is one batch
    (index None: the input itself)."""
    if isinstance(images, (list, tuple)):
        if not images:
            raise ValueError("images: an empty batch")
        return [(i, list(images[i:i + batch_size])) for i in range(0, len(images), batch_size)]
    if isinstance(images, np.ndarray) and images.ndim == 4 and images.shape[0] > batch_size:
        return [(i, images[i:i + batch_size]) for i in range(0, images.shape[0], batch_size)]
    return [(None, images)]


def _renumber(message: str, offset: Optional[int], batch: Any) -> str:
    """An error of cpuformer._images about a batch that starts at ``offset``: "image 3: ..." /
    "image[3]: ..." renumbered to the image's index in the whole input; "image: ..." about a slice
    of a batch array names the slice."""
    if offset is None:
        return message
    if isinstance(batch, np.ndarray) and message.startswith("image: "):
        return f"image[{offset}:{offset + batch.shape[0]}]: " + message[len("image: "):]
    return re.sub(r"^image( |\[)(\d+)", lambda m: f"image{m.group(1)}{int(m.group(2)) + offset}", message)


class ImageClassifier(ImageEncoder):
    """An image classification checkpoint (the "ForImageClassification" classes of the
    registry's vision families): ``logits(pixel_values)`` and ``classify(pixel_values, top_k=5)``;
    everything ``ImageEncoder`` has (hidden states, the pooler when there is one).

    The classifiers run on cpuformer's kernels at the ``quantization["lm_head"]`` dtype (the
    model's dtype, int8 under int4: docs/precision.md)."""

    _classifier = True

    @property
    def labels(self) -> List[str]:
        """The class labels in id order (config.json id2label)."""
        return list(self.vision.labels)

    @property
    def num_labels(self) -> int:
        return len(self.vision.labels)

    def logits(self, pixel_values: Any, interpolate_pos_encoding: bool = False) -> np.ndarray:
        """transformers' ``logits`` [B, num_labels] (DeiT with teacher: the average of the CLS and
        the distillation heads). ``pixel_values``: pixel_values or images (module docstring)."""
        hidden = self._forward(pixel_values, interpolate_pos_encoding,
                               first_only=all(token == 0 for _, token in self._heads))
        out: Optional[np.ndarray] = None
        for linear, token in self._heads:
            logits = linear(np.ascontiguousarray(hidden[:, token]), None, self.num_threads)
            out = logits if out is None else out + logits
        assert out is not None
        if len(self._heads) > 1:
            out = out / np.float32(len(self._heads))
        return out

    def classify(self, images: Any, top_k: int = 5, interpolate_pos_encoding: bool = False, batch_size: int = 32
                 ) -> List[List[Tuple[str, float]]]:
        """Per image, its top_k (label, probability) pairs (softmax of the logits), most likely first
        (ties in label order). ``images``: float32 pixel_values [B, C, H, W], or images (file paths,
        PIL images, NumPy arrays, a list of them) preprocessed as the checkpoint's
        preprocessor_config.json says, ``batch_size`` at a time. top_k is capped at the number of
        labels."""
        top_k = check_integer("top_k", top_k, 1)
        batch_size = check_integer("batch_size", batch_size, 1)
        self._live()
        k = min(top_k, self.num_labels)
        out = []
        for offset, batch in _batches(images, batch_size):
            logits = self.logits(self._preprocess(batch, offset), interpolate_pos_encoding).astype(np.float64)
            logits -= logits.max(axis=1, keepdims=True)
            probabilities = np.exp(logits)
            probabilities /= probabilities.sum(axis=1, keepdims=True)
            for row in probabilities:
                order = np.argsort(-row, kind="stable")[:k]
                out.append([(self.vision.labels[i], float(row[i])) for i in order])
        return out


def open_image_model(path: Union[PathLike, ModelDir], dtype: Optional[str] = None, num_threads: Optional[int] = None,
                     quantization: Optional[Mapping[str, Any]] = None) -> ImageEncoder:
    """``cpuformer.load`` for the "vision" kind: an ImageClassifier for a checkpoint with a
    classification head, else an ImageEncoder."""
    model_dir = path if isinstance(path, ModelDir) else ModelDir(path)
    try:
        arch, name = find(model_dir.config)
    except BaseException:
        model_dir.close()
        raise
    cls = ImageClassifier if name in getattr(arch, "classifiers", {}) else ImageEncoder
    return cls(model_dir, dtype=dtype, num_threads=num_threads, quantization=quantization)


__all__ = ["ImageClassifier", "ImageEncoder", "interpolate_positions", "is_pixel_values", "open_image_model",
           "read_model_image_config", "to_pixel_values"]
