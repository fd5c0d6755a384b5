"""Images in: the preprocessing a checkpoint's ``preprocessor_config.json`` describes (docs/vision.md, "Images in").

``read_image_config(path)`` reads the file as transformers' ViT, DeiT and CLIP image processors do (their
class defaults fill the keys a file leaves out); ``preprocess(images, config)`` turns file paths, PIL images
or NumPy arrays into the float32 ``[B, 3, H, W]`` pixel values the vision models take: convert to RGB,
resize with the file's resample filter, center crop, rescale, normalize. The numbers equal transformers'
image processor on the same input (its PIL backend, which AutoImageProcessor returns without torchvision).

Pillow is optional (``pip install "cpuformer[vision]"``): file paths and PIL images need it; NumPy arrays do
not. Resizing goes through Pillow when it is installed and through this module's NumPy port of Pillow's
``Image.resize`` otherwise (the same separable passes, filter support, 8-bit fixed-point coefficients and
rounding, so both give the same bytes). A leaf module: it imports only NumPy, and Pillow inside functions.

Accepted arrays (the dtype gives the value range, the shape the layout):
  - uint8 in [0, 255]; float16/32/64 in [0, 1] (anything outside, or NaN, is a ValueError);
  - 2-D ``HW`` (grayscale), 3-D ``HWC`` or ``CHW``, 4-D ``NHWC`` or ``NCHW`` (a batch). The channel axis is
    the last one if it has 3 or 4 entries, else the first (after N) if that has 3 or 4, else the last one if it
    has 1, else the first; ``layout=`` ("HWC", "CHW", "NHWC", "NCHW") says it explicitly;
  - 1 channel is repeated to RGB, 4 channels (RGBA) are composited onto white as transformers' convert_rgb does.
A float image is the 8-bit image ``x * 255``: without resizing its values are used as they are; with
``do_resize`` it is quantized to 8 bits first (rounded), as transformers' PIL resize does (which truncates).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

CONFIG_NAME = "preprocessor_config.json"
PIP_HINT = 'pip install "cpuformer[vision]"'

# PIL's resample codes, as preprocessor_config.json stores them
NEAREST, LANCZOS, BILINEAR, BICUBIC, BOX, HAMMING = 0, 1, 2, 3, 4, 5
RESAMPLE_NAMES = {NEAREST: "nearest", LANCZOS: "lanczos", BILINEAR: "bilinear", BICUBIC: "bicubic", BOX: "box",
                  HAMMING: "hamming"}

_IMAGENET_STANDARD = (0.5, 0.5, 0.5)
_OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

# transformers' class attributes (models/{vit,deit,clip}/image_processing_*.py, BaseImageProcessor): the values a
# preprocessor_config.json of that type gets for the keys it leaves out (or sets to null)
_BASE_DEFAULTS: Dict[str, Any] = {
    "do_resize": None, "size": None, "resample": None, "do_center_crop": None, "crop_size": None,
    "do_rescale": None, "rescale_factor": 1 / 255, "do_normalize": None, "image_mean": None, "image_std": None,
    "do_convert_rgb": None, "default_to_square": True,
}
_TYPE_DEFAULTS: Dict[str, Dict[str, Any]] = {
    "ViTImageProcessor": {
        "resample": BILINEAR, "image_mean": _IMAGENET_STANDARD, "image_std": _IMAGENET_STANDARD,
        "size": {"height": 224, "width": 224}, "do_resize": True, "do_rescale": True, "do_normalize": True,
    },
    "DeiTImageProcessor": {
        "resample": BICUBIC, "image_mean": _IMAGENET_STANDARD, "image_std": _IMAGENET_STANDARD,
        "size": {"height": 256, "width": 256}, "crop_size": {"height": 224, "width": 224}, "do_resize": True,
        "do_center_crop": True, "do_rescale": True, "do_normalize": True,
    },
    "CLIPImageProcessor": {
        "resample": BICUBIC, "image_mean": _OPENAI_CLIP_MEAN, "image_std": _OPENAI_CLIP_STD,
        "size": {"shortest_edge": 224}, "default_to_square": False, "crop_size": {"height": 224, "width": 224},
        "do_resize": True, "do_center_crop": True, "do_rescale": True, "do_normalize": True, "do_convert_rgb": True,
    },
}
SUPPORTED_TYPES = tuple(_TYPE_DEFAULTS)


# ---------------------------------------------------------------------------------------------------------------
# preprocessor_config.json


@dataclass(frozen=True)
class ImageConfig:
    """What ``preprocess`` does, as read from a preprocessor_config.json (``read_image_config``).

    ``size`` is ``(height, width)`` or, with ``shortest_edge`` set instead, the shorter side's length (the
    longer one keeps the aspect ratio, truncated as transformers does). ``crop_size`` is ``(height, width)``.
    Images are always converted to RGB (``do_convert_rgb`` is kept for reference only: the models need three
    channels, and transformers fails on other images without it)."""

    image_processor_type: str
    do_resize: bool
    size: Optional[Tuple[int, int]]
    shortest_edge: Optional[int]
    resample: int
    do_center_crop: bool
    crop_size: Optional[Tuple[int, int]]
    do_rescale: bool
    rescale_factor: float
    do_normalize: bool
    image_mean: Tuple[float, float, float]
    image_std: Tuple[float, float, float]
    do_convert_rgb: bool
    source: str = "<dict>"

    @property
    def output_size(self) -> Optional[Tuple[int, int]]:
        """(height, width) of every preprocessed image, or None when it depends on the image (shortest_edge
        resizing without a center crop, or no resizing)."""
        if self.do_center_crop:
            return self.crop_size
        if self.do_resize and self.size is not None:
            return self.size
        return None

    @classmethod
    def from_dict(cls, settings: Dict[str, Any], source: str = "<dict>",
                  default_type: Optional[str] = None) -> "ImageConfig":
        return _parse_config(settings, source, default_type)


def read_image_config(path: Union[str, "os.PathLike[str]"], default_type: Optional[str] = None) -> ImageConfig:
    """The preprocessing of a model directory (its preprocessor_config.json) or of that file itself.

    ``default_type`` ("ViTImageProcessor", "DeiTImageProcessor" or "CLIPImageProcessor") is used when the file
    names no ``image_processor_type`` / ``feature_extractor_type`` (transformers then goes by config.json's
    model_type). Missing or nonsensical values raise a ValueError naming the file and the key."""
    path = os.fspath(path)
    file = os.path.join(path, CONFIG_NAME) if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise ValueError(f"{file}: no such file (a vision model directory needs {CONFIG_NAME})")
    try:
        with open(file, encoding="utf-8") as handle:
            settings = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{file}: not a readable JSON file ({error})") from None
    if not isinstance(settings, dict):
        raise ValueError(f"{file}: expected a JSON object, got {type(settings).__name__}")
    return _parse_config(settings, file, default_type)


def _canonical_type(name: str) -> str:
    """ViTImageProcessorFast / ViTImageProcessorPil / ViTFeatureExtractor -> ViTImageProcessor."""
    for suffix in ("Fast", "Pil"):
        if name.endswith("ImageProcessor" + suffix):
            name = name[: -len(suffix)]
    if name.endswith("FeatureExtractor"):
        name = name[: -len("FeatureExtractor")] + "ImageProcessor"
    return name


def _parse_config(settings: Dict[str, Any], source: str, default_type: Optional[str]) -> ImageConfig:
    def fail(key: str, message: str) -> ValueError:
        return ValueError(f"{source}: {key!r} {message}")

    key = "image_processor_type" if "image_processor_type" in settings else "feature_extractor_type"
    raw_type = settings.get(key)
    if raw_type is None:
        if default_type is None:
            raise fail("image_processor_type", "is missing (and no default type was given); cpuformer reads "
                       f"{', '.join(SUPPORTED_TYPES)} (and their Fast/Pil variants)")
        raw_type, key = default_type, "image_processor_type"
    if not isinstance(raw_type, str) or _canonical_type(raw_type) not in _TYPE_DEFAULTS:
        raise fail(key, f"is {raw_type!r}: cpuformer reads {', '.join(SUPPORTED_TYPES)} (and their Fast/Pil "
                   "variants)")
    kind = _canonical_type(raw_type)
    values = dict(_BASE_DEFAULTS)
    values.update(_TYPE_DEFAULTS[kind])
    for name in values:
        if settings.get(name) is not None:  # null means the class default, as in transformers
            values[name] = settings[name]
    if kind == "CLIPImageProcessor" and settings.get("use_square_size"):  # transformers' KOSMOS-2 compatibility
        edge = values["size"].get("shortest_edge") if isinstance(values["size"], dict) else None
        values["size"] = {"height": edge, "width": edge}

    def flag(name: str) -> bool:
        value = values[name]
        if value is None:
            return False
        if not isinstance(value, bool):
            raise fail(name, f"must be true or false, got {value!r}")
        return value

    def positive_int(name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise fail(name, f"must hold positive integers, got {value!r}")
        return value

    def height_width(name: str, value: Any, default_to_square: bool) -> Tuple[Optional[Tuple[int, int]],
                                                                              Optional[int]]:
        if isinstance(value, int) and not isinstance(value, bool):
            if default_to_square:
                return (positive_int(name, value),) * 2, None  # type: ignore[return-value]
            return None, positive_int(name, value)
        if isinstance(value, (list, tuple)) and len(value) == 2:
            return (positive_int(name, value[0]), positive_int(name, value[1])), None
        if isinstance(value, dict):
            if set(value) == {"height", "width"}:
                return (positive_int(name, value["height"]), positive_int(name, value["width"])), None
            if set(value) == {"shortest_edge"}:
                return None, positive_int(name, value["shortest_edge"])
            raise fail(name, f"has keys {sorted(value)}: cpuformer reads {{'height', 'width'}} or "
                       "{'shortest_edge'}")
        raise fail(name, f"must be {{'height': H, 'width': W}} or {{'shortest_edge': S}}, got {value!r}")

    def triple(name: str, positive: bool) -> Tuple[float, float, float]:
        value = values[name]
        items = list(value) if isinstance(value, (list, tuple)) else [value, value, value]
        if len(items) != 3 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in items):
            raise fail(name, f"must be a number or a list of 3 numbers (one per RGB channel), got {value!r}")
        if not all(math.isfinite(v) and (v > 0 or not positive) for v in items):
            raise fail(name, f"must hold finite{' positive' if positive else ''} numbers, got {value!r}")
        return (float(items[0]), float(items[1]), float(items[2]))

    do_resize, do_center_crop = flag("do_resize"), flag("do_center_crop")
    do_rescale, do_normalize = flag("do_rescale"), flag("do_normalize")
    size: Optional[Tuple[int, int]] = None
    shortest: Optional[int] = None
    resample = BILINEAR
    if do_resize:
        if values["size"] is None:
            raise fail("size", "is missing (do_resize is true)")
        default_to_square = values["default_to_square"]
        size, shortest = height_width("size", values["size"], bool(default_to_square))
        if values["resample"] is not None:
            resample = values["resample"]
        if isinstance(resample, bool) or resample not in RESAMPLE_NAMES:
            raise fail("resample", f"is {resample!r}: PIL's codes are " +
                       ", ".join(f"{code} ({name})" for code, name in RESAMPLE_NAMES.items()))
    crop: Optional[Tuple[int, int]] = None
    if do_center_crop:
        if values["crop_size"] is None:
            raise fail("crop_size", "is missing (do_center_crop is true)")
        crop, edge = height_width("crop_size", values["crop_size"], True)
        if crop is None:
            raise fail("crop_size", "must be {'height': H, 'width': W}")
    rescale_factor = 1 / 255
    if do_rescale:
        factor = values["rescale_factor"]
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not (
                math.isfinite(factor) and factor > 0):
            raise fail("rescale_factor", f"must be a finite positive number, got {factor!r}")
        rescale_factor = float(factor)
    mean, std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    if do_normalize:
        for name in ("image_mean", "image_std"):
            if values[name] is None:
                raise fail(name, "is missing (do_normalize is true)")
        mean, std = triple("image_mean", False), triple("image_std", True)
    return ImageConfig(image_processor_type=kind, do_resize=do_resize, size=size, shortest_edge=shortest,
                       resample=int(resample), do_center_crop=do_center_crop, crop_size=crop, do_rescale=do_rescale,
                       rescale_factor=rescale_factor, do_normalize=do_normalize, image_mean=mean, image_std=std,
                       do_convert_rgb=flag("do_convert_rgb"), source=source)


# ---------------------------------------------------------------------------------------------------------------
# Pillow (optional)


def _pil() -> Any:
    """The PIL.Image module, or an ImportError that says how to install it."""
    try:
        from PIL import Image, ImageOps  # noqa: F401
    except ImportError:
        raise ImportError(f"reading image files and PIL images needs Pillow: {PIP_HINT} (NumPy arrays work "
                          "without it)") from None
    return Image


def _have_pil() -> bool:
    try:
        _pil()
    except ImportError:
        return False
    return True


def _is_pil_image(value: Any) -> bool:
    """True for a PIL image, without importing Pillow when the caller has not."""
    module = type(value).__module__
    if not module.startswith("PIL."):
        return False
    Image = _pil()
    return isinstance(value, Image.Image)


_WIDE_MODES = ("I", "F", "I;16", "I;16L", "I;16B", "I;16N")


def _check_wide(image: Any, name: str) -> None:
    """Empty PIL images are refused. 16-bit, 32-bit integer and float PIL images: Pillow's RGB conversion
    clips their values to [0, 255]; only images already in that range convert faithfully."""
    if image.width == 0 or image.height == 0:
        raise ValueError(f"{name}: an empty image ({image.width}x{image.height} pixels)")
    if image.mode in _WIDE_MODES:
        values = np.asarray(image)
        low, high = float(values.min()), float(values.max())
        if low < 0 or high > 255:
            raise ValueError(
                f"{name}: a {image.mode} image with values in [{low:g}, {high:g}]; converting it to RGB (as "
                "transformers does) would clip them to [0, 255]. Scale it to 8 bits first, e.g. "
                "Image.fromarray((np.asarray(img) >> 8).astype(np.uint8)) for 16-bit data")


def _pil_to_rgb(image: Any, name: str) -> np.ndarray:
    """transformers' convert_to_rgb for a PIL image: transparency composited onto white, then RGB."""
    Image = _pil()
    _check_wide(image, name)  # and empty images
    try:
        has_alpha = "A" in image.getbands() or image.info.get("transparency") is not None
        if has_alpha:
            rgba = image.convert("RGBA")
            background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            rgb = Image.alpha_composite(background, rgba).convert("RGB")
        else:
            rgb = image.convert("RGB")
        return np.asarray(rgb, dtype=np.uint8)
    except (OSError, ValueError) as error:
        raise ValueError(f"{name}: cannot convert the {image.mode} image to RGB ({error})") from None


