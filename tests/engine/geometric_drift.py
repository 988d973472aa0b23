"""Artificial scale drift for geometric-engine tests: after every keyframe the map is rescaled by
`factor` about the current camera, so loop closure has drift to correct."""
import numpy as np


def inject_scale_drift(monkeypatch, factor: float = 1.01) -> None:
    """Patch GeometricSession._apply (through `monkeypatch`, undone after the test)."""
    import engine.geometric.session as GS
    from engine.geometric.geometry import camera_center
    orig = GS.GeometricSession._apply

    def drifting_apply(self, step, gray):
        orig(self, step, gray)
        if step.keyframe and self.tracker.initialised:
            kf = self.tracker.keyframes[-1]
            c = camera_center(kf.R, kf.t)
            S = np.eye(4)
            S[:3, :3] *= factor
            S[:3, 3] = c - factor * c
            self.tracker.transform_world(S)

    monkeypatch.setattr(GS.GeometricSession, "_apply", drifting_apply)
