"""``cpuformer.CLIP``: CLIP checkpoints, text and images embedded into one space; ``CLIPText`` and
``CLIPVision``: one tower alone (transformers' one-tower classes, or a tower of a full checkpoint).

Two C++ encoder graphs (arch/clip.py declares them): the text tower runs on token ids with a
causal mask plus the padding mask; the vision tower runs on embeddings made here (the patch
embedding as one GEMM over the flattened patches, the class embedding, learned positions) through
``forward_embeddings``. The pooled outputs (end-of-text token; class token after
``post_layernorm``) are projected by ``text_projection`` / ``visual_projection``. The transformer
layers and the projections are stored in the model's dtype; the patch embedding, the embedding
tables and the norms stay float32 (docs/vision.md, "CLIP"). Images and pixel values are told
apart by the image models' one rule (``models.vision.is_pixel_values``).
"""

from __future__ import annotations

import os
from typing import Any, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from .. import ops
from .._arguments import check_num_threads
from .._model_dir import ModelDir
from .._tokenizer import Tokenizer, load_tokenizer, read_tokenizer_settings
from ..arch import find, wrong_kind
from ..arch.clip import ROOT_TENSORS, VISION_TENSORS, Clip
from ..arch.spec import Tensor
from ..weights import Checkpoint, check_dtype, graph_format, resolve_dtype
from . import _graph
from ._base import ModelBase, TokenIds
from ._inputs import as_2d
from .vision import _batches, interpolate_positions, read_model_image_config, to_pixel_values

#: float32 pixel values [B, channels, H, W], already preprocessed as the checkpoint's image processor does.
PixelValues = np.ndarray
#: What every method that runs the vision tower takes: pixel values, or images to preprocess (file
#: paths, PIL images, NumPy arrays, a list of them); models.vision.is_pixel_values tells them apart.
Images = Any


def _l2_normalize(x: np.ndarray) -> np.ndarray:
    """Rows divided by their L2 norm, as transformers' CLIP normalizes the embeddings (no epsilon)."""
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32, copy=False)


def _check_batch_size(batch_size: Any) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32, copy=False)