def load_image(path: Union[str, "os.PathLike[str]"]) -> np.ndarray:
    """An image file as uint8 RGB ``[H, W, 3]``, as transformers reads it (load_image: EXIF orientation
    applied, then Pillow's RGB conversion, which drops an alpha channel; then convert_rgb). Needs Pillow."""
    Image = _pil()
    from PIL import ImageOps

    name = os.fspath(path)
    if not os.path.isfile(name):
        raise ValueError(f"{name}: no such image file")
    try:
        with Image.open(name) as image:
            image.load()
            image = ImageOps.exif_transpose(image)
            _check_wide(image, name)
            rgb = image.convert("RGB")
    except ValueError:
        raise
    except Exception as error:  # UnidentifiedImageError, truncated data, decompression bombs, ...
        raise ValueError(f"{name}: cannot read the image ({type(error).__name__}: {error})") from None
    # transformers then applies convert_rgb to that RGB image: a palette's transparent index has become a
    # transparent RGB colour (info["transparency"]), which turns white
    return _pil_to_rgb(rgb, name)


# ---------------------------------------------------------------------------------------------------------------
# Arrays


_LAYOUTS = ("HWC", "CHW", "NHWC", "NCHW")


def _channels_first(first: int, last: int, name: str, shape: Tuple[int, ...]) -> bool:
    """The layout rule: channels last if the last axis has 3 or 4 entries, else first if the first axis has 3
    or 4, else last if the last axis has 1, else first if it has 1."""
    if last in (3, 4):
        return False
    if first in (3, 4):
        return True
    if last == 1 or first == 1:
        return last != 1
    raise ValueError(f"{name}: an image has 1, 3 or 4 channels (gray, RGB, RGBA) on its first or last axis, got "
                     f"shape {shape}")


