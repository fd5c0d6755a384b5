"""Task heads of encoder checkpoints: what a ``...ForSequenceClassification`` (and the other task
classes) computes on top of the encoder's hidden states, declared per family like the body.

A head is a short list of steps applied to the last hidden state h [B, T, H]:

- ``("first",)``: h[:, 0] (the first token's state; [B, H]);
- ``("last",)``: each sequence's last unpadded token (XLNet's sequence summary: its inputs end
  with ``<cls>``; transformers takes h[:, -1], the same token in XLNet's left-padded batches;
  [B, H]);
- ``("mean",)``: the mean of h over each sequence's unpadded tokens ([B, H]);
- ``("pooler",)``: the encoder's own pooler output tanh(pooler(h[:, 0])) (BERT);
- ``("dense", name)``: the linear layer ``head.<name>`` (weight [out, in] and its bias);
- ``("act", activation)``: one of ``HEAD_ACTIVATIONS``;
- ``("norm", name, eps)``: a LayerNorm ``head.<name>`` (weight, optional bias).

The last step's output is the head's logits, as transformers returns them: [B, labels] for
sequence classification, [B, T, labels] for token classification, [B, T, 2] for question
answering (start and end logits), [B, T, vocab] for masked LM.

The task comes from the checkpoint's class name (``task_of``); which tasks a family has, and their
tensors, from ``Arch.head``: the C++ registry declares them (``arch::HeadBuilder``,
csrc/models/arch/arch.h) and ``head_of`` turns a declaration into a ``Head``. A checkpoint whose
task the family does not declare is refused (``cpuformer.Encoder(path, head=False)`` still opens
its encoder).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Optional, Tuple

from .. import _core
from .spec import Tensor

#: Class-name suffix -> task. ForPreTraining checkpoints are run as masked LMs (their next-sentence
#: head is not used).
TASK_SUFFIXES = {"ForSequenceClassification": "sequence_classification",
                 "ForTokenClassification": "token_classification",
                 "ForQuestionAnswering": "question_answering",
                 "ForQuestionAnsweringSimple": "question_answering",  # XLNet's one-layer head
                 "ForMaskedLM": "masked_lm",
                 "ForPreTraining": "masked_lm"}
TASKS = ("sequence_classification", "token_classification", "question_answering", "masked_lm")
#: What the error messages call each task.
TASK_TEXT = {"sequence_classification": "sequence classification", "token_classification": "token classification",
             "question_answering": "question answering", "masked_lm": "masked language modelling"}
HEAD_ACTIVATIONS = ("tanh", "gelu", "gelu_tanh", "relu", "silu")


def task_of(architecture: str) -> Optional[str]:
    """The task of a checkpoint class name ("BertForTokenClassification" -> "token_classification");
    None for a base model; "" for a task class cpuformer has no head for (ForMultipleChoice, ...,
    and XLNetLMHeadModel's permutation language model)."""
    for suffix, task in TASK_SUFFIXES.items():
        if architecture.endswith(suffix):
            return task
    return "" if "For" in architecture or architecture.endswith("LMHeadModel") else None


@dataclasses.dataclass(frozen=True)
class Head:
    """One task head: its steps and where each of its weights comes from."""

    task: str
    steps: Tuple[Tuple[Any, ...], ...]
    tensors: Dict[str, Tensor]  # canonical "head.<name>" (".bias") -> checkpoint tensor
    shapes: Dict[str, Tuple[int, ...]]  # canonical name -> shape
    labels: Tuple[str, ...] = ()  # sequence / token classification: id2label in id order

    @property
    def uses_pooler(self) -> bool:
        return ("pooler",) in self.steps

    @property
    def reads_first_token(self) -> bool:
        """Whether the head reads the first token's state only (its first step is "first" or the
        pooler): the encoder then computes its last layer for that token alone."""
        return bool(self.steps) and self.steps[0] in (("first",), ("pooler",))


def head_of(declared: Mapping[str, Any]) -> Head:
    """A Head from the C++ registry's declaration (``_core.arch_head``: task, steps, tensors as
    Tensor fields, shapes, labels)."""
    tensors = {name: Tensor(**fields) for name, fields in declared["tensors"].items()}
    shapes = {name: tuple(shape) for name, shape in declared["shapes"].items()}
    return Head(declared["task"], tuple(tuple(step) for step in declared["steps"]), tensors, shapes,
                tuple(declared["labels"]))


def labels(config: Mapping[str, Any]) -> Tuple[str, ...]:
    """The class labels of a classification checkpoint in id order: config.json's ``id2label``
    (keys 0..n-1), else ``LABEL_0``... for ``num_labels`` (default 2, as transformers). Read by the
    C++ registry (csrc/models/arch/arch.cc), whose messages name the key."""
    return tuple(_core.arch_labels(dict(config)))


__all__ = ["HEAD_ACTIVATIONS", "TASKS", "TASK_SUFFIXES", "TASK_TEXT", "Head", "head_of", "labels", "task_of"]