class _ClipModel(ModelBase):
    """What CLIP and its one-tower classes share: opening the directory and building the towers
    ``_towers`` names (each one C++ encoder graph), with their projections when the checkpoint
    class has them (``arch.parts``)."""

    #: The towers the class runs.
    _towers: Tuple[str, ...] = ()

    def __init__(self, path: Union[str, "os.PathLike[str]", ModelDir], dtype: Optional[str] = None,
                 num_threads: Optional[int] = None, quantization: Optional[Mapping[str, Any]] = None):
        self._model = self._text = self._vision = None
        check_dtype(dtype)
        self.num_threads = check_num_threads(num_threads)
        model_dir = path if isinstance(path, ModelDir) else ModelDir(path)
        try:
            self.dtype, stored, settings = resolve_dtype(dtype, model_dir.config, quantization)
            self.quantization = settings
            arch, name = find(model_dir.config)
            if arch.kind != "clip":
                raise wrong_kind(arch.kind, name)
            assert isinstance(arch, Clip)
            parts = arch.parts(name)
            _check_towers(type(self).__name__, self._towers, parts, name)
            self.architecture, self.family, self._arch = name, arch.family, arch
            config = model_dir.config
            arch.check(config)
            self.projection_dim = arch.projection_dim(config)
            #: Per tower this class runs, whether its output is projected (text_projection / visual_projection).
            self._projected = {tower: parts[tower] for tower in self._towers}
            # A converted directory (cpuformer convert) stores the towers' matrices in its dtype and the
            # tensors read here (VISION_TENSORS, ROOT_TENSORS) in float32.
            self._stored_dtype = stored
            form = graph_format(self.dtype, settings)
            if "text" in self._towers:
                #: The text tower's hyperparameters (arch.Hparams).
                self.text_hparams = arch.text.hparams(config)
                self.eos_token_id = arch.eos_token_id(config)
                text = Checkpoint(model_dir, arch.text, self.text_hparams, stored, None, settings)
                self._read_text_extras(text)
                self._text = _graph.build(text, form)
            if "vision" in self._towers:
                #: The vision tower's hyperparameters.
                self.vision_hparams = arch.vision.hparams(config)
                self.num_channels, self.image_size, self.patch_size = arch.vision.geometry(config)
                vision = Checkpoint(model_dir, arch.vision, self.vision_hparams, stored, None, settings)
                self._read_vision_extras(vision)
                self._vision = _graph.build(vision, form)
            #: The first tower's hyperparameters (CLIP: the text tower's).
            self.hparams = self.text_hparams if "text" in self._towers else self.vision_hparams
            self.config = self.hparams.as_dict()
            self._model = self._text if self._text is not None else self._vision
        finally:
            model_dir.close()
        self._model_dir = model_dir
        self._tokenizer: Optional[Tokenizer] = None
        self._image_config: Any = None

    def _projection(self, checkpoint: Checkpoint, key: str, width: int) -> ops.Linear:
        """text_projection / visual_projection (no bias), in the quantization["lm_head"] dtype."""
        arrays, _ = checkpoint.read({key: Tensor(ROOT_TENSORS[key], root=True)}, {key: (self.projection_dim, width)})
        settings = self.quantization
        return ops.Linear(np.array(arrays[key], dtype=np.float32), dtype=settings["lm_head"],
                          group_size=settings["group_size"], zero_point=settings["zero_point"])

    def _read_text_extras(self, checkpoint: Checkpoint) -> None:
        self._text_projection = (self._projection(checkpoint, "text_projection", self.text_hparams.hidden_size)
                                 if self._projected["text"] else None)

    def _read_vision_extras(self, checkpoint: Checkpoint) -> None:
        Hv = self.vision_hparams.hidden_size
        C, p = self.num_channels, self.patch_size
        grid = self.image_size // p
        shapes = {"patch_embedding": (Hv, C, p, p), "class_embedding": (Hv,), "vision_positions": (grid * grid + 1, Hv),
                  "post_layernorm": (Hv,), "post_layernorm.bias": (Hv,)}
        sources = {key: Tensor(name) for key, name in VISION_TENSORS.items()}  # below the tower's prefix
        arrays, _ = checkpoint.read(sources, shapes)
        copy = {key: np.array(value, dtype=np.float32) for key, value in arrays.items()}  # outlive the maps
        # The Conv2d (kernel = stride = patch) as a GEMM: [Hv, C·p·p] over patches flattened (c, y, x).
        self._patch = ops.Linear(copy["patch_embedding"].reshape(Hv, C * p * p))
        self._class_embedding = copy["class_embedding"]
        self._vision_positions = copy["vision_positions"]
        self._post_norm = (copy["post_layernorm"], copy["post_layernorm.bias"])
        self._visual_projection = (self._projection(checkpoint, "visual_projection", Hv)
                                   if self._projected["vision"] else None)
        if "text" in self._towers:
            arrays, _ = checkpoint.read({"logit_scale": Tensor(ROOT_TENSORS["logit_scale"], root=True)},
                                        {"logit_scale": ()})
            #: exp(logit_scale): the temperature of logits_per_image / logits_per_text.
            self.logit_scale = float(np.exp(np.float32(arrays["logit_scale"])))

    @property
    def has_projection(self) -> bool:
        """Whether the outputs are projected (CLIP; the ...WithProjection tower checkpoints)."""
        return all(self._projected.values())

    def close(self) -> None:
        self._text = self._vision = None
        super().close()

    def _live_text(self) -> Any:
        self._live()
        return self._text

    def _live_vision(self) -> Any:
        self._live()
        return self._vision


