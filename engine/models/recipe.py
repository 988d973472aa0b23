"""Deterministic "recipe" weights of the reference fixtures (shared/fixtures/README.md §2).

Every tensor is a function of its key and shape only: a NumPy PCG64 generator seeded with the
unsigned CRC-32 of the key draws float64 standard normals, scaled by the leaf name, rounded once
to float32. `fill_recipe(model)` builds the tensors one by one and loads them through the ordinary
strict `load_state_dict` path, a slice of the state dict at a time, so peak extra memory stays at
one group of tensors (the full-size model is 4.6 GB in float32).
"""
from __future__ import annotations

import math
import zlib

import numpy as np
import torch


def recipe_tensor(key: str, shape) -> np.ndarray:
    shape = tuple(int(s) for s in shape)
    z = np.random.default_rng(zlib.crc32(key.encode("utf-8"))).standard_normal(size=shape, dtype=np.float64)
    leaf = key.rsplit(".", 1)[-1]
    if leaf.endswith("weight") and len(shape) == 1:      # LayerNorm weights
        v = 1.0 + 0.05 * z
    elif leaf.endswith("weight"):                        # Linear / Conv / ConvTranspose: prod(shape[1:])
        v = z / math.sqrt(int(np.prod(shape[1:])))
    elif leaf.endswith("bias"):
        v = 0.02 * z
    elif leaf == "gamma":                                # LayerScale
        v = 0.2 + 0.02 * z
    else:                                                # tokens, pos_embed, mask_token, ...
        v = z
    return v.astype(np.float32)


def fill_recipe(model: torch.nn.Module, group: int = 64) -> torch.nn.Module:
    """Fill every state-dict entry of `model` with its recipe tensor (strict: the key set must match)."""
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    keys = sorted(shapes)
    loaded = set()
    for i in range(0, len(keys), group):
        part = {k: torch.from_numpy(recipe_tensor(k, shapes[k])) for k in keys[i:i + group]}
        missing, unexpected = model.load_state_dict(part, strict=False, assign=False)
        if unexpected:
            raise KeyError(f"recipe produced unexpected keys: {unexpected}")
        loaded.update(part)
        del part
    if loaded != set(shapes):
        raise KeyError(f"recipe left keys unfilled: {sorted(set(shapes) - loaded)[:5]}")
    return model


@torch.no_grad()
def random_init_(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Fill every parameter with random values at the recipe's scale (`recipe_tensor`'s leaf rules),
    drawn by torch on the parameter's own device: seconds at full size, where `fill_recipe` takes
    minutes on a CPU; the same arithmetic cost as real weights (all-zero weights run faster)."""
    gen = {}
    for name, p in model.named_parameters():
        dev = p.device
        if dev not in gen:
            gen[dev] = torch.Generator(device=dev).manual_seed(seed)
        z = torch.randn(p.shape, generator=gen[dev], device=dev, dtype=torch.float32)
        leaf = name.rsplit(".", 1)[-1]
        if leaf.endswith("weight") and p.ndim == 1:
            z = 1.0 + 0.05 * z
        elif leaf.endswith("weight"):
            z = z / math.sqrt(max(1, math.prod(p.shape[1:])))
        elif leaf.endswith("bias"):
            z = 0.02 * z
        elif leaf == "gamma":
            z = 0.2 + 0.02 * z
        p.copy_(z)
    return model
