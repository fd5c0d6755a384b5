"""Swin Transformer: hierarchical vision transformers with shifted-window attention (model kind "vision").

Swin's stages have different widths (``embed_dim · 2^s``) and head counts, so it does not fit the
uniform C++ encoder graph: models/swin.py runs its stage loop in Python and each block and patch
merging as one C++ call (_core.SwinBlock, _core.swin_patch_merge). This module
declares the mathematics' parameters (``SwinShape``) and every checkpoint tensor under a canonical
name (``swin(config, architecture)``), so that the registry's checkpoint reader accounts for them
(unknown tensors refused, missing ones named) as for every other family.

Canonical names: ``swin.patch`` [embed_dim, channels · ph · pw] (the patch Conv2d flattened in
(channel, row, column) order) and ``.bias``; ``swin.norm`` (+ ``.bias``, the embeddings LayerNorm);
``swin.positions`` [patches, embed_dim] (use_absolute_embeddings only); per block ``s{S}.b{B}.``
``norm1``, ``q``, ``k``, ``v`` (biases when qkv_bias), ``bias_table`` [(2·ws - 1)², heads], ``o``,
``norm2``, ``up``, ``down`` (each Linear with ``.bias``); per stage but the last ``s{S}.merge_norm``
(+ ``.bias``) and ``s{S}.merge`` (no bias); ``final_norm`` (+ ``.bias``); ``head.classifier``.

Buffers: ``relative_position_index`` is fully determined by the window size; transformers 5
recomputes it and ignores a stored one, and so does cpuformer (models/swin.py computes it). The
Hparams are an encoder's (of the last stage) so that the generic parts (repr, ``config``) work;
the stack list is empty (no C++ graph).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .._model_dir import config_float, config_int
from .heads import labels
from .spec import Arch, Hparams, Source, Tensor, mapped, not_supported
from .vit import _ACTIVATIONS, _pair


@dataclasses.dataclass(frozen=True)
class SwinShape:
    """The sizes of one Swin checkpoint (config.json), its tensors and its classifier."""

    image_size: Tuple[int, int]  # (height, width) the position table was trained for
    patch_size: Tuple[int, int]
    num_channels: int
    embed_dim: int
    depths: Tuple[int, ...]
    num_heads: Tuple[int, ...]
    window_size: int
    mlp_ratio: float
    qkv_bias: bool
    activation: str
    eps: float  # config.layer_norm_eps: the blocks' norms and the final norm
    absolute_positions: bool
    tensors: Dict[str, Tensor]
    shapes: Dict[str, Tuple[int, ...]]
    heads: Tuple[str, ...] = ()  # "head.classifier" for a classification checkpoint
    labels: Tuple[str, ...] = ()

    def dim(self, stage: int) -> int:
        return self.embed_dim * 2 ** stage

    def mlp_dim(self, stage: int) -> int:
        return int(self.mlp_ratio * self.dim(stage))

    @property
    def num_features(self) -> int:
        return self.dim(len(self.depths) - 1)

    @property
    def grid(self) -> Tuple[int, int]:
        """Patches per column and per row at the config's image size (transformers' grid_size)."""
        return self.image_size[0] // self.patch_size[0], self.image_size[1] // self.patch_size[1]

    @property
    def body_tensors(self) -> Dict[str, Tensor]:
        return {name: tensor for name, tensor in self.tensors.items() if not name.startswith("head.")}


def _int_list(config: Mapping[str, Any], key: str, default: List[int]) -> Tuple[int, ...]:
    value = config.get(key, default)
    if not isinstance(value, (list, tuple)) or not value or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value):
        raise ValueError(f"config.json: {key!r} must be a non-empty list of integers >= 1, got {value!r}")
    return tuple(value)


def _linear(canonical: str, name: str, fallback: str, rows: int, cols: int, bias: bool = True,
            tensors: Optional[Dict[str, Tensor]] = None, shapes: Optional[Dict[str, Tuple[int, ...]]] = None) -> None:
    assert tensors is not None and shapes is not None
    # transformers 5's module name first, the name it saves (and older versions used) as the fallback:
    # a missing tensor is named by its last fallback, the name checkpoints have.
    tensors[canonical] = Tensor(fallback + ".weight", fallbacks=(name + ".weight",))
    shapes[canonical] = (rows, cols)
    if bias:
        tensors[canonical + ".bias"] = Tensor(fallback + ".bias", fallbacks=(name + ".bias",))
        shapes[canonical + ".bias"] = (rows,)


def _norm(canonical: str, name: str, size: int, tensors: Dict[str, Tensor], shapes: Dict[str, Tuple[int, ...]]) -> None:
    tensors[canonical] = Tensor(name + ".weight")
    tensors[canonical + ".bias"] = Tensor(name + ".bias")
    shapes[canonical] = shapes[canonical + ".bias"] = (size,)


class Swin(Arch):
    kind = "vision"
    family = "swin"
    title = "Swin"
    architectures = ("SwinModel", "SwinForImageClassification")
    model_types = ("swin",)
    prefixes = ("", "swin.")
    # relative_position_index: a buffer transformers < 5 saved; determined by window_size (recomputed).
    # mask_token: masked image modelling only.
    ignored = (r"(swin\.)?encoder\.layers\.\d+\.blocks\.\d+\.attention\.(self|relative_position_bias)"
               r"\.relative_position_index",
               r"(swin\.)?embeddings\.mask_token")
    example = dict(hidden_act="gelu", layer_norm_eps=1e-5, qkv_bias=True, num_channels=3)
    #: The classification classes and their classifier (root) tensor.
    classifiers: Dict[str, str] = {"SwinForImageClassification": "classifier"}
    image_processor = "ViTImageProcessor"
    #: Runs in Python stage by stage (models/swin.py), not on the C++ encoder graph.
    hierarchical = True

    def shape(self, config: Mapping[str, Any]) -> SwinShape:
        """The sizes, checked (ValueError naming the config.json entry that is wrong)."""
        image, patch = _pair(config, "image_size", 224), _pair(config, "patch_size", 4)
        if min(image) < 1 or min(patch) < 1:
            raise ValueError(f"config.json: image_size {list(image)} and patch_size {list(patch)} must be >= 1")
        if image[0] < patch[0] or image[1] < patch[1]:
            raise ValueError(f"config.json: image_size {list(image)} is smaller than patch_size {list(patch)}")
        channels = config_int(config, "num_channels", default=3)
        embed_dim = config_int(config, "embed_dim", default=96)
        depths = _int_list(config, "depths", [2, 2, 6, 2])
        heads = _int_list(config, "num_heads", [3, 6, 12, 24])
        if len(depths) != len(heads):
            raise ValueError(f"config.json: depths {list(depths)} and num_heads {list(heads)} must have one entry "
                             "per stage (the same length)")
        for stage, h in enumerate(heads):
            if (embed_dim * 2 ** stage) % h:
                raise ValueError(f"config.json: stage {stage}'s width {embed_dim * 2 ** stage} (embed_dim · 2^stage) "
                                 f"is not a multiple of its num_heads {h}")
        window = config_int(config, "window_size", default=7)
        if window < 1:
            raise ValueError(f"config.json: window_size must be >= 1, got {window}")
        ratio = config_float(config, "mlp_ratio", default=4.0, minimum=0.0)
        if int(ratio * embed_dim) < 1:
            raise ValueError(f"config.json: mlp_ratio {ratio} gives an empty MLP")
        not_supported(config.get("use_mask_token"), "use_mask_token (masked image modelling) is not supported")
        extra = {"qkv_bias": config.get("qkv_bias", True) is not False,
                 "activation": mapped(config, "hidden_act", "gelu", _ACTIVATIONS),
                 "eps": config_float(config, "layer_norm_eps", default=1e-5, minimum=0.0),
                 "absolute_positions": bool(config.get("use_absolute_embeddings", False))}
        return SwinShape(image, patch, channels, embed_dim, depths, heads, window, ratio, tensors={}, shapes={},
                         **extra)

    def hparams(self, config: Mapping[str, Any]) -> Hparams:
        s = self.shape(config)
        last = len(s.depths) - 1
        rows, cols = s.grid
        return Hparams(
            kind="encoder", vocab_size=1, hidden_size=s.num_features, num_layers=sum(s.depths),
            num_heads=s.num_heads[last], head_dim=s.num_features // s.num_heads[last],
            intermediate_size=s.mlp_dim(last), norm="layer", norm_eps=s.eps, pre_norm=True,
            activation=s.activation, gated_ffn=False, positions="none", max_positions=rows * cols, final_norm=True)

    def stacks(self, hp: Hparams) -> Tuple[Tuple[str, int], ...]:
        return ()  # no C++ graph: every tensor is declared by swin()

    def model_tensors(self, config: Mapping[str, Any], hp: Hparams) -> Dict[str, Source]:
        # The checkpoint reader finds the prefix ("swin." in a classification checkpoint) by this tensor
        # (declared as stored: the reader checks its shape; swin() declares its use as swin.patch).
        s = self.shape(config)
        return {"embed.tokens": Tensor("embeddings.patch_embeddings.projection.weight",
                                       stored_shape=(s.embed_dim, s.num_channels) + tuple(s.patch_size))}

    def stack_tensors(self, config: Mapping[str, Any], hp: Hparams, stack: str) -> Dict[str, Source]:
        return {}

    def layer_tensors(self, hp: Hparams, stack: str, layer: int) -> Dict[str, Tensor]:
        return {}

    def head(self, config: Mapping[str, Any], hp: Hparams, task: str) -> Optional[Any]:
        return None  # the classifier is declared by swin()

    def swin(self, config: Mapping[str, Any], architecture: str) -> SwinShape:
        """Every tensor of checkpoint class ``architecture`` with its canonical shape."""
        s = self.shape(config)
        t: Dict[str, Tensor] = {}
        sh: Dict[str, Tuple[int, ...]] = {}
        (ph, pw), C = s.patch_size, s.num_channels
        t["swin.patch"] = Tensor("embeddings.patch_embeddings.projection.weight", stored_shape=(s.embed_dim, C, ph, pw))
        sh["swin.patch"] = (s.embed_dim, C * ph * pw)
        t["swin.patch.bias"] = Tensor("embeddings.patch_embeddings.projection.bias")
        sh["swin.patch.bias"] = (s.embed_dim,)
        _norm("swin.norm", "embeddings.norm", s.embed_dim, t, sh)
        if s.absolute_positions:
            rows, cols = s.grid
            t["swin.positions"] = Tensor("embeddings.position_embeddings", stored_shape=(1, rows * cols, s.embed_dim))
            sh["swin.positions"] = (rows * cols, s.embed_dim)
        ws = s.window_size
        for stage, depth in enumerate(s.depths):
            dim, mlp, heads = s.dim(stage), s.mlp_dim(stage), s.num_heads[stage]
            for block in range(depth):
                p, c = f"encoder.layers.{stage}.blocks.{block}.", f"s{stage}.b{block}."
                _norm(c + "norm1", p + "layernorm_before", dim, t, sh)
                # The names transformers saves, and (fallbacks) its version 5 module names.
                for short, old, new in (("q", "query", "q_proj"), ("k", "key", "k_proj"), ("v", "value", "v_proj")):
                    _linear(c + short, p + "attention.self." + old, p + "attention." + new, dim, dim, s.qkv_bias,
                            t, sh)
                t[c + "bias_table"] = Tensor(p + "attention.relative_position_bias.relative_position_bias_table",
                                             fallbacks=(p + "attention.self.relative_position_bias_table",))
                sh[c + "bias_table"] = ((2 * ws - 1) ** 2, heads)
                _linear(c + "o", p + "attention.output.dense", p + "attention.o_proj", dim, dim, True, t, sh)
                _norm(c + "norm2", p + "layernorm_after", dim, t, sh)
                _linear(c + "up", p + "intermediate.dense", p + "mlp.fc1", mlp, dim, True, t, sh)
                _linear(c + "down", p + "output.dense", p + "mlp.fc2", dim, mlp, True, t, sh)
            if stage < len(s.depths) - 1:
                p = f"encoder.layers.{stage}.downsample."
                _norm(f"s{stage}.merge_norm", p + "norm", 4 * dim, t, sh)
                t[f"s{stage}.merge"] = Tensor(p + "reduction.weight")
                sh[f"s{stage}.merge"] = (2 * dim, 4 * dim)
        _norm("final_norm", "layernorm", s.num_features, t, sh)
        names: Tuple[str, ...] = ()
        heads_: Tuple[str, ...] = ()
        head = self.classifiers.get(architecture)
        if head is not None:
            names = labels(config)
            t["head.classifier"] = Tensor(f"{head}.weight", root=True, rows_key="id2label")
            t["head.classifier.bias"] = Tensor(f"{head}.bias", root=True, rows_key="id2label")
            sh["head.classifier"] = (len(names), s.num_features)
            sh["head.classifier.bias"] = (len(names),)
            heads_ = ("head.classifier",)
        return dataclasses.replace(s, tensors=t, shapes=sh, heads=heads_, labels=names)


ARCHS = (Swin(),)