def _check_towers(cls: str, wanted: Tuple[str, ...], parts: Mapping[str, bool], name: str) -> None:
    """ValueError when checkpoint class ``name`` (holding the towers ``parts``) lacks a tower ``cls`` runs."""
    missing = [tower for tower in wanted if tower not in parts]
    if missing:
        use = "CLIPText" if "text" in parts else "CLIPVision"
        raise ValueError(f"{name} holds CLIP's {next(iter(parts))} tower alone; cpuformer.{cls} needs the "
                         f"{missing[0]} tower; open it with cpuformer.{use} (or cpuformer.load)")


class _TextTower(_ClipModel):
    """The text tower's methods (CLIP, CLIPText)."""

    _text_projection: Optional[ops.Linear]

    # ---- text ----------------------------------------------------------------------------------

    @property
    def tokenizer(self) -> Tokenizer:
        """The model directory's tokenizer (tokenizer.json; cpuformer.Tokenizer); ValueError without one."""
        if self._tokenizer is None:
            path = self._model_dir.tokenizer_path
            if path is None:
                raise ValueError(f"{self._model_dir.path} has no tokenizer.json; pass token ids to "
                                 "get_text_features instead of texts")
            backend = load_tokenizer(path)
            backend.no_padding()  # batches are padded here
            backend.no_truncation()  # a text too long for the position table is an error, not cut
            self._tokenizer = Tokenizer(backend, path, read_tokenizer_settings(self._model_dir.path))
        return self._tokenizer

    @property
    def max_tokens(self) -> int:
        """The longest token sequence the text tower takes (max_position_embeddings)."""
        return self.text_hparams.max_positions

    def _pool_positions(self, ids: np.ndarray) -> np.ndarray:
        """Per row, the position transformers 5.24 pools: the largest id for the legacy
        eos_token_id 2, else the first eos_token_id (position 0 when there is none)."""
        if self.eos_token_id == 2:
            return ids.argmax(axis=-1)
        return (ids == self.eos_token_id).argmax(axis=-1)

    def _text_inputs(self, input_ids: TokenIds, attention_mask: Optional[TokenIds]) -> Tuple[np.ndarray, Any]:
        """(ids, mask or None) as int64 [B, T], checked against the text tower."""
        ids = as_2d(input_ids, "input_ids", vocab_size=self.text_hparams.vocab_size)
        if ids.shape[1] > self.max_tokens:
            raise ValueError(f"input_ids has {ids.shape[1]} tokens per row, more than the text tower's "
                             f"max_position_embeddings ({self.max_tokens})")
        mask = None if attention_mask is None else as_2d(attention_mask, "attention_mask", allow_bool=True)
        return ids, mask

    def text_hidden_states(self, input_ids: TokenIds, attention_mask: Optional[TokenIds] = None) -> np.ndarray:
        """The text tower's last hidden state (after final_layer_norm) [B, T, hidden]."""
        ids, mask = self._text_inputs(input_ids, attention_mask)
        return self._live_text().forward(ids, mask, num_threads=self.num_threads)

    def _text_pooled(self, input_ids: TokenIds, attention_mask: Optional[TokenIds] = None) -> np.ndarray:
        """The hidden state at each row's end of text [B, hidden] (transformers' text pooler_output)."""
        ids, mask = self._text_inputs(input_ids, attention_mask)
        positions = np.ascontiguousarray(self._pool_positions(ids), dtype=np.int64)
        # Only the end-of-text rows are read: the last layer runs for them alone, on the unpadded
        # tokens when there is a mask (docs/encoders.md, "First-token outputs").
        hidden = self._live_text().forward(ids, mask, None, False, self.num_threads, mask is not None, False,
                                           positions)
        return np.ascontiguousarray(hidden[np.arange(len(ids)), positions])

    def get_text_features(self, input_ids: TokenIds, attention_mask: Optional[TokenIds] = None) -> np.ndarray:
        """text_projection(pooled) [B, projection_dim] for token ids [B, T] (padding on the right,
        masked by attention_mask): what transformers' CLIP get_text_features returns as
        pooler_output, and its text tower with projection as text_embeds (not normalized)."""
        if self._text_projection is None:
            raise ValueError(f"{self.architecture} has no text_projection (the text tower without its projection); "
                             "use pooler_output, or open a checkpoint with the projection")
        return self._text_projection(self._text_pooled(input_ids, attention_mask), num_threads=self.num_threads)

    def _text_vectors(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """What embed_texts returns before normalizing: the projected features, or (no projection) the pooled state."""
        return self.get_text_features(ids, mask) if self._text_projection is not None else self._text_pooled(ids, mask)

    def _encode_texts(self, texts: Sequence[str], offset: int = 0):
        """(ids, mask) [len(texts), longest] of texts[offset:...] of the caller's list, padded on the right."""
        for i, text in enumerate(texts, offset):
            if not isinstance(text, str):
                raise TypeError(f"texts[{i}] must be a string, got {type(text).__name__}")
        sequences = self.tokenizer.encode_batch(list(texts))
        for i, ids in enumerate(sequences, offset):
            if len(ids) > self.max_tokens:
                raise ValueError(f"texts[{i}] is {len(ids)} tokens long; the text tower takes at most "
                                 f"{self.max_tokens} (max_position_embeddings)")
            if not ids:
                raise ValueError(f"texts[{i}] has no tokens")
        length = max(len(ids) for ids in sequences)
        pad = self._pad_id()
        ids = np.full((len(sequences), length), pad, dtype=np.int64)
        mask = np.zeros((len(sequences), length), dtype=np.int64)
        for i, row in enumerate(sequences):
            ids[i, :len(row)] = row
            mask[i, :len(row)] = 1
        return ids, mask

    def _pad_id(self) -> int:
        """The tokenizer's pad token (as transformers' tokenizer pads), else the end-of-text token."""
        tokenizer = self.tokenizer
        for name in ("pad_token", "eos_token"):
            token = tokenizer.special_token(name)
            token_id = tokenizer.token_to_id(token) if token is not None else None
            if token_id is not None:
                return token_id
        return self.text_hparams.pad_token_id

    def embed_texts(self, texts: Sequence[str], normalize: bool = True, batch_size: int = 32) -> np.ndarray:
        """Text embeddings [len(texts), projection_dim]: get_text_features of the tokenized texts,
        run ``batch_size`` texts at a time (each batch padded to its longest text; padding does not
        change a text's embedding), L2-normalized unless normalize=False. ValueError for a text
        longer than max_position_embeddings tokens (it is not truncated)."""
        _check_batch_size(batch_size)
        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, (list, tuple)) or not texts:
            raise ValueError("texts must be a non-empty list of strings")
        parts = []
        for start in range(0, len(texts), batch_size):
            ids, mask = self._encode_texts(texts[start:start + batch_size], offset=start)
            parts.append(self._text_vectors(ids, mask))
        features = np.concatenate(parts)
        return _l2_normalize(features) if normalize else features

