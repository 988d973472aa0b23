"""Model zoo of the neural engines.

`build_model(name="lingbot-map", **overrides)` builds the released LingBot-Map architecture
(state dict = `shared/fixtures/lingbot_map_keys.tsv`, 1342 keys) with random-free zero weights;
fill it with `engine.load_checkpoint` or `engine.models.recipe.fill_recipe`.

Names:
- "lingbot-map": DINOv2 ViT-L/14-reg patch embed, 24 frame + 24 global blocks (dim 1024, 16 heads),
  camera head (4 blocks at 2048), DPT depth head (features 256). ~4.6 GB in float32.
- "lingbot-map-tiny": the same architecture scaled down for tests of other modules (KV cache,
  checkpoints, sessions): embed_dim 64, 4 heads (head dim 16, 3D-RoPE split 8/4/4), depth 4
  (features of layers 0-3), DINOv2 depth 2, camera head 2 blocks at 128 with 4 heads, DPT features
  32, out channels (16, 32, 64, 64), img_size 112 (pos-embed grid 8x8); 1.26 M parameters. Any
  input size that is a multiple of 14 works (e.g. 56x70 -> 4x5 patches, 26 tokens per frame).

- "vggt-1b" / "vggt-tiny": VGGT (engine/vggt/model.py, `VGGTConfig` overrides), built from the
  same layers; state dict = `shared/fixtures/vggt_keys.tsv` (1797 keys).

Keyword overrides are `LingBotMapConfig` fields applied on top of the named configuration, e.g.
`build_model("lingbot-map-tiny", depth=6, intermediate_layers=(1, 2, 4, 5))`. The heads read 4
aggregator layers, so `intermediate_layers` must hold 4 indices < depth; a bad option raises
EngineError.
"""
from __future__ import annotations

from .lingbot_map import LingBotMap, LingBotMapConfig

TINY = dict(img_size=112, embed_dim=64, depth=4, num_heads=4, patch_embed_depth=2, patch_embed_heads=4,
            intermediate_layers=(0, 1, 2, 3), camera_depth=2, camera_heads=4, dpt_features=32,
            dpt_out_channels=(16, 32, 64, 64))

MODELS = {"lingbot-map": {}, "lingbot-map-tiny": TINY}


# VGGT (engine/vggt/model.py) is built from these same layers; its names are listed here too.
VGGT_MODELS = ("vggt-1b", "vggt-tiny")


def build_model(name: str = "lingbot-map", **overrides) -> LingBotMap:
    from ..api import EngineError
    if name in VGGT_MODELS:
        from ..vggt.model import build_vggt
        return build_vggt(name, **overrides)
    if name not in MODELS:
        raise EngineError(f"unknown model {name!r}; available: {', '.join((*MODELS, *VGGT_MODELS))}")
    from .trunk import build_preset
    return build_preset(name, MODELS, LingBotMapConfig, LingBotMap, overrides)


__all__ = ["build_model", "LingBotMap", "LingBotMapConfig", "MODELS"]
