"""VGGT-1B: the offline model (engine/vggt/model.py, built from engine/models' shared layers)
and its chunked streaming session (engine/vggt/session.py).

`engine.build_model("vggt-1b")` builds the released architecture (state dict =
`shared/fixtures/vggt_keys.tsv`, 1797 keys); "vggt-tiny" is the same design scaled down for tests.
This package's __init__ imports no torch, so the registry can list the engine cheaply.
"""