class _VisionTower(_ClipModel):
    """The vision tower's methods (CLIP, CLIPVision)."""

    _visual_projection: Optional[ops.Linear]

    # ---- images -------------------------------------------------------------------------------

    def _pixels(self, pixel_values: np.ndarray, interpolate: bool = False) -> np.ndarray:
        """Checked pixel values (what to_pixel_values returns: float32 [B, C, H, W])."""
        x = np.ascontiguousarray(pixel_values, dtype=np.float32)
        C, S = self.num_channels, self.image_size
        if not isinstance(interpolate, bool):
            raise TypeError(f"interpolate_pos_encoding must be True or False, got {interpolate!r}")
        if x.ndim != 4 or x.shape[1] != C:
            raise ValueError(f"pixel_values must have shape [batch, {C}, {S}, {S}], got {list(x.shape)}")
        if x.shape[0] == 0:
            raise ValueError("pixel_values holds no image (batch size 0)")
        if not interpolate and (x.shape[2] != S or x.shape[3] != S):
            raise ValueError(f"pixel_values are {x.shape[2]}×{x.shape[3]} images, but the model takes "
                             f"{S}×{S} (vision_config.image_size); resize them, or pass "
                             "interpolate_pos_encoding=True")
        if x.shape[2] < self.patch_size or x.shape[3] < self.patch_size:
            raise ValueError(f"pixel_values are {x.shape[2]}×{x.shape[3]} images, smaller than one patch "
                             f"({self.patch_size}×{self.patch_size})")
        if not np.isfinite(x).all():
            raise ValueError("pixel_values holds NaN or infinite values")
        return x

    def _position_table(self, height: int, width: int) -> np.ndarray:
        """[1 + patches, hidden]: transformers' CLIPVisionEmbeddings.interpolate_pos_encoding (the
        table itself for its own patch count on a square image, else the grid resized bicubically)."""
        table = self._vision_positions
        rows, cols = height // self.patch_size, width // self.patch_size
        positions = table.shape[0] - 1
        if rows * cols == positions and height == width:
            return table
        side = int(positions ** 0.5)
        grid = table[1:].reshape(side, side, -1)
        resized = interpolate_positions(grid, rows, cols).reshape(rows * cols, -1)
        return np.concatenate([table[:1], resized])

    def _image_embeddings(self, x: np.ndarray) -> np.ndarray:
        """[B, 1 + patches, hidden]: class embedding, then the patches (Conv2d as a GEMM), plus positions."""
        B, C, H, W = x.shape
        p = self.patch_size
        rows, cols = H // p, W // p
        Hv = self.vision_hparams.hidden_size
        # Conv2d with stride = kernel ignores the rows and columns past the last whole patch.
        patches = x[:, :, :rows * p, :cols * p].reshape(B, C, rows, p, cols, p).transpose(0, 2, 4, 1, 3, 5)
        patches = np.ascontiguousarray(patches).reshape(B * rows * cols, C * p * p)
        out = np.empty((B, 1 + rows * cols, Hv), dtype=np.float32)
        out[:, 0] = self._class_embedding
        out[:, 1:] = self._patch(patches, num_threads=self.num_threads).reshape(B, rows * cols, Hv)
        out += self._position_table(H, W)
        return out

    def image_hidden_states(self, pixel_values: PixelValues, interpolate_pos_encoding: bool = False) -> np.ndarray:
        """The vision tower's last hidden state [B, 1 + patches, hidden] (before post_layernorm, as
        transformers' last_hidden_state). interpolate_pos_encoding: images of another size than
        image_size, the position embeddings resized bicubically as transformers does."""
        return self._image_hidden(pixel_values, interpolate_pos_encoding)

    def _image_hidden(self, pixel_values: PixelValues, interpolate_pos_encoding: bool,
                      first_only: bool = False) -> np.ndarray:
        """image_hidden_states; first_only: row 0 (the class token) alone, the other rows zero."""
        x = self._pixels(self._as_pixels(pixel_values), interpolate_pos_encoding)
        vision = self._live_vision()
        return vision.forward_embeddings(self._image_embeddings(x), None, False, self.num_threads, False, first_only)

    def _image_pooled(self, pixel_values: PixelValues, interpolate_pos_encoding: bool = False) -> np.ndarray:
        """post_layernorm(class token) [B, hidden]: transformers' vision pooler_output."""
        hidden = self._image_hidden(pixel_values, interpolate_pos_encoding, first_only=True)
        weight, bias = self._post_norm
        return ops.layer_norm(np.ascontiguousarray(hidden[:, 0]), weight, bias, self.vision_hparams.norm_eps,
                              num_threads=self.num_threads)

    def get_image_features(self, pixel_values: PixelValues, interpolate_pos_encoding: bool = False) -> np.ndarray:
        """visual_projection(post_layernorm(class token)) [B, projection_dim] for preprocessed
        float32 pixel values [B, channels, image_size, image_size] (any size of at least one patch
        with interpolate_pos_encoding): what transformers' CLIP get_image_features returns as
        pooler_output, and its vision tower with projection as image_embeds (not normalized)."""
        if self._visual_projection is None:
            raise ValueError(f"{self.architecture} has no visual_projection (the vision tower without its "
                             "projection); use pooler_output, or open a checkpoint with the projection")
        return self._visual_projection(self._image_pooled(pixel_values, interpolate_pos_encoding),
                                       num_threads=self.num_threads)

    @property
    def image_config(self) -> Any:
        """The checkpoint's image preprocessing (preprocessor_config.json, read on first use;
        ``_images.ImageConfig``); ValueError naming the file when it is missing or wrong."""
        if self._image_config is None:
            self._image_config = read_model_image_config(self._model_dir.path, type(self).__name__,
                                                         self.num_channels, self._arch.image_processor)
        return self._image_config

    def preprocess(self, images: Any) -> np.ndarray:
        """Images as the checkpoint's image processor prepares them: file paths, PIL images or NumPy
        arrays (uint8 in [0, 255] or float in [0, 1]; HW, HWC, CHW or a 4-D batch), one or a list,
        -> float32 pixel values [B, 3, H, W] (docs/vision.md, "Images in"); pixel_values are
        returned as they are (the rule below)."""
        self._live()
        return self._as_pixels(images)

    def _as_pixels(self, images: Any, offset: Optional[int] = None) -> np.ndarray:
        """The image models' one rule (models.vision.is_pixel_values): a float32 4-D array with
        num_channels entries in axis 1 is pixel_values, used as given; everything else is images,
        preprocessed as preprocessor_config.json says."""
        return to_pixel_values(images, self.num_channels, lambda: self.image_config, offset)

    def embed_images(self, images: Images, normalize: bool = True, batch_size: int = 32,
                     interpolate_pos_encoding: bool = False) -> np.ndarray:
        """Image embeddings [B, projection_dim]: get_image_features (a tower without projection: its
        pooler output), ``batch_size`` images at a time (a list is preprocessed batch by batch),
        L2-normalized unless normalize=False. images: float32 pixel values [B, C, H, W] (already
        preprocessed), or images (file paths, PIL images, NumPy arrays, a list of them) preprocessed
        as preprocessor_config.json says; the rule is ``models.vision.is_pixel_values``."""
        _check_batch_size(batch_size)
        self._live()
        vectors = self.get_image_features if self._visual_projection is not None else self._image_pooled
        features = np.concatenate([vectors(self._as_pixels(batch, offset), interpolate_pos_encoding)
                                   for offset, batch in _batches(images, batch_size)])
        return _l2_normalize(features) if normalize else features


