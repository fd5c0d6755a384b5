"""The model classes: the API of each model kind, with no family names (those are in arch/)."""

from .clip import CLIP, CLIPText, CLIPVision, open_clip_model
from .encoder import Encoder
from .generator import Generator
from .seq2seq import Seq2Seq
from .swin import open_vision_model
from .vision import ImageClassifier, ImageEncoder

#: The class that runs each model kind (image models: ImageClassifier or ImageEncoder, by checkpoint;
#: Swin: their subclasses in models/swin.py; CLIP: CLIP, or CLIPText / CLIPVision for one tower).
CLASSES = {"encoder": Encoder, "decoder": Generator, "seq2seq": Seq2Seq, "vision": open_vision_model,
           "clip": open_clip_model}

__all__ = ["CLASSES", "CLIP", "CLIPText", "CLIPVision", "Encoder", "Generator", "ImageClassifier", "ImageEncoder",
           "Seq2Seq"]
