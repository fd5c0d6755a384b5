"""What an architecture declares: ``Arch`` (which configs it claims, their hyperparameters, where
each canonical weight comes from) and ``Tensor`` (one checkpoint tensor and the fixed edits it
needs). The rest of cpuformer reads these declarations; only the files of this package name Hugging
Face classes, config keys and tensor names.

Canonical hyperparameters (``Hparams``) are the fields of the one transformer configuration every
model kind is built from. Canonical weight names are the same for every family:

- per layer: ``attn.q`` ``attn.k`` ``attn.v`` ``attn.o`` (self-attention projections),
  ``attn.q_norm`` ``attn.k_norm`` (per-head RMSNorm of queries and keys), ``cross.q`` ... ``cross.o``
  (cross-attention), ``ffn.gate`` ``ffn.up`` ``ffn.down``, and the norms ``attn_norm``
  ``cross_norm`` ``ffn_norm`` (before their block when ``pre_norm``, after the residual sum
  otherwise); a ``.bias`` suffix names a bias;
- per stack (the encoder or the decoder): ``embed.positions``, ``embed.norm`` (the norm applied
  to the embeddings), ``final_norm``, ``relative_bias`` (T5's bucketed bias table),
  ``rope.inv_freq`` (computed), ``rope.local_inv_freq`` (computed: the windowed layers' own, with
  ``global_attention_every``), ``relative_embeddings`` and ``relative_norm`` (DeBERTa's relative
  position embeddings and their LayerNorm);
- per layer of disentangled attention without a shared key: ``attn.position_q``
  ``attn.position_k`` (the relative embeddings' own projections);
- per layer of Transformer-XL attention (XLNet): ``attn.position_k`` (the projection of the
  relative sinusoids), ``attn.content_bias`` ``attn.position_bias`` ``attn.segment_bias``
  [heads * head_dim] and ``attn.segment_embed`` [2, heads * head_dim];
- per model: ``embed.tokens``, ``embed.token_types``, ``embed.project`` (maps normed embeddings of
  ``embedding_size`` into ``hidden_size`` when the tables are narrower: ELECTRA, ALBERT), ``lm_head``,
  ``lm_head.bias``, ``pooler``.

The embedding tables, ``embed.norm`` and the input of ``embed.project`` are ``embedding_size`` wide
(``hidden_size`` unless a family says otherwise). Matrix weights are in nn.Linear layout [out_features, in_features].
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Optional, Tuple, Union

import numpy as np

from .. import _core

#: "vision": image models (arch/vit.py); their Hparams are an encoder's (kind "encoder"), the
#: family's kind picks the model class (ImageClassifier / ImageEncoder). "clip": CLIP, two encoder
#: stacks (arch/clip.py; its Hparams are the text tower's).
KINDS = ("encoder", "decoder", "seq2seq", "vision", "clip")
#: What the error messages call each kind.
KIND_TEXT = {"encoder": "an encoder", "decoder": "a decoder (causal LM)", "seq2seq": "an encoder-decoder (seq2seq)",
             "vision": "an image model", "clip": "a CLIP (text and image) model"}
#: The model class that runs each kind.
KIND_CLASS = {"encoder": "Encoder", "decoder": "Generator", "seq2seq": "Seq2Seq", "vision": "ImageEncoder",
              "clip": "CLIP"}

#: Canonical weights that multiply activations (quantized or stored in 16 bits by the dtype policy;
#: listed once, in C++: csrc/models/arch/checkpoint.h).
MATMUL = frozenset(_core.matrix_weights())
#: Canonical norm weights (vectors of ones in a fresh checkpoint).
NORMS = frozenset({"attn_norm", "cross_norm", "ffn_norm", "embed.norm", "final_norm", "attn.q_norm",
                   "attn.k_norm", "relative_norm"})

NORM_KINDS = ("layer", "rms")
POSITION_KINDS = ("learned", "sinusoidal", "rope", "relative", "none")
ACTIVATIONS = ("gelu", "gelu_tanh", "relu", "silu", "quick_gelu")


@dataclasses.dataclass(frozen=True)
class Hparams:
    """The hyperparameters of one model, in cpuformer's names (an architecture's ``hparams``
    translates config.json into these)."""

    kind: str
    vocab_size: int
    hidden_size: int
    num_layers: int  # the encoder's, or the decoder's of a decoder-only model
    num_heads: int
    head_dim: int
    intermediate_size: int
    norm: str  # "layer" (LayerNorm with bias) or "rms"
    norm_eps: float
    pre_norm: bool
    activation: str
    gated_ffn: bool  # down(act(gate(x)) * up(x)) instead of down(act(up(x)))
    positions: str  # POSITION_KINDS ("none": no position in the embeddings, DeBERTa-v3)
    max_positions: int  # rows of the position table (0: no limit, relative positions); "none": longest sequence
    num_kv_heads: int = 0  # 0: num_heads
    num_decoder_layers: int = 0  # seq2seq only
    position_offset: int = 0  # learned tables whose first rows are reserved (BART: 2)
    position_ids: str = "arange"  # encoders: "arange", or "padding_cumsum" (RoBERTa)
    pad_token_id: int = 0
    type_vocab_size: int = 0
    embedding_norm: bool = False
    final_norm: bool = False
    embed_scale: float = 1.0
    attention_scale: float = 0.0  # 0: 1 / sqrt(head_dim)
    # Keys within sliding_window - 1 positions: the last sliding_window keys in a decoder (Mistral),
    # both sides in an encoder (ModernBERT's local layers). 0: no window.
    sliding_window: int = 0
    qk_norm: bool = False
    num_buckets: int = 32  # relative positions
    max_distance: int = 128
    tie_word_embeddings: bool = True
    head_scale: float = 1.0  # logits = head_scale * lm_head(h)
    embedding_size: int = 0  # width of the embedding tables and embed.norm (0: hidden_size); see embed.project
    relative_bias: bool = False  # learned positions plus a bucketed relative bias in every layer (MPNet)
    # Encoders with a sliding_window: layers l % n == 0 attend to every key and use rope.inv_freq,
    # the others the window and rope.local_inv_freq (ModernBERT). 0: every layer uses the window.
    global_attention_every: int = 0
    # Encoders whose consecutive layers share weights (ALBERT): layer_groups distinct layers, each
    # run num_layers / layer_groups times in a row. 0: every layer has its own.
    layer_groups: int = 0
    # DeBERTa's disentangled attention (csrc/layers/disentangled_attention.h): the content-to-position
    # (c2p) and position-to-content (p2c) terms over relative embeddings [2 * relative_span, hidden].
    content_to_position: bool = False
    position_to_content: bool = False
    position_buckets: int = 0  # > 0: log-bucketed relative positions
    max_relative_positions: int = 0  # the log buckets' largest position; the span without buckets
    relative_embedding_norm: bool = False  # LayerNorm over the relative embeddings
    share_attention_key: bool = True  # project them with attn.q / attn.k (else attn.position_q / position_k)
    # XLNet's Transformer-XL relative attention (csrc/layers/relative_attention_xl.h): sinusoidal
    # relative positions projected by attn.position_k, the biases attn.content_bias,
    # attn.position_bias, attn.segment_bias and the segment embeddings attn.segment_embed; token
    # types are compared for equality (no table); relative_clamp > 0 clamps the distances.
    transformer_xl_attention: bool = False
    relative_clamp: int = 0
    # Encoders whose tokens attend only to keys at or before their own position, besides the padding
    # mask (CLIP's text tower); decoders are causal anyway.
    causal: bool = False

    @property
    def relative_span(self) -> int:
        return self.position_buckets if self.position_buckets > 0 else self.max_relative_positions

    def __post_init__(self) -> None:
        if self.num_kv_heads == 0:
            object.__setattr__(self, "num_kv_heads", self.num_heads)
        if self.embedding_size == 0:
            object.__setattr__(self, "embedding_size", self.hidden_size)
        assert self.kind in KINDS and self.norm in NORM_KINDS and self.positions in POSITION_KINDS
        assert self.activation in ACTIVATIONS, self.activation

    def as_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Tensor:
    """Where one canonical weight comes from in a checkpoint, with the edits applied once at load
    (or at conversion)."""

    name: str  # checkpoint name, below the model's prefix (see Arch.prefixes) unless ``root``
    transpose: bool = False  # stored [in, out] (GPT-2's Conv1D): transposed into nn.Linear layout
    rows: Optional[Tuple[int, int]] = None  # [start, stop) row block of a fused tensor (after transposing)
    plus_one: bool = False  # a norm weight stored as w - 1: the model uses 1 + w
    optional: bool = False  # absent from some checkpoints (the weight is then not used)
    root: bool = False  # named from the checkpoint's root (an LM head next to the prefixed body)
    as_row: bool = False  # a vector stored as one row [1, n]
    fallbacks: Tuple[str, ...] = ()  # other names that hold the same tensor, tried in order
    rows_key: str = ""  # the config.json key that sets the row count (named when the shapes disagree)
    # The shape the checkpoint stores, when its head axes are split (XLNet's [hidden, heads,
    # head_dim]): read with that shape and reshaped (row-major) to the canonical one, before transposing.
    stored_shape: Optional[Tuple[int, ...]] = None


@dataclasses.dataclass(frozen=True)
class Memory:
    """How transformers' ``cache_mem`` keeps each layer's Transformer-XL memory between calls
    (XLNet): the first ``reuse_len`` tokens of a call (0: all of them) are appended to the memory,
    which then keeps its last ``mem_len`` tokens (0: all)."""

    mem_len: int
    reuse_len: int


#: A canonical weight's source: a checkpoint tensor, or an array computed from the config.
Source = Union[Tensor, np.ndarray]


class Arch:
    """One architecture family. Subclasses set the class attributes and implement ``hparams`` and
    the three tensor maps; everything else (loading, converting, random checkpoints, error
    messages) is generic."""

    kind: str = ""
    family: str = ""
    title: str = ""  # the family's name in prose ("GPT-2")
    #: config.json "architectures" values this family claims, and its "model_type" values.
    architectures: Tuple[str, ...] = ()
    model_types: Tuple[str, ...] = ()
    #: Prefixes the body's tensor names may carry (task-head checkpoints: "bert."), tried in order.
    prefixes: Tuple[str, ...] = ("",)
    #: Regular expressions of checkpoint tensors knowingly not used (task heads, buffers, tied copies).
    ignored: Tuple[str, ...] = ()
    #: (copy, table): checkpoint tensors (names without the prefix) that cpuformer reads as the
    #: table ``table``. With tie_word_embeddings false, transformers 5 unties such copies (e.g.
    #: BART's encoder and decoder embed_tokens from its shared table); the loader then checks that a
    #: stored copy holds the table's values and refuses the checkpoint if not.
    tied_copies: Tuple[Tuple[str, str], ...] = ()
    #: Seq2seq generation starts from the pad token when the config names no start token (T5).
    start_from_pad: bool = False
    #: config.json entries of a typical checkpoint besides its sizes (``cpuformer bench``'s models).
    example: Dict[str, Any] = {}

    def example_config(self, **sizes: Any) -> Dict[str, Any]:
        """A complete config.json for a checkpoint of this family with the given size entries."""
        return {"architectures": [self.architectures[0]], "model_type": self.model_types[0], **self.example, **sizes}

    def hparams(self, config: Mapping[str, Any]) -> Hparams:
        raise NotImplementedError

    def model_tensors(self, config: Mapping[str, Any], hp: Hparams) -> Dict[str, Source]:
        """embed.tokens, embed.token_types, embed.project, lm_head, lm_head.bias, pooler."""
        raise NotImplementedError

    def stack_tensors(self, config: Mapping[str, Any], hp: Hparams, stack: str) -> Dict[str, Source]:
        """The stack's embed.positions, embed.norm, final_norm, relative_bias, rope.inv_freq."""
        raise NotImplementedError

    def layer_tensors(self, hp: Hparams, stack: str, layer: int) -> Dict[str, Tensor]:
        raise NotImplementedError

    def head(self, config: Mapping[str, Any], hp: Hparams, task: str) -> Optional[Any]:
        """The task head (an ``arch.heads.Head``; C++ families declare it with ``arch::HeadBuilder``) of ``task``
        (``arch.heads.TASKS``) for this config, or None when the family has no such head (the
        checkpoint is then refused, naming the task)."""
        return None

    def memory(self, config: Mapping[str, Any]) -> Optional[Any]:
        """How a family with a Transformer-XL memory keeps it between calls (XLNet: a ``Memory``,
        mem_len and reuse_len), or None for a family without one."""
        return None

    # ---- derived -----------------------------------------------------------------------------

    def stacks(self, hp: Hparams) -> Tuple[Tuple[str, int], ...]:
        """(stack name, count of layers with weights of their own) in load order."""
        if self.kind == "seq2seq":
            return (("encoder", hp.num_layers), ("decoder", hp.num_decoder_layers))
        return ((self.kind, hp.layer_groups or hp.num_layers),)

    def claims(self, architecture: str) -> bool:
        return architecture in self.architectures

    def __repr__(self) -> str:
        return f"<architecture {self.family} ({self.kind})>"