class CLIP(_TextTower, _VisionTower):
    """A CLIP checkpoint: ``get_text_features`` / ``get_image_features`` as transformers names
    and computes them, ``embed_texts`` / ``embed_images`` (optionally L2-normalized) and
    ``scores`` (zero-shot probabilities, softmax over the texts of transformers' logits_per_image).

    dtype: storage of both towers' projections and of text_projection / visual_projection
    ("float32", "float16", "bfloat16", "int8", "int4"; docs/precision.md); quantization: as for
    the other models (the projections follow its ``lm_head`` dtype).
    """

    _towers = ("text", "vision")

    def _shape_text(self) -> str:
        t, v = self.text_hparams, self.vision_hparams
        return (f"text: layers={t.num_layers}, hidden={t.hidden_size}; vision: layers={v.num_layers}, "
                f"hidden={v.hidden_size}, image={self.image_size}, patch={self.patch_size}; "
                f"projection={self.projection_dim}")

    def logits_per_image(self, images: Images, texts: Union[Sequence[str], TokenIds],
                         attention_mask: Optional[TokenIds] = None) -> np.ndarray:
        """exp(logit_scale) · cosine(image, text) [images, texts], transformers' logits_per_image.
        images: as embed_images takes them; texts: strings (tokenized) or token ids [N, T] with
        attention_mask."""
        image_embeds = self.embed_images(images)
        if isinstance(texts, str) or (isinstance(texts, (list, tuple)) and texts and isinstance(texts[0], str)):
            text_embeds = self.embed_texts(texts)  # type: ignore[arg-type]
        else:
            text_embeds = _l2_normalize(self.get_text_features(texts, attention_mask))
        return (np.float32(self.logit_scale) * (image_embeds @ text_embeds.T)).astype(np.float32)

    def scores(self, images: Images, texts: Union[Sequence[str], TokenIds],
               attention_mask: Optional[TokenIds] = None) -> np.ndarray:
        """Zero-shot probabilities [images, texts]: softmax over the texts of logits_per_image."""
        return _softmax(self.logits_per_image(images, texts, attention_mask))

    def classify(self, images: Images, labels: Sequence[str], top_k: int = 5, hypothesis_template: str = "{}",
                 batch_size: int = 32) -> List[List[tuple]]:
        """Zero-shot labels: per image, the top_k (label, probability) pairs, most likely first:
        the softmax over the labels of exp(logit_scale) · cosine(image, text) with each text
        ``hypothesis_template.format(label)`` (default "{}": the label itself; transformers'
        zero-shot-image-classification pipeline, and ``cpuformer classify``, use "This is a photo
        of {}."). The labels are embedded once, the images ``batch_size`` at a time. top_k is capped
        at the number of labels."""
        hypotheses = self._hypotheses(labels, hypothesis_template)
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"top_k must be an integer >= 1, got {top_k!r}")
        _check_batch_size(batch_size)
        return self._zero_shot(images, list(labels), self.embed_texts(hypotheses, batch_size=batch_size), top_k,
                               batch_size)

    @staticmethod
    def _hypotheses(labels: Sequence[str], template: str) -> List[str]:
        """The texts of the labels: ``template.format(label)``; ValueError / TypeError for bad labels or template."""
        if isinstance(labels, str) or not isinstance(labels, (list, tuple)) or not labels:
            raise ValueError("labels must be a non-empty list of strings")
        for i, label in enumerate(labels):
            if not isinstance(label, str):
                raise TypeError(f"labels[{i}] must be a string, got {type(label).__name__}")
        if not isinstance(template, str):
            raise TypeError(f"hypothesis_template must be a string, got {type(template).__name__}")
        if "{}" not in template:
            raise ValueError(f"hypothesis_template must contain {{}} (where each label goes), got {template!r}")
        try:
            return [template.format(label) for label in labels]
        except (IndexError, KeyError, ValueError) as error:
            raise ValueError(f"hypothesis_template {template!r}: only one {{}} placeholder is allowed, and literal "
                             f"braces are written {{{{ and }}}} ({type(error).__name__}: {error})") from None

    def _zero_shot(self, images: Images, labels: List[str], text_embeds: np.ndarray, top_k: int,
                   batch_size: int) -> List[List[tuple]]:
        """classify() with the labels' normalized text embeddings already computed."""
        out: List[List[tuple]] = []
        for image_embeds in self._image_batches(images, batch_size):
            probs = _softmax(np.float32(self.logit_scale) * (image_embeds @ text_embeds.T))
            order = np.argsort(-probs, axis=-1, kind="stable")[:, :top_k]
            out.extend([(labels[j], float(row[j])) for j in idx] for row, idx in zip(probs, order))
        return out

    def _image_batches(self, images: Images, batch_size: int):
        """Normalized image embeddings of ``images``, ``batch_size`` at a time (a list is preprocessed per batch)."""
        for offset, batch in _batches(images, batch_size):
            yield self.embed_images(self._as_pixels(batch, offset), batch_size=batch_size)


