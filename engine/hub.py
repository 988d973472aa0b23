"""Downloading released checkpoints from the Hugging Face hub (used by the settings panel and
`reconstudio model download`).

The released LingBot-Map files live in the model repository `robbyant/lingbot-map` (linked from
the upstream README, github.com/Robbyant/lingbot-map): pickled `torch.save` state dicts of
float32 tensors. `load_checkpoint` reads them with `weights_only=True`.

Importing this module is cheap (no torch, no huggingface_hub until a download starts).
"""
from __future__ import annotations

import inspect
import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from .api import EngineError

ProgressCallback = Callable[[int, int], None]   # (bytes_done, bytes_total); total 0 when unknown

HUB_REPO = "robbyant/lingbot-map"


@dataclass(frozen=True)
class KnownCheckpoint:
    name: str            # short id used on the command line
    label: str           # shown in the GUI
    repo_id: str
    filename: str
    size_bytes: int      # approximate (the hub lists 4.63 GB / 4.76 GB)
    engine: str          # engine the file is meant for
    description: str


KNOWN_CHECKPOINTS: tuple[KnownCheckpoint, ...] = (
    KnownCheckpoint(
        "lingbot-map", "LingBot-Map (balanced)", HUB_REPO, "lingbot-map.pt", 4_630_000_000, "lingbot-map",
        "the checkpoint of the paper, benchmark and demo: all-round for short and long sequences"),
    KnownCheckpoint(
        "lingbot-map-long", "LingBot-Map long", HUB_REPO, "lingbot-map-long.pt", 4_630_000_000, "lingbot-map",
        "better suited to long sequences and large scenes"),
    KnownCheckpoint(
        "lingbot-map-stage1", "LingBot-Map stage 1 (bidirectional)", HUB_REPO, "lingbot-map-stage1.pt",
        4_760_000_000, "vggt",
        "stage-1 training checkpoint for the bidirectional VGGT model (carries a point head)"),
    KnownCheckpoint(
        "vggt-1b", "VGGT-1B", "facebook/VGGT-1B", "model.pt", 5_030_000_000, "vggt-1b",
        "VGGT-1B with all four heads, for the chunked vggt-1b engine (Meta's licence: check its terms "
        "on the hub page before use)"),
)


def known_checkpoint(name: str) -> KnownCheckpoint:
    for ck in KNOWN_CHECKPOINTS:
        if name in (ck.name, ck.filename):
            return ck
    raise EngineError(f"unknown checkpoint {name!r}; known: {', '.join(c.name for c in KNOWN_CHECKPOINTS)}")


class DownloadError(EngineError):
    """The hub could not deliver the file; the message says what to do instead."""


_BY_HAND = "download the file by hand and choose it with 'Checkpoint…'"


def download_checkpoint(repo_id: str, filename: str, *, dest_dir: Optional[str | os.PathLike] = None,
                        progress: Optional[ProgressCallback] = None, revision: Optional[str] = None) -> Path:
    """Fetch `filename` from the hub model repository `repo_id` and return its local path.

    dest_dir=None keeps the file in the Hugging Face cache (shared with other tools, reused when
    already there); otherwise it is placed in `dest_dir`. `progress(bytes_done, bytes_total)` is
    called as bytes arrive (from the download thread); None shows huggingface_hub's own tqdm bar.
    Offline, unreachable, missing or gated files raise DownloadError with a clear message."""
    try:
        from huggingface_hub import errors as hf_errors
        from huggingface_hub import hf_hub_download
    except ImportError as exc:
        raise DownloadError(f"huggingface_hub is not installed ({exc}); {_BY_HAND}") from None

    kwargs = dict(repo_id=repo_id, filename=filename, revision=revision)
    if dest_dir is not None:
        Path(dest_dir).mkdir(parents=True, exist_ok=True)
        kwargs["local_dir"] = str(dest_dir)
    if progress is not None and "tqdm_class" in inspect.signature(hf_hub_download).parameters:
        kwargs["tqdm_class"] = _callback_tqdm(progress)     # older huggingface_hub: completion only
    where = f"{filename} from {repo_id}"
    if not _offline_mode():
        # huggingface_hub retries an unreachable hub for ~25 s; a quick probe answers at once.
        problem = _probe_hub()
        if problem:
            cached = cached_checkpoint(repo_id, filename, revision) if dest_dir is None else None
            if cached is not None:
                return cached
            raise DownloadError(f"cannot download {where}: cannot reach the Hugging Face hub ({problem}) "
                                f"and the file is not in the local cache — {_BY_HAND}")
    try:
        path = Path(hf_hub_download(**kwargs))
    except hf_errors.GatedRepoError:
        raise DownloadError(f"{repo_id} is gated: accept its terms on huggingface.co and log in "
                            f"(`hf auth login`), or {_BY_HAND}") from None
    except hf_errors.RepositoryNotFoundError:
        raise DownloadError(f"the Hugging Face repository {repo_id!r} does not exist (or is private)") from None
    except hf_errors.RevisionNotFoundError:
        raise DownloadError(f"revision {revision!r} of {repo_id} does not exist") from None
    except hf_errors.RemoteEntryNotFoundError:
        raise DownloadError(f"{repo_id} has no file named {filename!r}") from None
    except hf_errors.OfflineModeIsEnabled:
        raise DownloadError(f"cannot download {where}: offline mode is on (HF_HUB_OFFLINE) and the file is "
                            f"not in the local cache — {_BY_HAND}") from None
    except hf_errors.LocalEntryNotFoundError as exc:
        # Raised both in offline mode and when the hub cannot be reached; the file is not cached.
        offline = _offline_mode()
        why = "offline mode is on (HF_HUB_OFFLINE)" if offline else f"cannot reach the Hugging Face hub ({_root_cause(exc)})"
        raise DownloadError(f"cannot download {where}: {why} and the file is not in the local cache — "
                            f"{_BY_HAND}") from None
    except hf_errors.HfHubHTTPError as exc:
        raise DownloadError(f"the Hugging Face hub refused {where}: {_short(exc)} — {_BY_HAND}") from None
    except (ConnectionError, TimeoutError) as exc:
        raise DownloadError(f"cannot reach the Hugging Face hub: {_short(exc)} — {_BY_HAND}") from None
    except OSError as exc:  # disk full, permission denied, ...
        raise DownloadError(f"cannot save {where}: {_short(exc)}") from None
    if progress is not None:  # also when the file came from the cache and no bytes moved
        size = path.stat().st_size
        progress(size, size)
    return path


