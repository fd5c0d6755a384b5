"""The model classes: the API of each model kind, with no family names (those are in arch/)."""

from .encoder import Encoder
from .generator import Generator
from .seq2seq import Seq2Seq

#: The class that runs each model kind.
CLASSES = {"encoder": Encoder, "decoder": Generator, "seq2seq": Seq2Seq}

__all__ = ["CLASSES", "Encoder", "Generator", "Seq2Seq"]
