"""CLIP (``CLIPModel``): a text tower and a vision tower, each a pre-norm encoder stack, and their
projections into one embedding space.

The registered family (``Clip``, kind ``"clip"``) names the checkpoint; the two towers are
declared as encoder specs of their own (``ClipText`` under ``text_model.``, ``ClipVision`` under
``vision_model.``), each built into one C++ encoder graph by ``models/clip.py``. What the towers'
graphs do not hold is read by ``models/clip.py`` from the tensors ``CLIP_TENSORS`` names:

- text: token + learned position embeddings, pre-norm layers (LayerNorm, quick GELU), a causal
  mask on top of the padding mask (``Hparams.causal``), ``final_layer_norm`` over every token;
  the pooled output is the hidden state at the end-of-text token (transformers 5.24's rule: the
  largest id when ``eos_token_id`` is the legacy 2, else the first ``eos_token_id``);
- vision: the patch embedding (a bias-free Conv2d, computed as a GEMM over flattened patches),
  ``class_embedding`` in front, learned positions, then the stack with ``pre_layrnorm`` as its
  embedding norm (``forward_embeddings``); ``post_layernorm`` over the class token's state;
- ``text_projection`` and ``visual_projection`` (no bias), ``logit_scale``.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Tuple

from .._model_dir import config_float, config_int
from .spec import Arch, Hparams, Source, Tensor, mapped, not_supported, weight_and_bias

_ACTIVATIONS = {"quick_gelu": "quick_gelu", "gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                "relu": "relu", "silu": "silu"}

#: CLIPTextConfig's and CLIPVisionConfig's defaults (transformers 5.24): ViT-B/32's text and vision towers.
TEXT_DEFAULTS = dict(vocab_size=49408, hidden_size=512, intermediate_size=2048, num_hidden_layers=12,
                     num_attention_heads=8, max_position_embeddings=77, layer_norm_eps=1e-5, pad_token_id=1,
                     bos_token_id=49406, eos_token_id=49407)
VISION_DEFAULTS = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                       num_channels=3, image_size=224, patch_size=32, layer_norm_eps=1e-5)

#: The tensors models/clip.py reads besides the towers' graphs: name -> checkpoint tensor, below the
#: vision tower's prefix ("vision_model." in CLIPModel and CLIPVisionModelWithProjection checkpoints,
#: none in a CLIPVisionModel's) ...
VISION_TENSORS = {"patch_embedding": "embeddings.patch_embedding.weight",
                  "class_embedding": "embeddings.class_embedding",
                  "vision_positions": "embeddings.position_embedding.weight",
                  "post_layernorm": "post_layernorm.weight",
                  "post_layernorm.bias": "post_layernorm.bias"}
#: ... and from the checkpoint's root.
ROOT_TENSORS = {"text_projection": "text_projection.weight", "visual_projection": "visual_projection.weight",
                "logit_scale": "logit_scale"}
#: Both, as checkpoint names of a CLIPModel.
CLIP_TENSORS = {**{key: "vision_model." + name for key, name in VISION_TENSORS.items()}, **ROOT_TENSORS}
#: model_type of the one-tower configs (CLIPTextConfig, CLIPVisionConfig: flat, no text_config / vision_config).
TOWER_MODEL_TYPES = {"text": "clip_text_model", "vision": "clip_vision_model"}


def _flat(config: Mapping[str, Any], tower: str) -> bool:
    return config.get("model_type") == TOWER_MODEL_TYPES[tower] and f"{tower}_config" not in config


def tower_config(config: Mapping[str, Any], tower: str) -> Dict[str, Any]:
    """config.json's ``text_config`` or ``vision_config`` (``{}`` when absent: the defaults); the
    config itself for a one-tower checkpoint (model_type clip_text_model / clip_vision_model)."""
    if _flat(config, tower):
        return dict(config)
    sub = config.get(f"{tower}_config")
    if sub is None:
        return {}
    if not isinstance(sub, dict):
        raise ValueError(f"config.json: {tower}_config must be a JSON object, got {type(sub).__name__}")
    return sub


def _source(tower: str, config: Mapping[str, Any]) -> str:
    return "config.json" if _flat(config, tower) else f"config.json {tower}_config"


def _escape(name: str) -> str:
    return name.replace(".", r"\.")


class _Tower(Arch):
    """One tower: the layers and norms of transformers' CLIPEncoder, pre-norm."""

    kind = "encoder"
    tower = ""
    defaults: Dict[str, Any] = {}

    def _hparams(self, config: Mapping[str, Any], **extra: Any) -> Hparams:
        sub = tower_config(config, self.tower)
        source = _source(self.tower, config)
        d = self.defaults
        hidden = config_int(sub, "hidden_size", default=d["hidden_size"], source=source)
        heads = config_int(sub, "num_attention_heads", default=d["num_attention_heads"], source=source)
        if hidden % heads:
            raise ValueError(f"{source}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
        activation = mapped(sub, "hidden_act", "quick_gelu", _ACTIVATIONS, f" (in {self.tower}_config)",
                            error=NotImplementedError)
        return Hparams(
            hidden_size=hidden, num_heads=heads, head_dim=hidden // heads,
            num_layers=config_int(sub, "num_hidden_layers", default=d["num_hidden_layers"], source=source),
            intermediate_size=config_int(sub, "intermediate_size", default=d["intermediate_size"], source=source),
            norm="layer", norm_eps=config_float(sub, "layer_norm_eps", default=d["layer_norm_eps"], minimum=0.0,
                                                source=source),
            pre_norm=True, activation=activation, gated_ffn=False, **extra)

    def layer_tensors(self, hp: Hparams, stack: str, layer: int) -> Dict[str, Tensor]:
        p = f"encoder.layers.{layer}."
        return {**weight_and_bias("attn.q", p + "self_attn.q_proj"),
                **weight_and_bias("attn.k", p + "self_attn.k_proj"),
                **weight_and_bias("attn.v", p + "self_attn.v_proj"),
                **weight_and_bias("attn.o", p + "self_attn.out_proj"),
                **weight_and_bias("attn_norm", p + "layer_norm1"),
                **weight_and_bias("ffn.up", p + "mlp.fc1"),
                **weight_and_bias("ffn.down", p + "mlp.fc2"),
                **weight_and_bias("ffn_norm", p + "layer_norm2")}


class ClipText(_Tower):
    family = "clip-text"
    title = "CLIP"
    tower = "text"
    defaults = TEXT_DEFAULTS
    # CLIPModel and CLIPTextModelWithProjection: below text_model.; CLIPTextModel (transformers 5):
    # at the root (older saves: text_model.).
    prefixes = ("text_model.", "")
    # The vision tower, the projections and logit_scale are read by models/clip.py;
    # embeddings.position_ids is a buffer older checkpoints saved.
    ignored = (r"vision_model\..*", r"text_projection\.weight", r"visual_projection\.weight", r"logit_scale",
               r"(text_model\.)?embeddings\.position_ids")

    def hparams(self, config: Mapping[str, Any]) -> Hparams:
        sub = tower_config(config, "text")
        source = _source("text", config)
        d = self.defaults
        vocab = config_int(sub, "vocab_size", default=d["vocab_size"], source=source)
        pad = config_int(sub, "pad_token_id", default=d["pad_token_id"], minimum=0, source=source)
        if pad >= vocab:  # (only the C++ graph's check: padding is masked, its id never matters)
            pad = 0
        return self._hparams(config, kind="encoder", vocab_size=vocab, positions="learned",
                             max_positions=config_int(sub, "max_position_embeddings",
                                                      default=d["max_position_embeddings"], source=source),
                             pad_token_id=pad, type_vocab_size=0, final_norm=True, causal=True)

    def model_tensors(self, config: Mapping[str, Any], hp: Hparams) -> Dict[str, Source]:
        return {"embed.tokens": Tensor("embeddings.token_embedding.weight", rows_key="vocab_size")}

    def stack_tensors(self, config: Mapping[str, Any], hp: Hparams, stack: str) -> Dict[str, Source]:
        return {"embed.positions": Tensor("embeddings.position_embedding.weight", rows_key="max_position_embeddings"),
                **weight_and_bias("final_norm", "final_layer_norm")}


class ClipVision(_Tower):
    family = "clip-vision"
    title = "CLIP"
    tower = "vision"
    defaults = VISION_DEFAULTS
    # CLIPModel and CLIPVisionModelWithProjection: below vision_model.; CLIPVisionModel (transformers 5):
    # at the root (older saves: vision_model.).
    prefixes = ("vision_model.", "")
    # The text tower and the tensors models/clip.py reads (VISION_TENSORS, ROOT_TENSORS).
    ignored = (r"text_model\..*", r"text_projection\.weight", r"visual_projection\.weight", r"logit_scale",
               r"(vision_model\.)?embeddings\.position_ids",
               *(r"(vision_model\.)?" + _escape(name) for name in VISION_TENSORS.values()))

    def hparams(self, config: Mapping[str, Any]) -> Hparams:
        # The stack runs on the embeddings models/clip.py makes (class token, patches, positions):
        # no table of its own (a one-row token table stands in; forward_embeddings never reads it).
        _, image, patch = self.geometry(config)
        return self._hparams(config, kind="encoder", vocab_size=1, positions="none",
                             max_positions=(image // patch) ** 2 + 1, pad_token_id=0, type_vocab_size=0,
                             embedding_norm=True)

    def geometry(self, config: Mapping[str, Any]) -> Tuple[int, int, int]:
        """(num_channels, image_size, patch_size)."""
        sub = tower_config(config, "vision")
        source = _source("vision", config)
        d = self.defaults
        channels = config_int(sub, "num_channels", default=d["num_channels"], source=source)
        image = config_int(sub, "image_size", default=d["image_size"], source=source)
        patch = config_int(sub, "patch_size", default=d["patch_size"], source=source)
        if patch > image:
            raise ValueError(f"{source}: patch_size {patch} is larger than image_size {image}")
        return channels, image, patch

    def model_tensors(self, config: Mapping[str, Any], hp: Hparams) -> Dict[str, Source]:
        # The class embedding [hidden] as the one-row table (read again, in float32, by models/clip.py).
        return {"embed.tokens": Tensor("embeddings.class_embedding", stored_shape=(hp.hidden_size,))}

    def stack_tensors(self, config: Mapping[str, Any], hp: Hparams, stack: str) -> Dict[str, Source]:
        return weight_and_bias("embed.norm", "pre_layrnorm")


class Clip(Arch):
    """The registered family: config.json's CLIPModel. ``hparams`` is the text tower's; the model
    class (``cpuformer.CLIP``) builds both towers from ``ClipText`` and ``ClipVision``. The
    one-tower checkpoints (CLIPTextModel..., CLIPVisionModel...) are the subclasses below."""

    kind = "clip"
    family = "clip"
    title = "CLIP"
    architectures = ("CLIPModel",)
    model_types = ("clip",)
    #: transformers' image processor of the family (its defaults fill preprocessor_config.json's gaps).
    image_processor = "CLIPImageProcessor"
    #: cpuformer convert writes the towers (weights.convert_checkpoints); models/clip.py reads the result.
    convertible = True
    #: The towers the family's checkpoints hold, the first one's Hparams being ``hparams``.
    tower_names: Tuple[str, ...] = ("text", "vision")

    def __init__(self) -> None:
        self.text, self.vision = ClipText(), ClipVision()

    def parts(self, architecture: str) -> Dict[str, bool]:
        """tower -> whether the checkpoint class ``architecture`` projects its output
        (text_projection / visual_projection)."""
        return {"text": True, "vision": True}

    def _main(self) -> _Tower:
        return self.text if self.tower_names[0] == "text" else self.vision

    def check(self, config: Mapping[str, Any]) -> None:
        for tower in self.tower_names:
            sub = tower_config(config, tower)
            not_supported(sub.get("position_embedding_type") not in (None, "absolute"),
                          f"{_source(tower, config)}: position_embedding_type {sub.get('position_embedding_type')!r} "
                          "is not supported")

    def towers(self, config: Mapping[str, Any]) -> Tuple[Tuple[Arch, Hparams], ...]:
        """(tower spec, its hyperparameters) of each encoder graph the model builds."""
        self.check(config)
        specs = {"text": self.text, "vision": self.vision}
        return tuple((specs[tower], specs[tower].hparams(config)) for tower in self.tower_names)

    def projection_dim(self, config: Mapping[str, Any]) -> int:
        return config_int(config, "projection_dim", default=512)

    def eos_token_id(self, config: Mapping[str, Any]) -> int:
        """text_config.eos_token_id (transformers' pooling rule depends on it: 2 is the legacy value)."""
        sub = tower_config(config, "text")
        return config_int(sub, "eos_token_id", default=TEXT_DEFAULTS["eos_token_id"], minimum=0, maximum=None,
                          source=_source("text", config))

    def hparams(self, config: Mapping[str, Any]) -> Hparams:
        self.check(config)
        return self._main().hparams(config)

    def model_tensors(self, config: Mapping[str, Any], hp: Hparams) -> Dict[str, Source]:
        return self._main().model_tensors(config, hp)

    def stack_tensors(self, config: Mapping[str, Any], hp: Hparams, stack: str) -> Dict[str, Source]:
        return self._main().stack_tensors(config, hp, stack)

    def layer_tensors(self, hp: Hparams, stack: str, layer: int) -> Dict[str, Tensor]:
        return self._main().layer_tensors(hp, stack, layer)


class ClipTextModel(Clip):
    """CLIP's text tower alone (transformers' CLIPTextModel, CLIPTextModelWithProjection; a flat
    CLIPTextConfig, model_type clip_text_model): ``cpuformer.CLIPText``."""

    family = "clip-text-model"
    title = "CLIP text"
    architectures = ("CLIPTextModel", "CLIPTextModelWithProjection")
    model_types = ("clip_text_model",)
    tower_names = ("text",)

    def parts(self, architecture: str) -> Dict[str, bool]:
        return {"text": architecture.endswith("WithProjection")}


class ClipVisionModel(Clip):
    """CLIP's vision tower alone (transformers' CLIPVisionModel, CLIPVisionModelWithProjection; a
    flat CLIPVisionConfig, model_type clip_vision_model): ``cpuformer.CLIPVision``."""

    family = "clip-vision-model"
    title = "CLIP vision"
    architectures = ("CLIPVisionModel", "CLIPVisionModelWithProjection")
    model_types = ("clip_vision_model",)
    tower_names = ("vision",)

    def parts(self, architecture: str) -> Dict[str, bool]:
        return {"vision": architecture.endswith("WithProjection")}


ARCHS = (Clip(), ClipTextModel(), ClipVisionModel())
