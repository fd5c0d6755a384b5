"""Vision throughput: cpuformer vs PyTorch (transformers) and ONNX Runtime on image models, same
weights, every engine in its own process (issue 18, "Benchmarks" and "Targets").

Rows (2 threads unless --threads; --rows picks some, all by default):
  * ``vit``: ViT-B/16 (ViTForImageClassification, random weights, real shape: 12 layers, hidden
    768, patch 16, 224 × 224, 1000 labels) at batch 1 and batch 8: cpuformer ``logits`` float32 and
    int8, PyTorch float32 (inference_mode), ONNX Runtime float32 (torch.onnx.export, opset 17,
    dynamic batch, fused by onnxruntime.transformers.optimizer with model_type="vit" after the
    attention's score scaling is rewritten from ``* 1/8`` to ``/ 8``, the form its attention fusion
    matches) and int8 (quantize_dynamic of the fused model);
  * ``swin``: Swin-T (SwinForImageClassification: embed_dim 96, depths [2, 2, 6, 2], heads
    [3, 6, 12, 24], window 7, 224 × 224, 1000 labels) at batch 8, float32: cpuformer ``logits`` when
    ``cpuformer.load`` can open Swin checkpoints (the cell says "not supported" otherwise and fills in
    by itself once it can), PyTorch, ONNX Runtime (model_type="swin");
  * ``clip``: CLIP ViT-B/32 image embeddings (CLIPModel with openai/clip-vit-base-patch32's shapes:
    vision tower 768 wide, 12 layers, patch 32, 224 × 224; text tower 512 wide, 12 layers;
    projection 512) at batch 32, float32: cpuformer ``CLIP.get_image_features``, PyTorch
    ``get_image_features``, ONNX Runtime (the vision tower and projection exported through a module
    that calls get_image_features, model_type="clip");
  * ``preprocess``: the share of image preprocessing in end-to-end CLIP ViT-B/32 embedding, batch
    32 at 224 × 224, cpuformer float32: ``embed_images(images)`` on 32 synthetic 480 × 640 images
    (NumPy uint8 arrays, and the same images as JPEG files read with Pillow) against
    ``embed_images(pixel_values)`` on the already preprocessed batch; also ``preprocess`` alone.
    The five calls are measured in turn in one process (at least 3 calls each, the median call of
    each, so that a drift of the machine's speed stays out of the ratios). The preprocessing share
    is 1 − (end-to-end images/s) / (model-only images/s), target ≤ 20 %; also given: the time of
    ``preprocess`` alone over the end-to-end time, which a busy machine disturbs less (it does not
    subtract two large times).

Each (row, engine, dtype) runs in a fresh child process (``--child run``): torch, ONNX Runtime and
cpuformer each bring their own thread pool, and in one process one engine's spinning threads steal
the other's cores. The parent builds the models once (``--child prepare``, in a child; with --cache
they are kept and reused), then runs --rounds rounds; each round measures the compute peak
(``ops.peak_gops`` float32 and int8, in a child) and starts every engine once, in an order that
rotates from round to round, and each child times one round of at least --seconds per batch size
after a warm-up. A row's rate is the median over rounds (the best round in brackets). cpuformer's
rows also give the fraction of the measured compute peak: 2 · multiply-adds of the model (counted
by torch.utils.flop_counter on the transformers model, batch 1: the matrix products, convolution
and attention) × images/s over ``ops.peak_gops`` of the row's dtype (its median over rounds).
Correctness: each row's maximum relative error against PyTorch (max |out − ref| / max |ref| of
the logits or image features) and the lowest per-image cosine. Prints a table and writes
benchmarks/results/vision_<date>.json (machine from lscpu, date, settings, numbers). Never
asserts a time.

``--quick``: 2-layer versions of the models (Swin: depths [2, 2, 2, 2]), one 0.3 s round, to
check that every engine runs (2.7-3.4 minutes from scratch on the shared 2-core development
machine at load average 3.6, 75 s of it building and exporting the models, which a warm --cache skips);
its numbers mean nothing. A full run (real depths, 3 rounds) takes about 13-15 minutes on an
idle 2-core AVX2 machine, about 20 under load (3 of them building, skipped with a warm --cache).

    python benchmarks/bench_vision.py [--quick] [--rows vit,swin,clip,preprocess] [--rounds 3]
                                      [--seconds 2] [--threads 2] [--cache DIR] [--out PATH]
                                      [--no-ort] [--no-torch] [--layers N]

Peers need ``pip install -e '.[bench]'`` (torch, transformers, onnxruntime, onnx, onnxscript,
Pillow); a peer whose build fails is reported and skipped.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _timing import engine_round, max_relative_error, ort_session, peer_step, run_script  # noqa: E402

RESULTS = os.path.join(HERE, "results")
ROWS = ("vit", "swin", "clip", "preprocess")
BATCHES = {"vit": (1, 8), "swin": (8,), "clip": (32,), "preprocess": (32,)}
IMAGE_SIZE = 224
MODEL_NAMES = {"vit": "ViT-B/16", "swin": "Swin-T", "clip": "CLIP ViT-B/32 image features",
               "preprocess": "CLIP ViT-B/32 embed_images"}
PREPROCESS_TARGET = 0.20
SOURCE_IMAGE = (480, 640)  # the synthetic images of the preprocessing row (height, width)


def _cpuformer():
    """cpuformer, imported only where it runs: a peer's child never loads its OpenMP runtime."""
    import cpuformer

    return cpuformer


