"""Shared by the family tests: random-weight transformers checkpoints and the float32 tolerance."""

from __future__ import annotations

import numpy as np
import torch


def save_random_model(directory, model_class, config, seed=0, noise_every_vector=False, prepare=None):
    """A transformers ``model_class(config)`` with seeded random weights, saved to ``directory``
    (safetensors) and returned in eval mode. Constant-initialised vectors (norms, biases; every
    1-D parameter with ``noise_every_vector``) get noise: a tensor read from the wrong place, or not
    read at all, then changes the outputs. ``prepare(model)`` runs last before saving (no grad)."""
    torch.manual_seed(seed)
    model = model_class(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 1 and (noise_every_vector or bool((parameter == parameter.flatten()[0]).all())):
                parameter.add_(torch.randn_like(parameter) * 0.1)
        if prepare is not None:
            prepare(model)
    model.save_pretrained(directory, safe_serialization=True)
    return model


def save_families(tmp_path_factory, families, first_seed=0):
    """{name: (directory, model, config kwargs)} for families {name: (transformers model class name,
    config class name, config kwargs)}, each saved by save_random_model (seeds from first_seed on)."""
    import transformers

    built = {}
    for i, (name, (model_class, config_class, config)) in enumerate(families.items()):
        directory = tmp_path_factory.mktemp(name)
        model = save_random_model(directory, getattr(transformers, model_class),
                                  getattr(transformers, config_class)(**config), seed=first_seed + i)
        built[name] = (str(directory), model, config)
    return built


def assert_close(ours, reference, tolerance=1e-4):
    """Within ``tolerance`` relative to the reference's largest magnitude (the float32 standard)."""
    reference = np.asarray(reference, dtype=np.float32)
    scale = float(np.abs(reference).max())
    np.testing.assert_allclose(ours, reference, rtol=tolerance, atol=tolerance * scale)


def cosine_rows(a, b):
    """Cosine similarity of corresponding rows (the last axis) of a and b, in float64."""
    a = a.reshape(-1, a.shape[-1]).astype(np.float64)
    b = b.reshape(-1, b.shape[-1]).astype(np.float64)
    return np.sum(a * b, axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