class CLIPText(_TextTower):
    """CLIP's text tower alone: a text-only checkpoint (transformers' text model class, or the one
    with the projection, whose ``text_embeds`` ``get_text_features`` returns), or the text tower of a
    full CLIP checkpoint (with its projection). ``last_hidden_state`` / ``text_hidden_states``,
    ``pooler_output`` (the end-of-text token's state), ``get_text_features`` / ``text_embeds``
    (projected), ``embed_texts`` (the projected features when there is a projection, else the
    pooler output; L2-normalized by default)."""

    _towers = ("text",)

    def _shape_text(self) -> str:
        t = self.text_hparams
        return (f"layers={t.num_layers}, hidden={t.hidden_size}, heads={t.num_heads}"
                + (f", projection={self.projection_dim}" if self.has_projection else ""))

    def last_hidden_state(self, input_ids: TokenIds, attention_mask: Optional[TokenIds] = None) -> np.ndarray:
        """transformers' last_hidden_state [B, T, hidden] (after final_layer_norm)."""
        return self.text_hidden_states(input_ids, attention_mask)

    __call__ = last_hidden_state

    def pooler_output(self, input_ids: TokenIds, attention_mask: Optional[TokenIds] = None) -> np.ndarray:
        """transformers' pooler_output [B, hidden]: the last hidden state at each row's end of text."""
        return self._text_pooled(input_ids, attention_mask)

    def text_embeds(self, input_ids: TokenIds, attention_mask: Optional[TokenIds] = None) -> np.ndarray:
        """transformers' text_embeds [B, projection_dim] (checkpoints with the projection; not normalized)."""
        return self.get_text_features(input_ids, attention_mask)