def download_known(name: str, *, dest_dir: Optional[str | os.PathLike] = None,
                   progress: Optional[ProgressCallback] = None) -> Path:
    """`download_checkpoint` for an entry of KNOWN_CHECKPOINTS (by `name` or file name)."""
    ck = known_checkpoint(name)
    return download_checkpoint(ck.repo_id, ck.filename, dest_dir=dest_dir, progress=progress)


def cached_checkpoint(repo_id: str, filename: str, revision: Optional[str] = None) -> Optional[Path]:
    """Path of the file in the local Hugging Face cache, or None (never touches the network)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    found = try_to_load_from_cache(repo_id, filename, revision=revision)
    return Path(found) if isinstance(found, str) else None


def _probe_hub(timeout: float = 3.0) -> Optional[str]:
    """Why the hub endpoint cannot be reached (DNS, refused, timeout), or None if a TCP connection
    opens. Skipped (None) behind a proxy, where only the proxy knows."""
    import socket
    from urllib.parse import urlsplit

    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy",
                                        "ALL_PROXY", "all_proxy")):
        return None
    try:
        from huggingface_hub import constants
        url = urlsplit(constants.ENDPOINT)
    except Exception:
        return None
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname, port), timeout=timeout):
            return None
    except socket.gaierror as exc:
        return f"cannot resolve {url.hostname}: {exc.strerror or exc}"
    except OSError as exc:
        return f"{url.hostname}:{port}: {exc.strerror or exc}"


def _offline_mode() -> bool:
    try:
        from huggingface_hub import constants
        return bool(constants.HF_HUB_OFFLINE)
    except Exception:
        return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def _short(exc: BaseException) -> str:
    text = (str(exc).strip() or type(exc).__name__).splitlines()[0]
    return text[:200]


class _Discard(io.TextIOBase):
    def write(self, s: str) -> int:
        return len(s)


def _root_cause(exc: BaseException) -> str:
    """The innermost error of a chain (e.g. 'Name or service not known' under the hub's wrapper)."""
    seen = set()
    while id(exc) not in seen and (exc.__cause__ or exc.__context__) is not None:
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return _short(exc)


def _callback_tqdm(callback: ProgressCallback):
    """A tqdm class that reports to `callback` instead of drawing (huggingface_hub's `tqdm_class`)."""
    from tqdm.std import tqdm

    class _CallbackTqdm(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs.pop("name", None)
            kwargs["file"] = _Discard()         # draw nowhere; the GUI shows its own bar
            kwargs["disable"] = False           # a disabled tqdm stops counting
            super().__init__(*args, **kwargs)
            callback(int(self.n), int(self.total or 0))

        def update(self, n=1):
            out = super().update(n)
            callback(int(self.n), int(self.total or 0))
            return out

    return _CallbackTqdm