def _array_images(array: np.ndarray, name: str, layout: Optional[str]) -> List[Tuple[np.ndarray, str]]:
    """A NumPy input -> list of (HWC array, name) with 1, 3 or 4 channels; checks dtype, shape and range."""
    if array.dtype == np.uint8:
        pass
    elif np.issubdtype(array.dtype, np.floating):
        if array.size and not np.all(np.isfinite(array)):
            raise ValueError(f"{name}: a float image holds NaN or infinite values")
        if array.size and (array.min() < 0 or array.max() > 1):
            raise ValueError(f"{name}: a float image must have values in [0, 1] (uint8 images: [0, 255]), got "
                             f"[{float(array.min()):g}, {float(array.max()):g}]")
    else:
        raise ValueError(f"{name}: arrays of dtype {array.dtype} are not images; give uint8 in [0, 255] or "
                         "float in [0, 1]")
    if layout is not None and layout not in _LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(_LAYOUTS)} or None, got {layout!r}")
    channels = (1, 3, 4)
    if array.ndim == 4:
        if layout in ("HWC", "CHW"):
            raise ValueError(f"{name}: a 4-D array is a batch; layout must be NCHW or NHWC, got {layout}")
        if layout is None:
            layout = "NCHW" if _channels_first(array.shape[1], array.shape[3], name, array.shape) else "NHWC"
        if layout == "NCHW":
            array = array.transpose(0, 2, 3, 1)
        if array.shape[0] == 0:
            raise ValueError(f"{name}: an empty batch (shape {tuple(array.shape)})")
        items = [(array[i], f"{name}[{i}]") for i in range(array.shape[0])]
    elif array.ndim == 3:
        if layout in ("NHWC", "NCHW"):
            raise ValueError(f"{name}: a 3-D array is one image; layout must be HWC or CHW, got {layout}")
        if layout is None:
            layout = "CHW" if _channels_first(array.shape[0], array.shape[2], name, array.shape) else "HWC"
        items = [(array.transpose(1, 2, 0) if layout == "CHW" else array, name)]
    elif array.ndim == 2:
        items = [(array[:, :, None], name)]
    else:
        raise ValueError(f"{name}: an image array has 2 (HW), 3 (HWC or CHW) or 4 (NCHW or NHWC) dimensions, got "
                         f"shape {tuple(array.shape)}")
    for image, item in items:
        if image.shape[2] not in channels:
            raise ValueError(f"{item}: an image has 1, 3 or 4 channels (gray, RGB, RGBA), got shape "
                             f"{tuple(image.shape)} read as HWC")
        if image.shape[0] == 0 or image.shape[1] == 0:
            raise ValueError(f"{item}: an empty image (shape {tuple(image.shape)} read as HWC)")
    return items


