"""Models the tests build: a registered model (engine.models) with random weights at the recipe's
scale, drawn on the device (seconds at full size; `engine.models.recipe.fill_recipe` is the
deterministic, slower recipe the conformance fixtures use)."""
from __future__ import annotations

import numpy as np
import torch


def random_model(name: str = "lingbot-map", device: str = "cuda", seed: int = 0) -> torch.nn.Module:
    """`name` built on `device` with `random_init_(model, seed)` weights (float32)."""
    from engine.model_zoo import build_model
    from engine.models.recipe import random_init_
    with torch.device(device):
        model = build_model(name)
    return random_init_(model, seed)


TEST_K = np.array([[60.0, 0, 31.5], [0, 62.0, 23.5], [0, 0, 1]])


def random_results(n: int = 5, h: int = 48, w: int = 64, seed: int = 0, depth: bool = True) -> list:
    """`n` seeded FrameResults for export tests: random poses along x, random images; depth and
    confidence on every frame but frame 3 (a frame without depth), none with `depth=False`;
    keyframes every other frame, segment 1 from frame 4."""
    from scipy.spatial.transform import Rotation

    from engine.api import FrameResult

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        c2w = np.eye(4)
        c2w[:3, :3] = Rotation.from_rotvec(0.3 * rng.normal(size=3)).as_matrix()
        c2w[:3, 3] = [0.2 * i, 0.05 * rng.normal(), 0.0]
        has = depth and i != 3
        out.append(FrameResult(
            index=i, timestamp=0.1 * i, is_keyframe=i % 2 == 0, c2w=c2w, K=TEST_K.copy(),
            image=rng.integers(0, 256, (h, w, 3), dtype=np.uint8),
            depth=rng.uniform(1.0, 3.0, (h, w)).astype(np.float32) if has else None,
            conf=rng.uniform(1.0, 10.0, (h, w)).astype(np.float32) if has else None,
            segment=int(i >= 4)))
    return out


def tiny_checkpoint_and_frames(folder, n: int = 4, size: tuple = (80, 60), seed: int = 0) -> tuple:
    """A recipe-weight checkpoint of the tiny LingBot-Map (folder/tiny.pt) and `n` seeded random
    PNG frames of `size` (W, H) in folder/frames: what a CLI run of the neural engine needs."""
    from pathlib import Path

    from PIL import Image

    from engine.model_zoo import build_model
    from engine.models.recipe import fill_recipe
    folder = Path(folder)
    ckpt = folder / "tiny.pt"
    torch.save(fill_recipe(build_model("lingbot-map-tiny")).state_dict(), ckpt)
    frames = folder / "frames"
    frames.mkdir()
    rng = np.random.default_rng(seed)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(frames / f"{i:03d}.png")
    return ckpt, frames