def bias_of(name: str) -> str:
    """The canonical weight a ``.bias`` name belongs to ("attn.q.bias" -> "attn.q")."""
    return name[:-len(".bias")] if name.endswith(".bias") else name


def canonical_shape(name: str, hp: Hparams) -> Tuple[int, ...]:
    """The shape cpuformer uses for canonical weight ``name`` of a model with hyperparameters ``hp``
    (declared once, in C++: csrc/models/arch/checkpoint.h); ValueError for another name."""
    return tuple(_core.canonical_shape(name, hp.as_dict()))


def weight_and_bias(canonical: str, checkpoint: str, bias: Union[bool, str] = True,
                    **edits: Any) -> Dict[str, Tensor]:
    """The canonical weight and its bias from ``<checkpoint>.weight`` and ``<checkpoint>.bias``.
    bias: True (required), False (none) or "optional"."""
    out = {canonical: Tensor(checkpoint + ".weight", **edits)}
    if bias:
        bias_edits = {k: v for k, v in edits.items() if k in ("rows", "root")}
        out[canonical + ".bias"] = Tensor(checkpoint + ".bias", optional=bias == "optional", **bias_edits)
    return out


def mapped(config: Mapping[str, Any], key: str, default: str, table: Mapping[str, str], what: str = "",
           error: type = ValueError) -> str:
    """``table[config[key]]`` (``default`` when the key is missing or null); ``error`` naming the key
    and the accepted values otherwise."""
    value = config.get(key)
    if value is None:
        value = default
    if not isinstance(value, str) or value not in table:
        raise error(f"config.json: {key} {value!r} is not supported{what}; use one of {sorted(table)}")
    return table[value]


def not_supported(condition: Any, message: str) -> None:
    """NotImplementedError "config.json: <message>" when ``condition`` holds."""
    if condition:
        raise NotImplementedError(f"config.json: {message}")