def _array_to_rgb(image: np.ndarray) -> np.ndarray:
    """transformers' convert_to_rgb for arrays: gray repeated, RGBA composited onto white (rounded for uint8)."""
    if image.shape[2] == 1:
        return np.repeat(image, 3, axis=2)
    if image.shape[2] == 4:
        if image.dtype == np.uint8:
            alpha = image[..., 3:4] / 255
            return np.round(alpha * image[..., :3] + (1 - alpha) * 255).astype(np.uint8)
        alpha = image[..., 3:4]
        return (alpha * image[..., :3] + (1 - alpha) * 1.0).astype(image.dtype)
    return image


# ---------------------------------------------------------------------------------------------------------------
# Resizing: Pillow's Image.resize (libImaging/Resample.c, Geometry.c) in NumPy


def _filter_box(x: np.ndarray) -> np.ndarray:
    return ((x > -0.5) & (x <= 0.5)).astype(np.float64)


def _filter_bilinear(x: np.ndarray) -> np.ndarray:
    x = np.abs(x)
    return np.where(x < 1.0, 1.0 - x, 0.0)


def _filter_hamming(x: np.ndarray) -> np.ndarray:
    x = np.abs(x)
    with np.errstate(invalid="ignore", divide="ignore"):
        px = x * math.pi
        value = np.sin(px) / px * (float(np.float32(0.54)) + float(np.float32(0.46)) * np.cos(px))
    return np.where(x == 0.0, 1.0, np.where(x >= 1.0, 0.0, value))


