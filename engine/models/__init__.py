"""The layers the neural engines' models are built from: trunk.py (patch embed, frame / global
blocks, special tokens), layers.py (one Block, one Attention), rope.py, camera_head.py,
dpt_head.py, dinov2.py, plus the recipe weights (recipe.py) and the CUDA-graph / compile helpers.

Layering: this package imports no engine package (engine.lingbot, engine.vggt, engine.geometric,
...) -- the model classes live with their engines and import from here; the named models are
built by engine.model_zoo.build_model. Shared infrastructure it uses: engine.kv (page tables)
and the engine's contract (engine.api errors). tests/engine/test_layering.py checks this.
"""