class CLIPVision(_VisionTower):
    """CLIP's vision tower alone: an image-only checkpoint (transformers' vision model class, or the
    one with the projection, whose ``image_embeds`` ``get_image_features`` returns), or the vision tower
    of a full CLIP checkpoint (with its projection). ``last_hidden_state`` /
    ``image_hidden_states``, ``pooler_output`` (post_layernorm of the class token),
    ``get_image_features`` / ``image_embeds`` (projected), ``embed_images`` (the projected
    features when there is a projection, else the pooler output; L2-normalized by default)."""

    _towers = ("vision",)

    def _shape_text(self) -> str:
        v = self.vision_hparams
        return (f"layers={v.num_layers}, hidden={v.hidden_size}, heads={v.num_heads}, image={self.image_size}, "
                f"patch={self.patch_size}" + (f", projection={self.projection_dim}" if self.has_projection else ""))

    def last_hidden_state(self, pixel_values: PixelValues, interpolate_pos_encoding: bool = False) -> np.ndarray:
        """transformers' last_hidden_state [B, 1 + patches, hidden] (before post_layernorm)."""
        return self.image_hidden_states(pixel_values, interpolate_pos_encoding)

    __call__ = last_hidden_state

    def pooler_output(self, pixel_values: PixelValues, interpolate_pos_encoding: bool = False) -> np.ndarray:
        """transformers' pooler_output [B, hidden]: post_layernorm of the class token's state."""
        return self._image_pooled(pixel_values, interpolate_pos_encoding)

    def image_embeds(self, pixel_values: PixelValues, interpolate_pos_encoding: bool = False) -> np.ndarray:
        """transformers' image_embeds [B, projection_dim] (checkpoints with the projection; not normalized)."""
        return self.get_image_features(pixel_values, interpolate_pos_encoding)


def open_clip_model(path: Union[str, "os.PathLike[str]", ModelDir], dtype: Optional[str] = None,
                    num_threads: Optional[int] = None, quantization: Optional[Mapping[str, Any]] = None) -> _ClipModel:
    """``cpuformer.load`` for the "clip" kind: CLIP for a checkpoint with both towers, CLIPText or
    CLIPVision for one tower."""
    model_dir = path if isinstance(path, ModelDir) else ModelDir(path)
    try:
        arch, name = find(model_dir.config)
        if arch.kind != "clip":
            raise wrong_kind(arch.kind, name)
        assert isinstance(arch, Clip)
        parts = arch.parts(name)
    except BaseException:
        model_dir.close()
        raise
    cls = CLIP if len(parts) == 2 else CLIPText if "text" in parts else CLIPVision
    return cls(model_dir, dtype=dtype, num_threads=num_threads, quantization=quantization)


__all__ = ["CLIP", "CLIPText", "CLIPVision", "open_clip_model"]
