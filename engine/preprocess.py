"""Frame preprocessing for the neural engines (upstream LingBot-Map / VGGT "crop" mode).

A uint8 H x W x 3 RGB frame of any size becomes a float32 tensor [3, h, w] in [0, 1]:

- width  w = `image_width` (518 by default);
- height h = round(H * w / W / 14) * 14 (Python rounding, at least 14): the aspect ratio is kept
  up to the rounding to a whole number of 14-pixel patches;
- PIL bicubic resize to (w, h);
- if h > w (portrait input) the centre w rows are kept (centre crop to a w x w square): the model
  never sees more than w x w, which bounds the token count. Nothing is padded.

Examples: 640x480 -> 518x392 (480*518/640/14 = 27.75 -> 28 patch rows, 37x28 patches),
1920x1080 -> 518x294, 480x640 (portrait) -> resized to 518x686, centre-cropped to 518x518. Grayscale (H x W or H x W x 1) is replicated to RGB; RGBA is composited on
white (as upstream). A float tensor / array [3, h, w] with values in [0, 1] and h, w multiples
of 14 is taken as already preprocessed and passes through unchanged.

The result image (uint8, h x w x 3) is what FrameResult.image carries, so depth, K and colours
all live at the model resolution.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from .api import EngineError

PATCH = 14


class PreprocessError(EngineError):
    """A frame the neural engines cannot take; the message says why."""


def target_size(width: int, height: int, image_width: int = 518, patch: int = PATCH) -> tuple[int, int, int]:
    """(resized_w, resized_h, final_h) of the crop mode for an input of width x height."""
    if width < 1 or height < 1:
        raise PreprocessError(f"frame has no pixels ({width}x{height})")
    if image_width < patch or image_width % patch:
        raise PreprocessError(f"image width {image_width} must be a positive multiple of {patch}")
    new_h = max(patch, round(height * (image_width / width) / patch) * patch)
    return image_width, new_h, min(new_h, image_width)


@dataclass
class Prepared:
    tensor: torch.Tensor        # float32 [3, h, w] in [0, 1]
    image: np.ndarray           # uint8 [h, w, 3]


def _as_rgb_uint8(frame: np.ndarray) -> np.ndarray:
    if frame.ndim == 2:
        frame = frame[:, :, None]
    if frame.ndim != 3:
        raise PreprocessError(f"expected an H x W x 3 RGB image, got an array of shape {frame.shape}")
    c = frame.shape[2]
    if c == 1:
        return np.repeat(frame, 3, axis=2)
    if c == 3:
        return frame
    if c == 4:
        rgba = Image.alpha_composite(Image.new("RGBA", (frame.shape[1], frame.shape[0]), (255, 255, 255, 255)),
                                     Image.fromarray(np.ascontiguousarray(frame), "RGBA"))
        return np.asarray(rgba.convert("RGB"))
    raise PreprocessError(f"expected 1, 3 or 4 colour channels, got {c} (shape {frame.shape})")


def preprocess(frame, image_width: int = 518) -> Prepared:
    """Bring one frame to model resolution (see the module docstring). A `Prepared` frame (made
    ahead, e.g. by the run driver's reader thread through `SessionTiming.prepare_frame`) passes
    through if it was made for this `image_width`."""
    if isinstance(frame, Prepared):
        if frame.tensor.ndim != 3 or frame.tensor.shape[2] != image_width:
            raise PreprocessError(f"a frame prepared at width {frame.tensor.shape[-1]} was given to a session "
                                  f"that runs at width {image_width}")
        return frame
    if isinstance(frame, torch.Tensor) and frame.is_floating_point() or (
            isinstance(frame, np.ndarray) and np.issubdtype(frame.dtype, np.floating)):
        t = torch.as_tensor(frame).detach().to("cpu", torch.float32)
        if t.ndim != 3 or t.shape[0] != 3 or t.shape[1] % PATCH or t.shape[2] % PATCH or t.shape[1] < PATCH:
            raise PreprocessError(
                f"a float frame must be a [3, h, w] tensor with h and w multiples of {PATCH} "
                f"(already at model resolution); got shape {tuple(t.shape)}. Pass uint8 H x W x 3 to resize.")
        if not torch.isfinite(t).all():
            raise PreprocessError("float frame contains NaN or infinite values")
        img = (t.clamp(0, 1) * 255.0 + 0.5).to(torch.uint8).permute(1, 2, 0).numpy()
        return Prepared(t, img)
    if isinstance(frame, torch.Tensor):
        frame = frame.cpu().numpy()
    if not isinstance(frame, np.ndarray):
        raise PreprocessError(f"expected a uint8 H x W x 3 image or a float [3, h, w] tensor, got {type(frame).__name__}")
    if frame.dtype != np.uint8:
        raise PreprocessError(f"expected uint8 pixels, got {frame.dtype}")
    rgb = _as_rgb_uint8(frame)
    H, W = rgb.shape[:2]
    w, h, h_final = target_size(W, H, image_width)
    img = Image.fromarray(np.ascontiguousarray(rgb), "RGB").resize((w, h), Image.Resampling.BICUBIC)
    arr = np.asarray(img)
    if h_final < h:
        top = (h - h_final) // 2
        arr = arr[top:top + h_final]
    arr = np.ascontiguousarray(arr)
    t = torch.from_numpy(arr.copy()).permute(2, 0, 1).float().div_(255.0)
    return Prepared(t.contiguous(), arr)
