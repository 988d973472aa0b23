"""The aggregator design VGGT and LingBot-Map share: a DINOv2 patch embed, per-frame special tokens
(camera, registers; each in two variants) and `depth` pairs of frame / global blocks. Each model's
aggregator subclasses `Trunk` and adds what differs (its own special tokens, RoPE, caches, forward);
`TrunkModel` is the model-level part both share (device, the heads' layer check);
`build_preset` builds one of a model's named configurations."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn as nn

from .dinov2 import DinoV2
from .layers import Block
from .sections import section

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass
class TrunkConfig:
    """The fields VGGTConfig and LingBotMapConfig share (the released sizes: DINOv2 ViT-L/14-reg
    patch embed, 24 frame + 24 global blocks at 1024, camera head, DPT); each model's config
    subclasses it with its own fields."""
    img_size: int = 518                 # DINOv2 pos-embed grid = img_size // patch_size
    patch_size: int = 14
    embed_dim: int = 1024               # aggregator and patch-embed width
    depth: int = 24                     # frame blocks = global blocks = depth
    num_heads: int = 16
    mlp_ratio: float = 4.0
    patch_embed_depth: int = 24         # DINOv2 ViT-L: 24 blocks, 16 heads
    patch_embed_heads: int = 16
    num_register_tokens: int = 4
    intermediate_layers: Sequence[int] = (4, 11, 17, 23)    # the 4 layers the heads read
    camera_depth: int = 4
    camera_heads: int = 16
    dpt_features: int = 256
    dpt_out_channels: Sequence[int] = (256, 512, 1024, 1024)
    rope_freq: float = 100.0


def build_preset(name: str, presets: dict, config_cls, model_cls, overrides: dict):
    """model_cls(config_cls(**presets[name], **overrides)), named `name` (a key of `presets`);
    an unknown option or a configuration the model rejects raises EngineError."""
    from ..api import EngineError
    try:
        cfg = config_cls(**{**presets[name], **overrides})
    except TypeError as e:
        raise EngineError(f"bad model option for {name!r}: {e}") from None
    try:
        model = model_cls(cfg)
    except ValueError as e:
        raise EngineError(f"bad model configuration for {name!r}: {e}") from None
    model.name = name
    return model


class Trunk(nn.Module):
    """Patch embed, frame blocks, global blocks, camera / register tokens; named sections for profilers.
    `cfg` has embed_dim, num_register_tokens, patch_embed_depth, patch_embed_heads, patch_size,
    img_size, mlp_ratio, num_heads and depth."""

    def __init__(self, cfg):
        super().__init__()
        C, R = cfg.embed_dim, cfg.num_register_tokens
        self.cfg = cfg
        self.patch_embed = DinoV2(C, cfg.patch_embed_depth, cfg.patch_embed_heads, cfg.patch_size,
                                  cfg.img_size, R, cfg.mlp_ratio)
        self.frame_blocks = nn.ModuleList(Block(C, cfg.num_heads, cfg.mlp_ratio, qk_norm=True) for _ in range(cfg.depth))
        self.global_blocks = nn.ModuleList(Block(C, cfg.num_heads, cfg.mlp_ratio, qk_norm=True) for _ in range(cfg.depth))
        # variant 0: the reference frame (frame 0 of the first batch); variant 1: the rest
        self.camera_token = nn.Parameter(torch.zeros(1, 2, 1, C))
        self.register_token = nn.Parameter(torch.zeros(1, 2, R, C))

    @staticmethod
    def _section(name):
        """A named section (engine/models/sections.py): a profiler range, timed when a caller asks."""
        return section(name)

    def run_blocks(self, x: torch.Tensor, frame_step, global_step) -> list[torch.Tensor]:
        """The alternating blocks on tokens x [S, T, C]: for each layer i, x = frame_step(i, x), then
        x = global_step(i, x). Returns the 4 feature maps the heads read: frame-block output ‖
        global-block output [S, T, 2C] of each of `cfg.intermediate_layers`."""
        wanted = set(self.cfg.intermediate_layers)
        feats = []
        for i in range(self.cfg.depth):
            with self._section("frame_blocks"):
                x = x_frame = frame_step(i, x)
            with self._section("global_blocks"):
                x = global_step(i, x)
            if i in wanted:
                feats.append(torch.cat((x_frame, x), dim=-1))
        return feats


class TrunkModel:
    """Mixin of the full models (VGGT, LingBotMap), whose `aggregator` is a Trunk."""

    @staticmethod
    def check_layers(cfg) -> None:
        """The heads read 4 aggregator layers: ValueError unless `intermediate_layers` are 4 indices < depth."""
        if len(cfg.intermediate_layers) != 4 or max(cfg.intermediate_layers) >= cfg.depth:
            raise ValueError(f"intermediate_layers {tuple(cfg.intermediate_layers)} must be 4 indices < depth {cfg.depth}")

    @property
    def device(self) -> torch.device:
        return self.aggregator.camera_token.device
