"""Input and output: frame sources, the crash-safe session store and the exporters.

Submodules are imported on use (`from engine.io.sources import open_source`) so that importing
`engine.io` stays cheap; the names below are re-exported lazily for convenience.
"""
_EXPORTS = {
    "sources": ("SourceError", "Frame", "FrameSource", "open_source", "list_webcams"),
    "store": ("SessionStore", "LoadedSession", "load_session", "default_session_root", "new_session_folder"),
    "export": ("export_ply", "export_npz", "export_tum", "export_session"),
}


def __getattr__(name):
    import importlib
    for module, names in _EXPORTS.items():
        if name in names:
            return getattr(importlib.import_module(f"{__name__}.{module}"), name)
    raise AttributeError(name)