def result_name(row: str, batch: int) -> str:
    return {"vit": f"vit_b16_b{batch}", "swin": f"swin_t_b{batch}", "clip": f"clip_b32_image_b{batch}",
            "preprocess": f"clip_b32_preprocess_b{batch}"}[row]


# ---- building the models (the prepare child) -------------------------------------------------

def build_vit(directory: str, layers=None) -> None:
    """ViT-B/16 at 224 × 224 with 1000 labels (google/vit-base-patch16-224's shape), random weights."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.ViTConfig(image_size=IMAGE_SIZE, patch_size=16, num_labels=1000,
                                    num_hidden_layers=layers or 12)
    transformers.ViTForImageClassification(config).eval().save_pretrained(directory, safe_serialization=True)
    transformers.ViTImageProcessor().save_pretrained(directory)


def build_swin(directory: str, layers=None) -> None:
    """Swin-T (microsoft/swin-tiny-patch4-window7-224's shape) with 1000 labels, random weights;
    quick runs (layers set) take depths [2, 2, 2, 2]."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.SwinConfig(image_size=IMAGE_SIZE, patch_size=4, embed_dim=96,
                                     depths=[2, 2, 2, 2] if layers else [2, 2, 6, 2], num_heads=[3, 6, 12, 24],
                                     window_size=7, num_labels=1000)
    transformers.SwinForImageClassification(config).eval().save_pretrained(directory, safe_serialization=True)
    transformers.ViTImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}).save_pretrained(directory)


def build_clip(directory: str, layers=None) -> None:
    """CLIPModel with openai/clip-vit-base-patch32's shapes (the transformers defaults), random weights,
    and CLIPImageProcessor's preprocessor_config.json (shortest edge 224, bicubic, center crop)."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.CLIPConfig(
        text_config={"num_hidden_layers": layers or 12},
        vision_config={"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": layers or 12,
                       "num_attention_heads": 12, "patch_size": 32, "image_size": IMAGE_SIZE},
        projection_dim=512)
    transformers.CLIPModel(config).eval().save_pretrained(directory, safe_serialization=True)
    transformers.CLIPImageProcessor().save_pretrained(directory)


BUILDERS = {"vit": build_vit, "swin": build_swin, "clip": build_clip}
MODEL_CLASSES = {"vit": "ViTForImageClassification", "swin": "SwinForImageClassification", "clip": "CLIPModel"}
# optimizer settings per row: (model_type, num_heads, hidden_size); 0 lets the optimizer detect them
ORT_OPTIMIZER = {"vit": ("vit", 12, 768), "swin": ("swin", 0, 0), "clip": ("clip", 12, 768)}


def _torch_output(row: str, model, pixel_values):
    """What every engine's row is compared on: the logits (ViT, Swin) or the image features (CLIP)."""
    if row == "clip":
        out = model.get_image_features(pixel_values=pixel_values)
        return out if not hasattr(out, "pooler_output") else out.pooler_output
    return model(pixel_values=pixel_values).logits


def count_flops(row: str, directory: str) -> float:
    """2 · multiply-adds of one image through the transformers model (torch.utils.flop_counter:
    the matrix products, the convolution and the attention products; eager attention so that its
    products are counted as such)."""
    import torch
    import transformers
    from torch.utils.flop_counter import FlopCounterMode

    model = getattr(transformers, MODEL_CLASSES[row]).from_pretrained(directory, attn_implementation="eager").eval()
    pixels = torch.zeros(1, 3, IMAGE_SIZE, IMAGE_SIZE)
    counter = FlopCounterMode(display=False)
    with torch.inference_mode(), counter:
        _torch_output(row, model, pixels)
    return float(counter.get_total_flops())


