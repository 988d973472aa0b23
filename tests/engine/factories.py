"""Models the tests build: a registered model (engine.models) with random weights at the recipe's
scale, drawn on the device (seconds at full size; `engine.models.recipe.fill_recipe` is the
deterministic, slower recipe the conformance fixtures use)."""
from __future__ import annotations

import torch


def random_model(name: str = "lingbot-map", device: str = "cuda", seed: int = 0) -> torch.nn.Module:
    """`name` built on `device` with `random_init_(model, seed)` weights (float32)."""
    from engine.model_zoo import build_model
    from engine.models.recipe import random_init_
    with torch.device(device):
        model = build_model(name)
    return random_init_(model, seed)