def _filter_bicubic(x: np.ndarray) -> np.ndarray:
    a = -0.5
    x = np.abs(x)
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


def _sinc(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        px = x * math.pi
        value = np.sin(px) / px
    return np.where(x == 0.0, 1.0, value)


def _filter_lanczos(x: np.ndarray) -> np.ndarray:
    return np.where((x >= -3.0) & (x < 3.0), _sinc(x) * _sinc(x / 3), 0.0)


_FILTERS = {BOX: (_filter_box, 0.5), BILINEAR: (_filter_bilinear, 1.0), HAMMING: (_filter_hamming, 1.0),
            BICUBIC: (_filter_bicubic, 2.0), LANCZOS: (_filter_lanczos, 3.0)}
_PRECISION_BITS = 32 - 8 - 2


def _coefficients(in_size: int, out_size: int, resample: int) -> Tuple[np.ndarray, np.ndarray]:
    """Resample.c's precompute_coeffs + normalize_coeffs_8bpc: per output pixel, the first input pixel and
    ksize fixed-point weights (int32, zero past the filter's reach)."""
    filt, support = _FILTERS[resample]
    scale = float(in_size) / out_size
    filterscale = max(scale, 1.0)
    support = support * filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    center = (np.arange(out_size, dtype=np.float64) + 0.5) * scale
    xmin = np.maximum(np.trunc(center - support + 0.5), 0).astype(np.int64)
    xmax = np.minimum(np.trunc(center + support + 0.5), in_size).astype(np.int64) - xmin
    ss = 1.0 / filterscale
    taps = np.arange(ksize)
    weights = filt(((taps[None, :] + xmin[:, None]) - center[:, None] + 0.5) * ss)
    weights = np.where(taps[None, :] < xmax[:, None], weights, 0.0)
    total = np.zeros(out_size)
    for tap in range(ksize):  # sequential, as the C loop adds them
        total = total + weights[:, tap]
    weights = np.where(total[:, None] != 0.0, weights / np.where(total == 0.0, 1.0, total)[:, None], weights)
    scaled = weights * (1 << _PRECISION_BITS)
    fixed = np.trunc(np.where(weights < 0, scaled - 0.5, scaled + 0.5)).astype(np.int32)
    return xmin, fixed


_BLOCK = 16  # output pixels per banded block of a pass
# Each matrix product stays below OpenBLAS's threading threshold (m * n * k < 65536 * 4): the products are small,
# and threads would only contend (a batch of 32 images took ten times longer with them on a busy machine).
_GEMM_WORK = 200_000


def _resample_planar(planes: np.ndarray, axis: int, out_size: int, resample: int) -> np.ndarray:
    """One separable pass of Resample.c's 8-bit resampling along ``axis`` (1: rows, 2: columns) of float64
    planes ``[C, H, W]`` holding 8-bit values. The fixed-point sums are computed as float64 matrix products
    over blocks of the banded weight matrix: every product and partial sum is an integer below 2**53, so the
    result is exact, and the rounding and clipping are Pillow's (clip8)."""
    in_size = planes.shape[axis]
    xmin, fixed = _coefficients(in_size, out_size, resample)
    ksize = fixed.shape[1]
    channels, height, width = planes.shape
    if axis == 2:  # columns: [C*H, W] @ weights.T
        source = planes.reshape(channels * height, width)
        out = np.empty((channels * height, out_size), dtype=np.float64)
    else:  # rows: weights @ [H, W] per channel
        out = np.empty((channels, out_size, width), dtype=np.float64)
    taps = np.arange(ksize)
    for start in range(0, out_size, _BLOCK):
        stop = min(start + _BLOCK, out_size)
        low = int(xmin[start])
        high = min(int(xmin[stop - 1]) + ksize, in_size)
        cols = xmin[start:stop, None] - low + taps[None, :]
        inside = cols < high - low  # taps past the end of the image have zero weight
        weights = np.zeros((stop - start, high - low), dtype=np.float64)
        rows = np.broadcast_to(np.arange(stop - start)[:, None], cols.shape)
        weights[rows[inside], cols[inside]] = fixed[start:stop][inside]
        chunk = max(1, _GEMM_WORK // ((high - low) * (stop - start)))
        if axis == 2:
            block = weights.T
            for first in range(0, source.shape[0], chunk):
                last = first + chunk
                np.matmul(source[first:last, low:high], block, out=out[first:last, start:stop])
        else:
            for channel in range(channels):
                for first in range(0, width, chunk):
                    last = first + chunk
                    np.matmul(weights, planes[channel, low:high, first:last],
                              out=out[channel, start:stop, first:last])
    if axis == 2:
        out = out.reshape(channels, height, out_size)
    out += float(1 << (_PRECISION_BITS - 1))
    out *= 1.0 / (1 << _PRECISION_BITS)  # a power of two: exact
    np.floor(out, out=out)
    return np.clip(out, 0.0, 255.0, out=out)


def _nearest_indices(in_size: int, out_size: int) -> np.ndarray:
    """Geometry.c's ImagingScaleAffine: the source position accumulates the step, truncated (COORD)."""
    step = float(in_size) / out_size
    positions = np.empty(out_size, dtype=np.float64)
    positions[0] = 0.0 + step * 0.5
    positions[1:] = step
    positions = np.add.accumulate(positions)
    return np.clip(positions.astype(np.int64), 0, in_size - 1)


def resize(image: np.ndarray, size: Tuple[int, int], resample: int = BILINEAR) -> np.ndarray:
    """Pillow's ``Image.fromarray(image).resize((width, height), resample)`` for a uint8 ``[H, W, C]`` array,
    in NumPy: the same bytes, without Pillow. ``size`` is (height, width)."""
    if image.dtype != np.uint8 or image.ndim != 3:
        raise ValueError(f"resize takes a uint8 [H, W, C] array, got {image.dtype} of shape {tuple(image.shape)}")
    if resample not in RESAMPLE_NAMES:
        raise ValueError(f"resample must be one of PIL's codes {sorted(RESAMPLE_NAMES)}, got {resample!r}")
    height, width = int(size[0]), int(size[1])
    if height <= 0 or width <= 0:
        raise ValueError(f"resize to {height}x{width}: sizes must be positive")
    if (height, width) == image.shape[:2]:
        return image.copy()
    if resample == NEAREST:
        rows = _nearest_indices(image.shape[0], height)
        cols = _nearest_indices(image.shape[1], width)
        return np.ascontiguousarray(image[rows][:, cols])
    in_height, in_width = image.shape[:2]
    planes = image.transpose(2, 0, 1).astype(np.float64, order="C")
    # Pillow (Resample.c, since 12.x): the vertical pass goes first when the height shrinks by more than twice
    # as many pixels as the width does
    vertical_first = in_height - height > 0 and in_height - height > (in_width - width) * 2
    if vertical_first and height != in_height:
        planes = _resample_planar(planes, 1, height, resample)
    if width != in_width:
        planes = _resample_planar(planes, 2, width, resample)
    if not vertical_first and height != in_height:
        planes = _resample_planar(planes, 1, height, resample)
    image = np.ascontiguousarray(planes.transpose(1, 2, 0)).astype(np.uint8)
    return image


def _resize_pil(image: np.ndarray, size: Tuple[int, int], resample: int) -> np.ndarray:
    Image = _pil()
    height, width = size
    return np.asarray(Image.fromarray(image).resize((width, height), resample=resample), dtype=np.uint8)


# ---------------------------------------------------------------------------------------------------------------
# preprocess


def _target_size(height: int, width: int, config: ImageConfig) -> Tuple[int, int]:
    """transformers' get_resize_output_image_size (default_to_square=False) or the fixed (height, width)."""
    if config.size is not None:
        return config.size
    edge = int(config.shortest_edge)  # type: ignore[arg-type]
    short, long = (width, height) if width <= height else (height, width)
    new_long = int(edge * long / short)
    return (new_long, edge) if width <= height else (edge, new_long)


def _center_crop(image: np.ndarray, size: Tuple[int, int]) -> np.ndarray:
    """transformers' center_crop (image_transforms.py) for [H, W, C]: zero padding where the image is smaller."""
    height, width = image.shape[:2]
    crop_h, crop_w = size
    top = (height - crop_h) // 2
    left = (width - crop_w) // 2
    if top >= 0 and left >= 0 and top + crop_h <= height and left + crop_w <= width:
        return image[top:top + crop_h, left:left + crop_w]
    new_h, new_w = max(crop_h, height), max(crop_w, width)
    padded = np.zeros((new_h, new_w) + image.shape[2:], dtype=image.dtype)
    top_pad = math.ceil((new_h - height) / 2)
    left_pad = math.ceil((new_w - width) / 2)
    padded[top_pad:top_pad + height, left_pad:left_pad + width] = image
    top += top_pad
    left += left_pad
    return padded[max(0, top):min(new_h, top + crop_h), max(0, left):min(new_w, left + crop_w)]


ImageInput = Any


def _collect(images: ImageInput, layout: Optional[str]) -> List[Tuple[Any, str]]:
    """The input as a list of (image, name): each image a path, a PIL image or an HWC array."""
    if isinstance(images, np.ndarray):
        return list(_array_images(images, "image", layout))
    if isinstance(images, (str, os.PathLike)) or _is_pil_image(images):
        return [(images, "image 0")]
    if isinstance(images, (list, tuple)):
        if not images:
            raise ValueError("images: an empty batch")
        out: List[Tuple[Any, str]] = []
        for index, image in enumerate(images):
            name = f"image {index}"
            if isinstance(image, np.ndarray):
                if image.ndim == 4:
                    raise ValueError(f"{name}: a 4-D array inside a list; give the batch array itself or a list "
                                     "of 2-D/3-D images")
                out.extend(_array_images(image, name, layout))
            elif isinstance(image, (str, os.PathLike)) or _is_pil_image(image):
                out.append((image, name))
            else:
                raise TypeError(f"{name}: expected a file path, a PIL image or a NumPy array, got "
                                f"{type(image).__name__}")
        return out
    raise TypeError(f"images: expected a file path, a PIL image, a NumPy array or a list of them, got "
                    f"{type(images).__name__}")


def _pixels(image: Any, name: str) -> np.ndarray:
    """An RGB HWC array: uint8, or float64 holding the 8-bit values (x * 255) of a float image."""
    if isinstance(image, np.ndarray):
        rgb = _array_to_rgb(image)
        return rgb if rgb.dtype == np.uint8 else rgb.astype(np.float64) * 255.0
    if isinstance(image, (str, os.PathLike)):
        return _relabel(load_image, image, name)
    return _pil_to_rgb(image, name)


def _relabel(function: Any, argument: Any, name: str) -> np.ndarray:
    try:
        return function(argument)
    except ValueError as error:
        raise ValueError(f"{name}: {error}") from None


def preprocess(images: ImageInput, config: ImageConfig, *, layout: Optional[str] = None,
               backend: str = "auto") -> np.ndarray:
    """Images -> float32 pixel values ``[B, 3, H, W]`` as the checkpoint's image processor makes them.

    ``images``: one image or a list of them: file paths (Pillow), PIL images (Pillow) or NumPy arrays (uint8 in
    [0, 255] or float in [0, 1]; HW, HWC or CHW, or a 4-D NCHW/NHWC batch; ``layout`` forces the reading).
    ``backend``: "pil" resizes with Pillow, "numpy" with this module's port of it (identical results), "auto"
    with Pillow when it is installed. Bad input raises a ValueError (TypeError for non-images) naming it."""
    if not isinstance(config, ImageConfig):
        raise TypeError(f"config must be an ImageConfig (read_image_config), got {type(config).__name__}")
    if backend not in ("auto", "pil", "numpy"):
        raise ValueError(f"backend must be 'auto', 'pil' or 'numpy', got {backend!r}")
    use_pil = backend == "pil" or (backend == "auto" and _have_pil())
    if backend == "pil":
        _pil()
    items = _collect(images, layout)
    mean = np.asarray(config.image_mean, dtype=np.float32)
    std = np.asarray(config.image_std, dtype=np.float32)
    out: Optional[np.ndarray] = None
    for index, (image, name) in enumerate(items):
        pixels = _pixels(image, name)
        if config.do_resize:
            target = _target_size(pixels.shape[0], pixels.shape[1], config)
            if pixels.dtype != np.uint8:  # a float image: to 8 bits, as transformers' PIL resize does
                pixels = np.clip(np.rint(pixels), 0, 255).astype(np.uint8)
            if target != pixels.shape[:2]:
                pixels = _resize_pil(pixels, target, config.resample) if use_pil else resize(
                    pixels, target, config.resample)
        if config.do_center_crop:
            pixels = _center_crop(pixels, config.crop_size)  # type: ignore[arg-type]
        if config.do_rescale:
            values = (pixels.astype(np.float64) * config.rescale_factor).astype(np.float32)
        else:
            values = pixels.astype(np.float32)
        if config.do_normalize:
            values = (values - mean) / std
        if out is None:
            out = np.empty((len(items), 3) + values.shape[:2], dtype=np.float32)
        elif values.shape[:2] != out.shape[2:]:
            raise ValueError(f"{name}: preprocessed to {values.shape[0]}x{values.shape[1]} but image 0 to "
                             f"{out.shape[2]}x{out.shape[3]}; {config.source} has no center crop to make them "
                             "one size, so give images of one aspect ratio or one at a time")
        out[index] = values.transpose(2, 0, 1)
    assert out is not None
    return out


def pil_available() -> bool:
    """Whether Pillow can be imported (file paths and PIL images need it)."""
    return _have_pil()


__all__ = ["ImageConfig", "read_image_config", "preprocess", "load_image", "resize", "pil_available",
           "CONFIG_NAME", "SUPPORTED_TYPES", "NEAREST", "LANCZOS", "BILINEAR", "BICUBIC", "BOX", "HAMMING"]