def scale_mul_to_div(model) -> int:
    """Rewrites every Softmax(MatMul(q, k) * s) of an ONNX graph (s a scalar constant) into
    Softmax(MatMul(q, k) / (1 / s)), in place; returns how many it rewrote."""
    import onnx
    from onnx import numpy_helper

    graph = model.graph
    producers = {output: node for node in graph.node for output in node.output}
    constants = {tensor.name: tensor for tensor in graph.initializer}
    constants.update({node.output[0]: node.attribute[0].t for node in graph.node
                      if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value"})
    rewritten = 0
    for softmax in [node for node in graph.node if node.op_type == "Softmax"]:
        mul = producers.get(softmax.input[0])
        if mul is None or mul.op_type != "Mul":
            continue
        first, second = mul.input
        for product, scale in ((first, second), (second, first)):
            source = producers.get(product)
            if source is not None and source.op_type == "MatMul" and scale in constants:
                break
        else:
            continue
        value = numpy_helper.to_array(constants[scale])
        if value.size != 1 or not np.isfinite(value).all() or float(value.reshape(-1)[0]) == 0:
            continue
        name = f"{scale}_reciprocal_{rewritten}"
        graph.initializer.append(numpy_helper.from_array((1 / value).astype(value.dtype), name))
        mul.op_type = "Div"
        mul.input[:] = [product, name]
        rewritten += 1
    onnx.checker.check_model(model)
    return rewritten


def export_onnx(row: str, model_directory: str, out_directory: str, example_batch: int, log: dict,
                int8: bool) -> None:
    """model_fp32.onnx (exported with torch.onnx.export, opset 17, dynamic batch, fused by ONNX
    Runtime's transformer optimizer for the row's model_type) and, when int8, model_int8.onnx
    (quantize_dynamic of the fused model): the bench_encoder.py recipe."""
    import onnx
    import torch
    import transformers
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers.optimizer import MODEL_TYPES, optimize_model

    os.makedirs(out_directory, exist_ok=True)
    # eager attention: the optimizer's attention fusion matches its pattern, not SDPA's
    model = getattr(transformers, MODEL_CLASSES[row]).from_pretrained(model_directory,
                                                                      attn_implementation="eager").eval()

    class Output(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, pixel_values):
            return _torch_output(row, self.inner, pixel_values)

    raw = os.path.join(out_directory, "model_raw.onnx")
    pixels = torch.zeros(example_batch, 3, IMAGE_SIZE, IMAGE_SIZE)
    # .eval() on the wrapper: export restores the wrapper's mode on the whole tree afterwards
    torch.onnx.export(Output(model).eval(), (pixels,), raw, dynamo=False, opset_version=17,
                      input_names=["pixel_values"], output_names=["output"],
                      dynamic_axes={"pixel_values": {0: "batch"}, "output": {0: "batch"}})
    if row == "vit":
        # transformers 5 scales the scores with a Mul after QK^T; the optimizer's attention fusion
        # knows Softmax(MatMul / c) (path5), not Softmax(MatMul * s): without this rewrite it fuses
        # no Attention for ViT. s = 1/8 is a power of two, so the division is bit-identical.
        model_proto = onnx.load(raw)
        log["scale_mul_to_div"] = scale_mul_to_div(model_proto)
        onnx.save(model_proto, raw)
    model_type, num_heads, hidden_size = ORT_OPTIMIZER[row]
    if model_type not in MODEL_TYPES:  # an older onnxruntime: its BERT fusions are the closest
        log["optimizer_fallback"] = f"model_type {model_type!r} unknown to this onnxruntime; used 'bert'"
        model_type = "bert"
    fused = optimize_model(raw, model_type=model_type, num_heads=num_heads, hidden_size=hidden_size)
    log["optimizer_model_type"] = model_type
    log["fused_operators"] = {k: v for k, v in fused.get_fused_operator_statistics().items() if v}
    fp32 = os.path.join(out_directory, "model_fp32.onnx")
    fused.save_model_to_file(fp32)
    if int8:
        quantize_dynamic(fp32, os.path.join(out_directory, "model_int8.onnx"), weight_type=QuantType.QInt8,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    os.remove(raw)


def synthetic_image(index: int, height: int = SOURCE_IMAGE[0], width: int = SOURCE_IMAGE[1]) -> np.ndarray:
    """A deterministic uint8 RGB photo stand-in [height, width, 3]: gradients, a disc, a band and
    some noise (so JPEG has detail to encode)."""
    rng = np.random.default_rng(100 + index)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    cy, cx, r = rng.uniform(0.2, 0.8) * height, rng.uniform(0.2, 0.8) * width, rng.uniform(0.1, 0.3) * height
    disc = ((y - cy) ** 2 + (x - cx) ** 2 < r * r).astype(np.float32)
    band = (np.abs((x - y * rng.uniform(-1, 1)) % 97 - 48) < 12).astype(np.float32)
    channels = [255 * (0.5 + 0.5 * np.sin(x / rng.uniform(20, 80) + y / rng.uniform(20, 80) + c)) for c in range(3)]
    image = np.stack(channels, axis=-1) * (1 - 0.5 * disc[..., None]) + 60 * band[..., None]
    image += rng.normal(0, 8, image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def write_jpegs(directory: str, count: int) -> list:
    from PIL import Image

    os.makedirs(directory, exist_ok=True)
    paths = []
    for i in range(count):
        path = os.path.join(directory, f"image_{i:03d}.jpg")
        Image.fromarray(synthetic_image(i)).save(path, quality=90)
        paths.append(path)
    return paths


def model_row(row: str) -> str:
    """The row whose checkpoint a row runs (the preprocessing row uses CLIP's)."""
    return "clip" if row == "preprocess" else row


def prepare(row: str, work: str, peers: list, layers=None) -> dict:
    """Builds the row's model, its inputs and its ONNX files under work/<model row> (once: a finished
    build is reused) and returns its manifest: which peers are ready, the FLOPs per image, how the
    ONNX files were built."""
    base = os.path.join(work, model_row(row))
    manifest_path = os.path.join(base, f"manifest_{row}.json")
    if os.path.exists(manifest_path):
        with open(manifest_path) as f:
            manifest = json.load(f)
        if set(peers) <= set(manifest.get("peers_asked", [])):
            return manifest
    os.makedirs(base, exist_ok=True)
    manifest: dict = {"peers_asked": peers}
    hf = os.path.join(base, "hf")
    if not os.path.exists(os.path.join(hf, "config.json")):
        BUILDERS[model_row(row)](hf, layers)
    flops_path = os.path.join(base, "flops.json")
    if not os.path.exists(flops_path):
        with open(flops_path, "w") as f:
            json.dump({"flops_per_image": count_flops(model_row(row), hf)}, f)
    with open(flops_path) as f:
        manifest.update(json.load(f))
    rng = np.random.default_rng(0)
    np.savez(os.path.join(base, "inputs.npz"),
             **{f"b{b}": rng.uniform(-1, 1, (b, 3, IMAGE_SIZE, IMAGE_SIZE)).astype(np.float32)
                for b in BATCHES[model_row(row)]})
    if row == "preprocess":
        write_jpegs(os.path.join(base, "jpeg"), max(BATCHES[row]))
    elif "onnxruntime" in peers:
        onnx_log: dict = {}
        peer_step(manifest, "onnxruntime",
                   lambda: export_onnx(row, hf, os.path.join(base, "onnx"), max(BATCHES[row]), onnx_log,
                                       int8=row == "vit"))
        manifest["onnxruntime_build"] = onnx_log
    with open(manifest_path, "w") as f:
        json.dump(manifest, f, indent=2)
    return manifest


# ---- running one engine (the run child) ------------------------------------------------------

class NotSupported(Exception):
    """The engine cannot run this row's model (a cell that says so instead of a number)."""


def measure(fn, images: int, min_seconds: float, warm_up: bool = True) -> float:
    """Images/s of one timed round of at least min_seconds after one warm-up call (none when the
    caller has just run fn: the outputs of round 0 are a warm-up)."""
    if warm_up:
        fn()  # allocations, page faults, lazy init
    calls, start = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            break
    return calls * images / elapsed


def measure_interleaved(fns: dict, images: int, min_seconds: float, warm_up=None, min_calls: int = 2) -> dict:
    """Images/s of each of `fns` ({label: fn}), calling them in turn (one warm-up call of each
    label in `warm_up`, default all, then cycles of one call of each until every label has at
    least min_calls calls and min_seconds of time): the median call per label. Interleaving keeps
    a drift of the machine's speed out of the ratios between labels."""
    for label in fns if warm_up is None else warm_up:
        fns[label]()
    times: dict = {label: [] for label in fns}
    while True:
        for label, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[label].append(time.perf_counter() - start)
        if all(len(t) >= min_calls and sum(t) >= min_seconds for t in times.values()):
            break
    return {label: images / statistics.median(t) for label, t in times.items()}


def _inputs(base: str) -> dict:
    with np.load(os.path.join(base, "inputs.npz")) as data:
        return {int(k[1:]): data[k] for k in data.files}


def engine_runner(engine: str, dtype: str, row: str, work: str, threads: int):
    """(engine version, {label: (fn, images)}, outputs) of one engine on one row: fn runs one call,
    outputs() returns the arrays the correctness check compares ({label: output})."""
    base = os.path.join(work, model_row(row))
    hf = os.path.join(base, "hf")
    inputs = _inputs(base)
    runs = {}
    if row == "preprocess":
        if engine != "cpuformer":
            raise ValueError(f"engine {engine!r} does not run the preprocess row")
        cf = _cpuformer()
        cf.set_num_threads(threads)  # ops' default too: older builds ran the patch embedding and heads on it
        model = cf.load(hf, num_threads=threads)
        pixels = inputs[BATCHES[row][0]]
        count = len(pixels)
        arrays = [synthetic_image(i) for i in range(count)]
        paths = [os.path.join(base, "jpeg", f"image_{i:03d}.jpg") for i in range(count)]
        real_pixels = model.preprocess(arrays)  # the model-only call runs on real preprocessed images
        runs = {"model_only": (lambda: model.embed_images(real_pixels, batch_size=count), count),
                "end_to_end_arrays": (lambda: model.embed_images(arrays, batch_size=count), count),
                "end_to_end_jpeg": (lambda: model.embed_images(paths, batch_size=count), count),
                "preprocess_arrays": (lambda: model.preprocess(arrays), count),
                "preprocess_jpeg": (lambda: model.preprocess(paths), count)}
        return cf.__version__, runs, lambda: {}
    if engine == "cpuformer":
        cf = _cpuformer()
        cf.set_num_threads(threads)  # ops' default too: older builds ran the patch embedding and heads on it
        try:
            if dtype == "float32_high":  # float32 weights, bfloat16x3 tiles on AMX-BF16
                cf.set_float32_matmul_precision("high")
            model = cf.load(hf, dtype=None if dtype in ("float32", "float32_high") else dtype, num_threads=threads)
        except (NotImplementedError, ValueError) as error:
            if row == "swin":  # a build without Swin (before models/swin.py): say so, run the peers
                raise NotSupported(f"{type(error).__name__}: {error}") from error
            raise
        call = model.get_image_features if row == "clip" else model.logits
        version = cf.__version__
        for batch, pixels in inputs.items():
            runs[f"b{batch}"] = (lambda pixels=pixels: call(pixels), batch)
    elif engine == "pytorch":
        import torch
        import transformers

        torch.set_num_threads(threads)
        model = getattr(transformers, MODEL_CLASSES[row]).from_pretrained(hf).eval()
        version = f"torch {torch.__version__}, transformers {transformers.__version__}"
        for batch, pixels in inputs.items():
            tensor = torch.from_numpy(pixels)

            def fn(tensor=tensor):
                with torch.inference_mode():
                    return _torch_output(row, model, tensor).numpy()

            runs[f"b{batch}"] = (fn, batch)
    elif engine == "onnxruntime":
        import onnxruntime

        name = "model_fp32.onnx" if dtype == "float32" else "model_int8.onnx"
        session = ort_session(os.path.join(base, "onnx", name), threads)
        version = onnxruntime.__version__
        for batch, pixels in inputs.items():
            runs[f"b{batch}"] = (lambda pixels=pixels: session.run(None, {"pixel_values": pixels})[0], batch)
    else:
        raise ValueError(f"unknown engine {engine!r}")
    return version, runs, lambda: {label: fn() for label, (fn, _) in runs.items()}


def run_child(args) -> dict:
    """One engine on one row: a warm-up, the outputs (when asked), one timed round per batch size."""
    start = time.perf_counter()
    try:
        version, runs, outputs = engine_runner(args.engine, args.dtype, args.row, args.work, args.threads)
    except NotSupported as error:  # the first 300 characters: "unknown architecture" lists every supported one
        message = str(error)
        return {"not_supported": message if len(message) <= 300 else message[:300] + " ..."}
    result = {"version": version, "load_seconds": time.perf_counter() - start, "rates": {}}
    if args.outputs:
        saved = {label: np.asarray(value, dtype=np.float32) for label, value in outputs().items()}
        np.savez(args.outputs, **saved)
    if args.row == "preprocess":  # the shares compare these labels: measured in turn
        # the end-to-end calls are the model's and preprocess's: their warm-ups warm them up too
        result["rates"] = measure_interleaved({label: fn for label, (fn, _) in runs.items()},
                                              BATCHES["preprocess"][0], args.seconds,
                                              warm_up=("model_only", "preprocess_arrays", "preprocess_jpeg"),
                                              min_calls=3)
        return result
    # each batch size's warm-up comes right before its timing: the other size's calls may have
    # left other buffers behind; the outputs (round 0) warm up the last batch size
    labels = list(runs)
    for label, (fn, images) in runs.items():
        warmed = bool(args.outputs) and label == labels[-1]
        result["rates"][label] = measure(fn, images, args.seconds, warm_up=not warmed)
    return result


def peak_child(seconds: float, threads: int) -> dict:
    cf = _cpuformer()
    cf.set_num_threads(threads)
    return {dtype: cf.ops.peak_gops(dtype, seconds=seconds) for dtype in ("float32", "int8")}


# ---- the parent ------------------------------------------------------------------------------

def engines_of(row: str, peers: list, float32_high: bool = False) -> list:
    """(result key, engine, dtype) of a row; the peers are those whose build succeeded;
    float32_high adds cpuformer float32 at float32 matmul precision "high" (--float32-high)."""
    if row == "preprocess":
        return [("cpuformer", "cpuformer", "float32")]
    rows = [("cpuformer", "cpuformer", "float32")]
    if float32_high:
        rows.append(("cpuformer_float32_high", "cpuformer", "float32_high"))
    if row == "vit":
        rows.append(("cpuformer_int8", "cpuformer", "int8"))
    if "pytorch" in peers:
        rows.append(("pytorch", "pytorch", "float32"))
    if "onnxruntime" in peers:
        rows.append(("onnxruntime_fp32", "onnxruntime", "float32"))
        if row == "vit":
            rows.append(("onnxruntime_int8", "onnxruntime", "int8"))
    return rows


def min_cosine(out: np.ndarray, reference: np.ndarray) -> float:
    a, b = out.reshape(len(out), -1).astype(np.float64), reference.reshape(len(reference), -1).astype(np.float64)
    return float(np.min(np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))))


def correctness(key: str, outputs: dict, label: str) -> dict:
    reference = outputs.get("pytorch", {}).get(label)
    out = outputs.get(key, {}).get(label)
    if reference is None or out is None or key == "pytorch":
        return {}
    return {"max_rel_error_vs_pytorch": max_relative_error(out, reference),
            "min_cosine_vs_pytorch": min_cosine(out, reference)}


def _ratios(entry: dict) -> None:
    """entry["ratios"]["cpuformer_int8/onnxruntime_int8"] = cpuformer's rate over the peer's, for
    every cpuformer row and every peer row that ran (medians)."""
    measured = {k: v for k, v in entry.items() if isinstance(v, dict) and "img_per_s" in v}
    ours = [k for k in measured if k == "cpuformer" or k.startswith("cpuformer_")]
    peers = [k for k in measured if k not in ours]
    ratios = {f"{a}/{b}": measured[a]["img_per_s"] / measured[b]["img_per_s"] for a in ours for b in peers}
    if ratios:
        entry["ratios"] = ratios


def _preprocess_entry(series: dict, info: dict) -> dict:
    """The preprocessing row: every measurement's median images/s and the preprocessing shares."""
    entry: dict = {"model": MODEL_NAMES["preprocess"], "batch": BATCHES["preprocess"][0],
                   "image_size": IMAGE_SIZE, "source_images": f"{SOURCE_IMAGE[0]}x{SOURCE_IMAGE[1]} uint8 RGB",
                   "engine": "cpuformer float32", "version": info.get("version"), "target_share": PREPROCESS_TARGET}
    for label, rates in series.items():
        entry[label] = {"img_per_s": statistics.median(rates), "best": max(rates), "rounds": rates}
    model = entry.get("model_only", {}).get("img_per_s")
    for source in ("arrays", "jpeg"):
        e2e = entry.get(f"end_to_end_{source}", {}).get("img_per_s")
        pre = entry.get(f"preprocess_{source}", {}).get("img_per_s")
        if model and e2e:
            # per image: end-to-end time 1/e2e, model time 1/model; the rest is preprocessing
            entry[f"preprocess_share_{source}"] = 1 - e2e / model
        if pre and e2e:
            entry[f"preprocess_alone_share_{source}"] = e2e / pre
    return entry


def measure_peak(args, work: str) -> dict:
    """ops.peak_gops of float32 and int8 on --threads threads, in a child of its own (cpuformer's
    threads then leave the parent idle); {} when it fails."""
    handle, path = tempfile.mkstemp(suffix=".json", dir=work)
    os.close(handle)
    try:
        code, err = run_script(__file__, ["--child", "peak", "--seconds", "0.3" if args.quick else "0.6", "--threads",
                            str(args.threads), "--result", path], args.timeout)
        if code != 0:
            print(f"  measuring the compute peak failed:\n{err}", file=sys.stderr)
            return {}
        with open(path) as f:
            peaks = json.load(f)
        print("  compute peak (ops.peak_gops): " + ", ".join(f"{k} {v:.0f} GOP/s" for k, v in peaks.items()),
              flush=True)
        return peaks
    finally:
        os.remove(path)


def run_benchmark(args) -> tuple:
    """(results, {dtype: [compute peak per round]})."""
    root = args.cache or tempfile.mkdtemp(prefix="cpuformer_vision_bench_")
    # models of another depth are other models: each depth has its own directory in the cache
    work = os.path.join(root, f"{args.layers}_layers" if args.layers else "real_depth")
    os.makedirs(work, exist_ok=True)
    peers = [p for p, off in (("pytorch", args.no_torch), ("onnxruntime", args.no_ort)) if not off]
    plan = []  # (row, key, engine, dtype)
    results: dict = {}
    manifests: dict = {}
    for row in args.rows:
        print(f"preparing {row} ...", flush=True)
        started = time.perf_counter()
        argv = ["--child", "prepare", "--row", row, "--work", work, "--peers", ",".join(peers) or "none"]
        code, err = run_script(__file__, argv + (["--layers", str(args.layers)] if args.layers else []), args.timeout)
        if code != 0:
            print(f"  {row} skipped: preparing it failed:\n{err}", file=sys.stderr)
            for batch in BATCHES[row]:
                results[result_name(row, batch)] = {"skipped": f"preparing failed: {err}"}
            continue
        with open(os.path.join(work, model_row(row), f"manifest_{row}.json")) as f:
            manifests[row] = manifest = json.load(f)
        # PyTorch needs no build step: it is ready when asked for
        ready = [p for p in peers if p == "pytorch" or manifest.get(p) == "ok"]
        print(f"  ready in {time.perf_counter() - started:.0f} s; peers {', '.join(ready) or 'none'}"
              + "".join(f"; {p} {manifest[p]}" for p in peers if manifest.get(p, "ok") != "ok"), flush=True)
        if row != "preprocess":
            for batch in BATCHES[row]:
                entry = results.setdefault(result_name(row, batch), {
                    "model": MODEL_NAMES[row], "batch": batch, "image_size": IMAGE_SIZE,
                    "gflop_per_image": manifest["flops_per_image"] / 1e9})
                for p in peers:
                    if manifest.get(p, "ok") != "ok":
                        entry[f"{p}_unavailable"] = manifest[p]
                if "onnxruntime_build" in manifest:
                    entry["onnxruntime_build"] = manifest["onnxruntime_build"]
        for key, engine, dtype in engines_of(row, ready, args.float32_high):
            plan.append((row, key, engine, dtype))

    state: dict = {"rates": {}, "info": {}, "outputs": {}}  # engine_round's (benchmarks/_timing.py)
    rates: dict = state["rates"]  # (row, key) -> {label: [rate per round]}
    info: dict = state["info"]  # (row, key) -> version / not_supported / error
    outputs: dict = state["outputs"]  # row -> key -> {label: array}
    peak_rounds: dict = {}  # dtype -> [GOP/s per round]
    for round_index in range(args.rounds):
        shift = round_index % max(len(plan), 1)
        order = plan[shift:] + plan[:shift]  # rotates which engine starts the round
        print(f"round {round_index + 1}/{args.rounds}", flush=True)
        # the compute peak once a round: the machine's speed drifts (other tenants)
        for dtype, value in measure_peak(args, work).items():
            peak_rounds.setdefault(dtype, []).append(value)
        for row, key, engine, dtype in order:
            if "not_supported" in info.get((row, key), {}) or "error" in info.get((row, key), {}):
                continue
            argv = ["--child", "run", "--row", row, "--engine", engine, "--dtype", dtype, "--work", work,
                    "--threads", str(args.threads), "--seconds", str(args.seconds)]
            keep = round_index == 0 and row != "preprocess"
            engine_round(__file__, argv, args.timeout, work, row, key, state, keep, "img/s", 2)

    peaks = {dtype: statistics.median(values) for dtype, values in peak_rounds.items()}
    for row, key, engine, dtype in plan:
        state = info.get((row, key), {})
        if row == "preprocess":
            name = result_name(row, BATCHES[row][0])
            if "error" in state or "not_supported" in state:
                results[name] = {"model": MODEL_NAMES[row], **state}
            else:
                results[name] = _preprocess_entry(rates.get((row, key), {}), state)
            continue
        flops = manifests[row]["flops_per_image"]
        for batch in BATCHES[row]:
            entry = results[result_name(row, batch)]
            if "not_supported" in state or "error" in state:
                entry[key] = {"dtype": dtype, **state}
                continue
            series = rates.get((row, key), {}).get(f"b{batch}")
            if not series:
                continue
            median = statistics.median(series)
            cell = {"img_per_s": median, "best": max(series), "min": min(series), "rounds": series, "dtype": dtype,
                    "version": state.get("version")}
            if engine == "cpuformer" and peaks.get(dtype):
                cell["gops"] = flops * median / 1e9
                cell["of_peak"] = cell["gops"] / peaks[dtype]
            cell.update(correctness(key, outputs.get(row, {}), f"b{batch}"))
            entry[key] = cell
    for entry in results.values():
        _ratios(entry)
    if not args.cache:
        shutil.rmtree(root, ignore_errors=True)
    return results, peak_rounds


def like_for_like(key: str, entry: dict) -> str:
    """cpuformer's median over this row's, at the row's dtype."""
    row = entry[key]
    if "img_per_s" not in row or key.startswith("cpuformer"):
        return "-"
    ours = entry.get("cpuformer" if row.get("dtype", "float32") == "float32" else f"cpuformer_{row['dtype']}", {})
    text = f"{ours['img_per_s'] / row['img_per_s']:.2f}x" if "img_per_s" in ours else "-"
    high = entry.get("cpuformer_float32_high", {})
    if row.get("dtype", "float32") == "float32" and "img_per_s" in high:
        text += f" (float32_high {high['img_per_s'] / row['img_per_s']:.2f}x)"
    return text


def print_table(results: dict) -> None:
    print("\nimages/s, median of rounds (best round in brackets); each engine in its own process")
    print("| row | engine | dtype | images/s | cpuformer ÷ this (same dtype) | of peak | vs PyTorch |")
    print("|---|---|---|---|---|---|---|")
    for name, entry in results.items():
        if "skipped" in entry:
            print(f"| {name} | - | - | skipped: {entry['skipped'].splitlines()[-1][:150]} | - | - | - |")
            continue
        if "model_only" in entry or "target_share" in entry:
            continue
        for key, row in entry.items():
            if not isinstance(row, dict) or key in ("ratios", "onnxruntime_build"):
                continue
            dtype = row.get("dtype", "float32")
            if "not_supported" in row or "error" in row:
                state = "not supported" if "not_supported" in row else "failed"
                print(f"| {name} | {key} | {dtype} | {state} | - | - | - |")
                continue
            peak = f"{100 * row['of_peak']:.0f} % of {dtype} peak" if "of_peak" in row else "-"
            check = "reference" if key == "pytorch" else (
                f"{row['max_rel_error_vs_pytorch']:.1e} rel., cos {row['min_cosine_vs_pytorch']:.5f}"
                if "max_rel_error_vs_pytorch" in row else "-")
            print(f"| {name} | {key} | {dtype} | {row['img_per_s']:.2f} ({row['best']:.2f}) | "
                  f"{like_for_like(key, entry)} | {peak} | {check} |")
    for name, entry in results.items():
        if "target_share" not in entry:
            continue
        print(f"\n{name} ({entry['source_images']} images → {IMAGE_SIZE}², cpuformer float32), images/s:")
        for label in ("model_only", "end_to_end_arrays", "end_to_end_jpeg", "preprocess_arrays", "preprocess_jpeg"):
            if label in entry:
                print(f"  {label:<18} {entry[label]['img_per_s']:8.2f} ({entry[label]['best']:.2f})")
        for source in ("arrays", "jpeg"):
            if f"preprocess_share_{source}" in entry:
                share = entry[f"preprocess_share_{source}"]
                print(f"  preprocessing share, {source}: {100 * share:.1f} % of end-to-end (end-to-end minus "
                      f"model only; preprocess alone over end-to-end: "
                      f"{100 * entry.get(f'preprocess_alone_share_{source}', float('nan')):.1f} %); "
                      f"target ≤ {100 * PREPROCESS_TARGET:.0f} %")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2-layer models, one 0.3 s round: checks every engine")
    parser.add_argument("--rows", default=None, help=f"comma-separated, of {', '.join(ROWS)} (default all)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=None, help="rounds over all engines (default 3; quick 1)")
    parser.add_argument("--seconds", type=float, default=None,
                        help="minimum timed seconds per batch size in each child (default 2; quick 0.3)")
    parser.add_argument("--no-ort", action="store_true", help="skip ONNX Runtime")
    parser.add_argument("--float32-high", action="store_true",
                        help="add cpuformer float32 rows at float32 matmul precision 'high' (bfloat16x3 tiles on "
                             "AMX-BF16; cpuformer.set_float32_matmul_precision)")
    parser.add_argument("--no-torch", action="store_true", help="skip PyTorch (the correctness reference)")
    parser.add_argument("--cache", default=None,
                        help="directory for the built models and ONNX files, kept and reused by the next run "
                             "(default: a temporary directory, removed at the end)")
    parser.add_argument("--layers", type=int, default=None,
                        help="build the models with this many layers instead of their real depth (default: real; "
                             "quick 2) to check the pipeline fast")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds before a child is given up")
    parser.add_argument("--note", default="", help="free text stored in the JSON")
    parser.add_argument("--out", "--output", dest="out", default=None,
                        help="JSON path (default: benchmarks/results/vision_<date>.json)")
    # a child process (run by the parent, not by hand)
    parser.add_argument("--child", choices=("prepare", "run", "peak"), help=argparse.SUPPRESS)
    parser.add_argument("--row", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--engine", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
    parser.add_argument("--peers", default="", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--outputs", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child == "prepare":
        prepare(args.row, args.work, [p for p in args.peers.split(",") if p and p != "none"], args.layers)
        return 0
    if args.child in ("run", "peak"):
        result = run_child(args) if args.child == "run" else peak_child(args.seconds, args.threads)
        with open(args.result, "w") as f:
            json.dump(result, f)
        return 0

    args.rounds = args.rounds or (1 if args.quick else 3)
    args.layers = args.layers or (2 if args.quick else None)
    args.seconds = args.seconds or (0.3 if args.quick else 2.0)
    rows = [r.strip() for r in (args.rows or ",".join(ROWS)).split(",") if r.strip()]
    unknown = sorted(set(rows) - set(ROWS))
    if unknown:
        parser.error(f"--rows: unknown {', '.join(unknown)}; choose from {', '.join(ROWS)}")
    args.rows = rows
    from bench_encoder import _git_commit, machine_info

    machine = machine_info(args.threads)
    machine["cpuformer_commit"] = _git_commit()
    print(f"cpuformer {machine['cpuformer']}  isa={machine['isa']}  threads={args.threads}  "
          f"cpu={machine['lscpu']['model_name']}  simd={','.join(machine['lscpu']['simd_flags'])}  "
          f"rounds={args.rounds}  seconds={args.seconds}"
          + (f"  layers={args.layers} (not the real models)" if args.layers else ""))
    started = time.perf_counter()
    results, peaks = run_benchmark(args)
    machine["wall_seconds"] = round(time.perf_counter() - started)
    print_table(results)
    path = args.out or os.path.join(RESULTS, f"vision_{datetime.date.today().isoformat()}.json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"machine": machine, "quick": args.quick, "note": args.note, "unit": "images/s",
                   "peak_gops": {dtype: statistics.median(v) for dtype, v in peaks.items()},
                   "peak_gops_rounds": peaks,
                   "settings": {"rounds": args.rounds, "seconds": args.seconds, "rows": args.rows,
                                "float32_high": args.float32_high, "threads": args.threads, "process_per_engine": True,
                                "layers": args.layers or "real", "image_size": IMAGE_SIZE,
                                "batches": {r: list(BATCHES[r]) for r in args.rows}},
                   "results": results}, f, indent=2)
    print(f"\nwrote {path} ({machine['wall_seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
