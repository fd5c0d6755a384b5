"""ViT and DeiT: vision transformers, pre-norm encoders over image patches (model kind "vision").

The encoder stack is BERT's with pre-norm layers (``layernorm_before`` / ``layernorm_after``) and
a final ``layernorm``, so it runs on the C++ encoder graph (``EncoderModel.forward_embeddings``:
the stack on given input embeddings). What is new is in front of it and after it, and runs in
``models/vision.py`` on cpuformer's kernels: the patch embedding (a Conv2d with stride = kernel =
patch size, computed as one GEMM over the flattened patches), the CLS token (and DeiT's
distillation token), the learned position embeddings (bicubically interpolated for another image
size, ``interpolate_pos_encoding``) and the classifier heads. ``vision(config, hp, name)``
declares those tensors; the loader accounts for them like every other tensor.

The hyperparameters are an encoder's (``Hparams.kind`` "encoder", positions "none": the positions
are added with the patch embeddings); the family's ``kind`` is "vision", which ``cpuformer.load``
opens as an ``ImageClassifier`` (a classification checkpoint) or an ``ImageEncoder``. The
encoder's one-row token table ``embed.tokens`` is the CLS token (the graph needs a table; it is
not used on the embeddings path).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any, Dict, Mapping, Optional, Tuple

from .._model_dir import config_float, config_int
from .heads import labels
from .spec import Arch, Hparams, Source, Tensor, mapped, not_supported, weight_and_bias

_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu",
                "silu": "silu", "swish": "silu"}


@dataclasses.dataclass(frozen=True)
class Vision:
    """What an image model computes around its encoder stack (models/vision.py runs it).

    Tensors under canonical names: ``vision.patch`` [hidden, channels * ph * pw] (the Conv2d weight
    flattened in (channel, row, column) order) and ``vision.patch.bias``, ``vision.tokens``
    [prefix_tokens, hidden] (CLS, then DeiT's distillation token), ``vision.positions``
    [prefix_tokens + patches, hidden]; and each classifier ``head.<name>`` (with ``.bias``)."""

    image_size: Tuple[int, int]  # (height, width) the position table was trained for
    patch_size: Tuple[int, int]
    num_channels: int
    prefix_tokens: int  # 1: CLS; 2: CLS and distillation (DeiT)
    tensors: Dict[str, Tensor]
    shapes: Dict[str, Tuple[int, ...]]
    #: Classifier heads as (canonical weight, token index); the logits are their average (one head:
    #: itself; DeiT with teacher: the CLS and the distillation head). Empty: no classification head.
    heads: Tuple[Tuple[str, int], ...] = ()
    labels: Tuple[str, ...] = ()
    #: Tensors the layers declare optional that this config requires, and the config's reason.
    required: Tuple[Tensor, ...] = ()
    required_by: str = ""

    @property
    def grid(self) -> Tuple[int, int]:
        """Patches per column and per row of the position table."""
        return self.image_size[0] // self.patch_size[0], self.image_size[1] // self.patch_size[1]

    @property
    def head_tensors(self) -> Dict[str, Tensor]:
        return {name: tensor for name, tensor in self.tensors.items() if name.startswith("head.")}

    @property
    def body_tensors(self) -> Dict[str, Tensor]:
        return {name: tensor for name, tensor in self.tensors.items() if not name.startswith("head.")}


def _pair(config: Mapping[str, Any], key: str, default: int) -> Tuple[int, int]:
    """An int or a [height, width] pair of config.json (transformers accepts either)."""
    value = config.get(key, default)
    if value is None:
        value = default
    if isinstance(value, Iterable) and not isinstance(value, (str, bytes, dict)):
        items = list(value)
        if len(items) != 2:
            raise ValueError(f"config.json: {key!r} must be an integer or a [height, width] pair, got {value!r}")
        pair = {key: items[0]}, {key: items[1]}
        return config_int(pair[0], key), config_int(pair[1], key)
    size = config_int(config, key, default=default)
    return size, size


class ViT(Arch):
    kind = "vision"
    family = "vit"
    title = "ViT"
    architectures = ("ViTModel", "ViTForImageClassification")
    model_types = ("vit",)
    prefixes = ("", "vit.")
    # mask_token: masked image modelling only (a ViTModel saved with use_mask_token).
    ignored = (r"(vit\.)?embeddings\.mask_token",)
    example = dict(hidden_act="gelu", layer_norm_eps=1e-12, qkv_bias=True, num_channels=3)
    #: Learned tokens before the patches: CLS (ViT); CLS and distillation (DeiT).
    token_names: Tuple[str, ...] = ("embeddings.cls_token",)
    #: The classification classes: class name -> ((head tensor, token index), ...).
    classifiers: Dict[str, Tuple[Tuple[str, int], ...]] = {"ViTForImageClassification": (("classifier", 0),)}
    #: The image processor a preprocessor_config.json without a type is read as (transformers goes by model_type).
    image_processor = "ViTImageProcessor"
    #: cpuformer convert writes these checkpoints (weights.convert_checkpoints) and models/vision.py reads them.
    convertible = True

    def hparams(self, config: Mapping[str, Any]) -> Hparams:
        hidden = config_int(config, "hidden_size", default=768)
        heads = config_int(config, "num_attention_heads", default=12)
        if "head_dim" not in config and hidden % heads:
            raise ValueError(f"config.json: hidden size {hidden} is not a multiple of the number of attention heads "
                             f"{heads}")
        head_dim = config_int(config, "head_dim", default=hidden // heads)
        pooler_act = config.get("pooler_act", "tanh")
        not_supported(pooler_act not in (None, "tanh"), f"pooler_act {pooler_act!r} is not supported; only 'tanh' is")
        pooler_size = config.get("pooler_output_size")
        not_supported(pooler_size not in (None, hidden),
                      f"pooler_output_size {pooler_size!r} differs from hidden_size {hidden}; not supported")
        not_supported(config.get("use_mask_token"), "use_mask_token (masked image modelling) is not supported")
        patches = self._grid(config)
        return Hparams(
            kind="encoder", vocab_size=1, hidden_size=hidden,
            num_layers=config_int(config, "num_hidden_layers", default=12), num_heads=heads, head_dim=head_dim,
            intermediate_size=config_int(config, "intermediate_size", default=3072), norm="layer",
            norm_eps=config_float(config, "layer_norm_eps", default=1e-12, minimum=0.0), pre_norm=True,
            activation=mapped(config, "hidden_act", "gelu", _ACTIVATIONS), gated_ffn=False, positions="none",
            max_positions=patches[0] * patches[1] + len(self.token_names), final_norm=True)

    def _grid(self, config: Mapping[str, Any]) -> Tuple[int, int]:
        image, patch = _pair(config, "image_size", 224), _pair(config, "patch_size", 16)
        if image[0] < patch[0] or image[1] < patch[1]:
            raise ValueError(f"config.json: image_size {list(image)} is smaller than patch_size {list(patch)}")
        return image[0] // patch[0], image[1] // patch[1]

    def stacks(self, hp: Hparams) -> Tuple[Tuple[str, int], ...]:
        return (("encoder", hp.num_layers),)

    def model_tensors(self, config: Mapping[str, Any], hp: Hparams) -> Dict[str, Source]:
        H = hp.hidden_size
        # The graph's one-row token table (unused on the embeddings path; it also finds the prefix).
        return {"embed.tokens": Tensor(self.token_names[0], stored_shape=(1, 1, H)),
                **weight_and_bias("pooler", "pooler.dense", optional=True)}

    def stack_tensors(self, config: Mapping[str, Any], hp: Hparams, stack: str) -> Dict[str, Source]:
        return weight_and_bias("final_norm", "layernorm")

    def layer_tensors(self, hp: Hparams, stack: str, layer: int) -> Dict[str, Tensor]:
        p = f"encoder.layer.{layer}."
        qkv_bias = self._qkv_bias
        return {**weight_and_bias("attn.q", p + "attention.attention.query", bias=qkv_bias),
                **weight_and_bias("attn.k", p + "attention.attention.key", bias=qkv_bias),
                **weight_and_bias("attn.v", p + "attention.attention.value", bias=qkv_bias),
                **weight_and_bias("attn.o", p + "attention.output.dense"),
                **weight_and_bias("attn_norm", p + "layernorm_before"),
                **weight_and_bias("ffn.up", p + "intermediate.dense"),
                **weight_and_bias("ffn.down", p + "output.dense"),
                **weight_and_bias("ffn_norm", p + "layernorm_after")}

    # qkv_bias=false checkpoints have no query/key/value biases; layer_tensors has no config, so a
    # missing bias is allowed and a present one used ("optional").
    _qkv_bias = "optional"

    def vision(self, config: Mapping[str, Any], hp: Hparams, architecture: str) -> Vision:
        """The patch embedding, tokens, positions and classifier heads of checkpoint class ``architecture``."""
        H = hp.hidden_size
        image, patch = _pair(config, "image_size", 224), _pair(config, "patch_size", 16)
        channels = config_int(config, "num_channels", default=3)
        k = len(self.token_names)
        rows, cols = self._grid(config)
        positions = k + rows * cols
        tensors: Dict[str, Tensor] = {
            "vision.patch": Tensor("embeddings.patch_embeddings.projection.weight",
                                   stored_shape=(H, channels, patch[0], patch[1])),
            "vision.patch.bias": Tensor("embeddings.patch_embeddings.projection.bias"),
            "vision.positions": Tensor("embeddings.position_embeddings", stored_shape=(1, positions, H))}
        shapes: Dict[str, Tuple[int, ...]] = {"vision.patch": (H, channels * patch[0] * patch[1]),
                                              "vision.patch.bias": (H,), "vision.positions": (positions, H)}
        for i, name in enumerate(self.token_names):
            tensors[f"vision.token{i}"] = Tensor(name, stored_shape=(1, 1, H))
            shapes[f"vision.token{i}"] = (1, H)
        heads = self.classifiers.get(architecture, ())
        names: Tuple[str, ...] = ()
        if heads:
            names = labels(config)
            for head, _ in heads:
                tensors[f"head.{head}"] = Tensor(f"{head}.weight", root=True, rows_key="id2label")
                tensors[f"head.{head}.bias"] = Tensor(f"{head}.bias", root=True, rows_key="id2label")
                shapes[f"head.{head}"] = (len(names), H)
                shapes[f"head.{head}.bias"] = (len(names),)
        required: Tuple[Tensor, ...] = ()
        if config.get("qkv_bias", True) is not False:  # transformers' default: the q, k, v biases exist
            required = tuple(tensor for layer in range(hp.num_layers)
                             for name, tensor in self.layer_tensors(hp, "encoder", layer).items()
                             if name in ("attn.q.bias", "attn.k.bias", "attn.v.bias"))
        return Vision(image, patch, channels, k, tensors, shapes,
                      tuple((f"head.{head}", token) for head, token in heads), names, required,
                      "config.json: qkv_bias is true (its default)")

    def head(self, config: Mapping[str, Any], hp: Hparams, task: str) -> Optional[Any]:
        return None  # the classifier is declared by vision()


class DeiT(ViT):
    family = "deit"
    title = "DeiT"
    architectures = ("DeiTModel", "DeiTForImageClassification", "DeiTForImageClassificationWithTeacher")
    model_types = ("deit",)
    prefixes = ("", "deit.")
    ignored = (r"(deit\.)?embeddings\.mask_token",)
    token_names = ("embeddings.cls_token", "embeddings.distillation_token")
    image_processor = "DeiTImageProcessor"
    # With teacher: the average of the CLS token's head and the distillation token's, as transformers.
    classifiers = {"DeiTForImageClassification": (("classifier", 0),),
                   "DeiTForImageClassificationWithTeacher": (("cls_classifier", 0), ("distillation_classifier", 1))}


ARCHS = (ViT(), DeiT())
