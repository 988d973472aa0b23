"""Model zoo of the neural engines: a name -> its engine's model, built with zero weights.

`build_model(name="lingbot-map", **overrides)` builds a named architecture with zero weights; fill
it with `engine.load_checkpoint` or `engine.models.recipe.fill_recipe`. The model classes live
with their engines (engine/lingbot/model.py, engine/vggt/model.py), built from the shared layers
of engine/models/. The zoo sits above both: engine/models imports no engine package.

Names:
- "lingbot-map" / "lingbot-map-tiny": LingBot-Map (engine/lingbot/model.py, `LingBotMapConfig`
  overrides); state dict = `shared/fixtures/lingbot_map_keys.tsv` (1342 keys). The released model:
  DINOv2 ViT-L/14-reg patch embed, 24 frame + 24 global blocks (dim 1024, 16 heads), camera head
  (4 blocks at 2048), DPT depth head (features 256), ~4.6 GB in float32. "-tiny" is the same
  architecture scaled down for tests (1.26 M parameters).
- "vggt-1b" / "vggt-tiny": VGGT (engine/vggt/model.py, `VGGTConfig` overrides); state dict =
  `shared/fixtures/vggt_keys.tsv` (1797 keys).

Keyword overrides are config fields applied on top of the named configuration, e.g.
`build_model("lingbot-map-tiny", depth=6, intermediate_layers=(1, 2, 4, 5))`. The heads read 4
aggregator layers, so `intermediate_layers` must hold 4 indices < depth; a bad option raises
EngineError.
"""
from __future__ import annotations

# the names each engine's model module builds (listed here so that naming one imports only it)
LINGBOT_MODELS = ("lingbot-map", "lingbot-map-tiny")
VGGT_MODELS = ("vggt-1b", "vggt-tiny")


def build_model(name: str = "lingbot-map", **overrides):
    from .api import EngineError
    if name in VGGT_MODELS:
        from .vggt.model import build_vggt
        return build_vggt(name, **overrides)
    if name in LINGBOT_MODELS:
        from .lingbot.model import build_lingbot
        return build_lingbot(name, **overrides)
    raise EngineError(f"unknown model {name!r}; available: {', '.join((*LINGBOT_MODELS, *VGGT_MODELS))}")


__all__ = ["build_model", "LINGBOT_MODELS", "VGGT_MODELS"]
