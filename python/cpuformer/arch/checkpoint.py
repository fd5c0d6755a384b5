"""Random checkpoints from the declarations: every tensor a family's checkpoint holds, with its
Hugging Face name and shape, filled with seeded random weights (``cpuformer bench``'s models, and
tests that need a checkpoint without torch)."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Tuple

import numpy as np

from .spec import NORMS, Arch, Tensor, bias_of, canonical_shape


def random_checkpoint(arch: Arch, config: Mapping[str, Any], rng: np.random.Generator,
                      scale: float = 0.02) -> Dict[str, np.ndarray]:
    """name -> float32 array for the checkpoint ``config`` describes, as ``arch.architectures[0]``
    saves it (under ``arch.prefixes[0]``): matrices and embeddings ~ N(0, scale²), norm weights
    ones, biases zeros. Optional tensors are included; a tied head is not."""
    hp = arch.hparams(config)
    prefix = arch.prefixes[0]
    declared: List[Dict[str, Any]] = [dict(arch.model_tensors(config, hp))]
    if hp.tie_word_embeddings:
        declared[0].pop("lm_head", None)
    for stack, count in arch.stacks(hp):
        declared.append(dict(arch.stack_tensors(config, hp, stack)))
        declared.extend(dict(arch.layer_tensors(hp, stack, layer)) for layer in range(count))
    out: Dict[str, np.ndarray] = {}
    for sources in declared:
        groups: Dict[str, List[Tuple[str, Tensor]]] = {}
        for canonical, source in sources.items():
            if isinstance(source, Tensor):
                groups.setdefault(source.name if source.root else prefix + source.name, []).append((canonical, source))
        for name, members in groups.items():
            canonical, tensor = members[0]
            shape = canonical_shape(canonical, hp)
            if tensor.rows is not None:
                shape = (max(t.rows[1] for _, t in members if t.rows),) + shape[1:]
            if tensor.transpose:
                shape = shape[::-1]
            if tensor.as_row:
                shape = (1,) + shape
            if tensor.stored_shape is not None:
                shape = tensor.stored_shape
            if bias_of(canonical) != canonical:
                out[name] = np.zeros(shape, np.float32)
            elif canonical in NORMS:
                out[name] = np.full(shape, 0.0 if tensor.plus_one else 1.0, np.float32)
            else:
                out[name] = rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)
    return out
