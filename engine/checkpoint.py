"""Safe, memory-frugal loading and inspection of model checkpoints (LingBot-Map first).

Formats (recognised by their first bytes, not by the file name):
- PyTorch zip files (`torch.save`, `.pt`/`.pth`): read with `torch.load(weights_only=True, mmap=True)`,
  so no pickled code ever runs and tensors stay in the memory-mapped file until copied;
- legacy (pre-1.6, non-zip) `torch.save` files: same, but without mmap (torch cannot map them);
- `.safetensors`: opened with `safetensors.safe_open` (memory-mapped, read tensor by tensor).

A checkpoint may be a bare state dict or carry it under a wrapper key ("model" as the upstream
release does; "state_dict", "model_state_dict", ... when that choice is unambiguous). A whole-file
"module." (DataParallel) or "_orig_mod." (torch.compile) key prefix is stripped.

Loading is strict by default: every model key must be in the file with the same shape, and every
key in the file must belong to the model, except the heads of the VGGT family that the streaming
model has no use for (`point_head.*`, `track_head.*`, see `BENIGN_EXTRA_PREFIXES`): released files
such as `lingbot-map-stage1.pt` carry a point head; those keys are skipped and listed in the report.
The check is done on metadata before anything is copied, so a refused file leaves the model as it was.

Memory: tensors are copied one by one into the model's existing parameters (converting dtype and
device on the way), so loading a 4.6 GB file into a CPU model needs the model's own memory plus one
tensor at a time, never a second full copy. Parameters on the `meta` device are replaced instead
(`load_state_dict(assign=True)`), keeping the memory-mapped storage where no dtype change is needed.
"""
from __future__ import annotations

import os
import re
import struct
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from .api import CheckpointError

# Keys a released file may carry that the streaming model does not build: the point and track heads
# of the VGGT family (the stage-1 LingBot-Map file is loadable into VGGT and has a point head).
BENIGN_EXTRA_PREFIXES: tuple[str, ...] = ("point_head.", "track_head.")

# Wrapper keys under which training code commonly stores the weights. "model" is the documented
# LingBot-Map wrapper and always wins; the others are used only when exactly one is present.
WRAPPER_KEYS: tuple[str, ...] = ("model", "state_dict", "model_state_dict", "module", "net", "network", "weights")

# Whole-file key prefixes left by torch.nn.DataParallel / DistributedDataParallel and torch.compile.
STRIPPABLE_PREFIXES: tuple[str, ...] = ("module.", "_orig_mod.")

DEFAULT_MAX_NAMES = 10  # how many names of each problem kind a message lists

_SAFETENSORS_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
}
_DTYPE_BYTES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}


# --- reports ---------------------------------------------------------------------------------------

@dataclass
class KeyDiff:
    """How a file's tensors (name -> shape) compare with a model's."""

    missing: list[str] = field(default_factory=list)        # in the model, not in the file
    unexpected: list[str] = field(default_factory=list)     # in the file, not in the model
    mismatched: list[tuple[str, tuple, tuple]] = field(default_factory=list)  # (name, model shape, file shape)
    ignored: list[str] = field(default_factory=list)        # benign extras, skipped
    matched: list[str] = field(default_factory=list)        # same name and shape

    @property
    def fits(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched)

    def problem_lines(self, max_names: int = DEFAULT_MAX_NAMES) -> list[str]:
        """One readable line per kind of problem: count and the first `max_names` names."""
        lines = []
        if self.missing:
            lines.append(f"{len(self.missing)} missing key(s) (the model needs them, the file lacks them): "
                         + _names(self.missing, max_names))
        if self.unexpected:
            lines.append(f"{len(self.unexpected)} unexpected key(s) (in the file, not in the model): "
                         + _names(self.unexpected, max_names))
        if self.mismatched:
            shown = ", ".join(f"{k} (model {_shape(a)}, file {_shape(b)})"
                              for k, a, b in self.mismatched[:max_names])
            more = f", ... and {len(self.mismatched) - max_names} more" if len(self.mismatched) > max_names else ""
            lines.append(f"{len(self.mismatched)} key(s) with the wrong shape: {shown}{more}")
        return lines

    def ignored_line(self) -> Optional[str]:
        if not self.ignored:
            return None
        groups = Counter(_head(k) for k in self.ignored)
        return (f"skipped {len(self.ignored)} extra key(s) the model does not use ("
                + ", ".join(f"{p}.* ×{n}" for p, n in sorted(groups.items())) + ")")


@dataclass
class LoadReport:
    """What `load_checkpoint` did. `ok` is False only for a non-strict load that skipped something."""

    path: str
    format: str                          # "pt" | "pt-legacy" | "safetensors"
    wrapper: Optional[str]               # key the state dict was found under, None for a bare one
    stripped_prefix: Optional[str]       # "module." / "_orig_mod." when removed from every key
    strict: bool
    loaded: int = 0                      # tensors copied into the model
    values: int = 0                      # numbers copied
    diff: KeyDiff = field(default_factory=KeyDiff)
    converted: dict[str, int] = field(default_factory=dict)   # "bfloat16->float32" -> tensor count
    ignored_entries: list[str] = field(default_factory=list)  # non-tensor top-level entries left alone
    warnings: list[str] = field(default_factory=list)

    @property
    def missing(self) -> list[str]:
        return self.diff.missing

    @property
    def unexpected(self) -> list[str]:
        return self.diff.unexpected

    @property
    def mismatched(self) -> list[tuple[str, tuple, tuple]]:
        return self.diff.mismatched

    @property
    def ignored(self) -> list[str]:
        return self.diff.ignored

    @property
    def ok(self) -> bool:
        return self.diff.fits

    def summary(self) -> str:
        where = f"[{self.format}" + (f", under {self.wrapper!r}" if self.wrapper else "") + "]"
        lines = [f"loaded {self.loaded} tensors ({self.values:,} values) from {Path(self.path).name} {where}"]
        lines += [f"  {w}" for w in self.warnings]
        lines += [f"  {p}" for p in self.diff.problem_lines()]
        return "\n".join(lines)


@dataclass
class CheckpointInfo:
    """What a checkpoint file holds, read from metadata only (no tensor data is touched)."""

    path: str
    format: str
    file_bytes: int
    wrapper: Optional[str]
    stripped_prefix: Optional[str]
    tensors: dict[str, tuple[tuple[int, ...], str]]   # name -> (shape, dtype name)
    ignored_entries: list[str] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)  # safetensors header metadata
    dataless: int = 0            # tensors saved from the meta device: shapes only, not loadable

    @property
    def num_tensors(self) -> int:
        return len(self.tensors)

    @property
    def num_values(self) -> int:
        return sum(_numel(s) for s, _ in self.tensors.values())

    @property
    def tensor_bytes(self) -> int:
        return sum(_numel(s) * _DTYPE_BYTES.get(d, 4) for s, d in self.tensors.values())

    def dtypes(self) -> dict[str, int]:
        """dtype name -> tensor count."""
        return dict(Counter(d for _, d in self.tensors.values()).most_common())

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: s for k, (s, _) in self.tensors.items()}

    def prefixes(self, depth: int = 1) -> list[tuple[str, int, int]]:
        """(prefix, tensors, values) grouped by the first `depth` name parts, numbered parts
        (block indices) collapsed to `*`, in first-seen order."""
        counts: dict[str, list[int]] = {}
        for name, (shape, _) in self.tensors.items():
            parts = name.split(".")[:-1][:depth] or [name]
            key = ".".join("*" if p.isdigit() else p for p in parts)
            c = counts.setdefault(key, [0, 0])
            c[0] += 1
            c[1] += _numel(shape)
        return [(k, n, v) for k, (n, v) in counts.items()]


# --- opening files -----------------------------------------------------------------------------

def detect_format(path: Path) -> str:
    """"pt" (zip), "pt-legacy" (old pickle), "safetensors"; CheckpointError for anything else."""
    if not path.exists():
        raise CheckpointError(f"checkpoint not found: {path}")
    if path.is_dir():
        raise CheckpointError(f"{path} is a folder; choose the checkpoint file inside it (.pt or .safetensors)")
    size = path.stat().st_size
    if size == 0:
        raise CheckpointError(f"{path} is empty (0 bytes) — an interrupted download?")
    with open(path, "rb") as f:
        head = f.read(16)
    if head.startswith(b"PK\x03\x04"):
        return "pt"
    if len(head) >= 9:
        (n,) = struct.unpack("<Q", head[:8])
        if head[8:9] == b"{" and 8 + n <= size:
            return "safetensors"
        if head[8:9] == b"{":
            raise CheckpointError(f"{path} is a damaged or incomplete safetensors file "
                                  f"(its header claims {n:,} bytes, the file has {size:,})")
    if head[:1] == b"\x80":
        return "pt-legacy"
    raise CheckpointError(f"{path} is not a model checkpoint: expected a PyTorch .pt/.pth file "
                          f"or a .safetensors file (it starts with bytes {head[:8]!r})")


class _Checkpoint:
    """An opened checkpoint: names, shapes and dtypes up front; tensor data fetched one at a time."""

    def __init__(self, path: Path):
        self.path = path
        self.format = detect_format(path)
        self.wrapper: Optional[str] = None
        self.stripped_prefix: Optional[str] = None
        self.ignored_entries: list[str] = []
        self.metadata: dict[str, str] = {}
        self._state: Optional[dict] = None     # pt: name -> tensor (memory-mapped)
        self._st = None                        # safetensors handle
        self._st_names: dict[str, str] = {}   # our name -> name in the safetensors file
        self.dataless: list[str] = []
        if self.format == "safetensors":
            self._open_safetensors()
        else:
            self._open_torch()

    # -- torch ----------------------------------------------------------------------------------
    def _open_torch(self) -> None:
        import pickle

        import torch

        try:
            with warnings.catch_warnings():  # torch warns about pickle protocols; the outcome is what matters
                warnings.simplefilter("ignore", UserWarning)
                obj = torch.load(self.path, map_location="cpu", weights_only=True, mmap=self.format == "pt")
        except pickle.UnpicklingError as exc:
            raise CheckpointError(_refusal_message(self.path, exc)) from None
        except (RuntimeError, EOFError, KeyError, ValueError, OSError, IndexError, struct.error) as exc:
            raise CheckpointError(
                f"cannot read {self.path}: the file is damaged, incomplete (an interrupted download?) "
                f"or not a PyTorch checkpoint ({type(exc).__name__}: {_first_line(exc)})") from None
        state, self.wrapper, self.ignored_entries = _unwrap(obj, self.path)
        self._state, self.stripped_prefix = _strip_prefix(state)
        self.dataless = [k for k, v in self._state.items() if v.is_meta]  # saved from the meta device

    # -- safetensors ----------------------------------------------------------------------------
    def _open_safetensors(self) -> None:
        from safetensors import safe_open

        try:
            self._st = safe_open(str(self.path), framework="pt", device="cpu")
            names = list(self._st.keys())
            self.metadata = dict(self._st.metadata() or {})
        except Exception as exc:  # SafetensorError is not exported under a stable name
            raise CheckpointError(f"cannot read {self.path}: damaged or incomplete safetensors file "
                                  f"({_first_line(exc)})") from None
        renamed, self.stripped_prefix = _strip_prefix({n: n for n in names})
        self._st_names = renamed

    # -- access ---------------------------------------------------------------------------------
    def meta(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """name -> (shape, dtype name), without reading tensor data."""
        if self._st is not None:
            out = {}
            for name, raw in self._st_names.items():
                sl = self._st.get_slice(raw)
                out[name] = (tuple(int(d) for d in sl.get_shape()), _SAFETENSORS_DTYPES.get(sl.get_dtype(), sl.get_dtype().lower()))
            return out
        return {k: (tuple(v.shape), _dtype_name(v.dtype)) for k, v in self._state.items()}

    def tensor(self, name: str):
        if self._st is not None:
            return self._st.get_tensor(self._st_names[name])
        return self._state[name]

    def close(self) -> None:
        self._state = None  # drops the memory map once the last tensor view is gone
        self._st = None

    def __enter__(self) -> "_Checkpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _unwrap(obj: Any, path: Path) -> tuple[dict, Optional[str], list[str]]:
    """Find the state dict inside what torch.load returned: (state, wrapper key, ignored entries)."""
    import torch

    if not isinstance(obj, Mapping):
        raise CheckpointError(f"{path} holds a {type(obj).__name__}, not a dictionary of weights")

    def tensor_dict(v: Any) -> bool:
        return isinstance(v, Mapping) and len(v) > 0 and all(isinstance(t, torch.Tensor) for t in v.values())

    top = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    if top and len(top) == len(obj):
        return dict(obj), None, []
    if tensor_dict(obj.get("model")):
        return dict(obj["model"]), "model", sorted(str(k) for k in obj if k != "model")
    candidates = [k for k in WRAPPER_KEYS if tensor_dict(obj.get(k))]
    if top:
        candidates.append("<top level>")
    if len(candidates) == 1:
        key = candidates[0]
        if key == "<top level>":
            return top, None, sorted(str(k) for k in obj if k not in top)
        return dict(obj[key]), key, sorted(str(k) for k in obj if k != key)
    if len(candidates) > 1:
        raise CheckpointError(f"{path} holds several sets of weights ({', '.join(map(repr, candidates))}) "
                              f"and it is not clear which one to load; save the one you want on its own")
    shown = ", ".join(repr(k) for k in list(obj)[:12])
    raise CheckpointError(f"{path} holds no model weights that could be recognised "
                          f"(top-level entries: {shown or 'none'})")


def _strip_prefix(state: dict) -> tuple[dict, Optional[str]]:
    for prefix in STRIPPABLE_PREFIXES:
        if state and all(isinstance(k, str) and k.startswith(prefix) for k in state):
            return {k[len(prefix):]: v for k, v in state.items()}, prefix
    return state, None


def _refusal_message(path: Path, exc: Exception) -> str:
    text = str(exc)
    m = re.search(r"GLOBAL ([\w.]+)", text)
    if m:
        why = f"it asks to run code ({m.group(1)}) while being opened"
    else:
        detail = text.split("\n\n")[1].strip() if "\n\n" in text else _first_line(exc)
        why = f"it holds pickle content that the safe weights loader does not accept ({detail.splitlines()[-1]})"
    return (f"refused to load {path}: it is not a plain weights file — {why}. Nothing in it was executed. "
            f"Use a plain state-dict checkpoint (.pt saved with torch.save(model.state_dict())) "
            f"or a .safetensors file from a source you trust.")


# --- public API --------------------------------------------------------------------------------

def inspect_checkpoint(path: str | os.PathLike) -> CheckpointInfo:
    """Read what a checkpoint holds (names, shapes, dtypes, wrapper, size) without its tensor data."""
    path = Path(path)
    with _Checkpoint(path) as ck:
        return CheckpointInfo(
            path=str(path), format=ck.format, file_bytes=path.stat().st_size, wrapper=ck.wrapper,
            stripped_prefix=ck.stripped_prefix, tensors=ck.meta(), ignored_entries=ck.ignored_entries,
            metadata=ck.metadata, dataless=len(ck.dataless))


def compare_shapes(found: Mapping[str, tuple], expected: Mapping[str, tuple],
                   ignore_prefixes: tuple[str, ...] = BENIGN_EXTRA_PREFIXES) -> KeyDiff:
    """Compare a file's name -> shape map with a model's. Extras under `ignore_prefixes` are
    `ignored`, not `unexpected`."""
    diff = KeyDiff()
    for name, shape in expected.items():
        if name not in found:
            diff.missing.append(name)
        elif tuple(found[name]) != tuple(shape):
            diff.mismatched.append((name, tuple(shape), tuple(found[name])))
        else:
            diff.matched.append(name)
    for name in found:
        if name not in expected:
            (diff.ignored if name.startswith(ignore_prefixes) else diff.unexpected).append(name)
    return diff


def architecture_shapes(arch: str = "lingbot-map") -> dict[str, tuple[int, ...]]:
    """name -> shape of every state-dict entry of `build_model(arch)`, built on the meta device
    (no memory, no weights). Unknown names raise EngineError."""
    import torch

    from .model_zoo import build_model

    with torch.device("meta"):
        model = build_model(arch)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def check_checkpoint(path: str | os.PathLike, arch: str = "lingbot-map") -> tuple[CheckpointInfo, KeyDiff]:
    """Does the file fit `build_model(arch)`? Metadata only, cheap enough for a settings panel to
    call when a file is chosen. CheckpointError if unreadable or refused."""
    info = inspect_checkpoint(path)
    return info, compare_shapes(info.shapes(), architecture_shapes(arch))


def read_key_list(path: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    """Read a `key<TAB>shape<TAB>dtype` list (the fixtures' format) into name -> shape."""
    out = {}
    for line in Path(path).read_text().splitlines():
        if line.strip():
            key, shape = line.split("\t")[:2]
            out[key] = tuple(int(d) for d in shape.split(",") if d)
    return out


def load_checkpoint(model, path: str | os.PathLike, *, strict: bool = True,
                    ignore_prefixes: tuple[str, ...] = BENIGN_EXTRA_PREFIXES,
                    max_names: int = DEFAULT_MAX_NAMES,
                    progress: Optional[Callable[[int, int], None]] = None) -> LoadReport:
    """Load a checkpoint into `model` (a torch.nn.Module) in place and return a `LoadReport`.

    strict=True: any missing, unexpected (other than `ignore_prefixes`) or mis-shaped key raises
    CheckpointError listing them, before the model is touched. strict=False loads what matches and
    lists the rest in the report. `progress(done, total)` is called after each tensor.
    Raises CheckpointError (with the report as `.report` for key problems) for every failure."""
    import torch

    path = Path(path)
    with _Checkpoint(path) as ck:
        report = LoadReport(path=str(path), format=ck.format, wrapper=ck.wrapper,
                            stripped_prefix=ck.stripped_prefix, strict=strict,
                            ignored_entries=ck.ignored_entries)
        targets = model.state_dict(keep_vars=True)          # live parameters and buffers
        meta = ck.meta()
        report.diff = diff = compare_shapes({k: s for k, (s, _) in meta.items()},
                                            {k: tuple(t.shape) for k, t in targets.items()}, ignore_prefixes)
        if ck.stripped_prefix:
            report.warnings.append(f"removed the {ck.stripped_prefix!r} prefix from every key")
        if ck.ignored_entries:
            report.warnings.append("left alone non-weight entries: " + _names(ck.ignored_entries, max_names))
        line = diff.ignored_line()
        if line:
            report.warnings.append(line)
        if not diff.fits:
            head = f"checkpoint {path} does not fit the model:"
            body = "\n  ".join(diff.problem_lines(max_names))
            if strict:
                err = CheckpointError(f"{head}\n  {body}")
                err.report = report
                raise err
            report.warnings.append(f"non-strict load, skipped: {'; '.join(diff.problem_lines(max_names))}")

        if ck.dataless:
            raise CheckpointError(f"{path} holds only tensor shapes, no data ({len(ck.dataless)} tensors "
                                  f"saved from the meta device, e.g. {ck.dataless[0]})")
        assign: dict[str, Any] = {}
        total = len(diff.matched)
        release = None
        if diff.matched and ck.format in ("pt", "safetensors"):
            release = _page_releaser(ck.tensor(diff.matched[0]))
        with torch.no_grad():
            for i, name in enumerate(diff.matched):
                src, dst = ck.tensor(name), targets[name]
                if src.dtype != dst.dtype:
                    key = f"{_dtype_name(src.dtype)}->{_dtype_name(dst.dtype)}"
                    report.converted[key] = report.converted.get(key, 0) + 1
                if dst.is_meta:
                    # Nothing allocated to copy into: adopt the (memory-mapped) tensor itself, or
                    # its converted copy, after which the file pages are no longer needed.
                    assign[name] = src.to(dst.dtype)
                    if release is not None and src.dtype != dst.dtype:
                        release(src)
                else:
                    dst.copy_(src)                           # converts dtype and device, one tensor at a time
                    if release is not None:
                        release(src)
                report.loaded += 1
                report.values += src.numel()
                del src
                if progress is not None:
                    progress(i + 1, total)
        if assign:
            model.load_state_dict(assign, strict=False, assign=True)
            still = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
            if still:  # non-persistent buffers are not in any checkpoint
                report.warnings.append(f"{len(still)} tensor(s) not stored in checkpoints are still on the meta "
                                       f"device and must be re-created before use: {_names(still, max_names)}")
        for key, n in report.converted.items():
            report.warnings.append(f"converted {n} tensor(s) {key.replace('->', ' → ')}")
    return report


def _page_releaser(sample) -> Optional[Callable[[Any], None]]:
    """On Linux, a function that drops a copied file-backed tensor's pages from this process's
    resident set (madvise MADV_DONTNEED on the private file mapping), so peak RSS stays near the
    model's size instead of model + file. The pages stay in the OS file cache; touching them
    again re-reads the unchanged file, so a tensor shared under two names stays correct.
    None where this is not possible or the tensor is not backed by a file mapping."""
    import sys

    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        madvise = ctypes.CDLL(None, use_errno=True).madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        page = os.sysconf("SC_PAGE_SIZE")
        ptr = sample.data_ptr()
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split()
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                if lo <= ptr < hi:
                    file_backed = len(fields) >= 6 and fields[4] != "0" and fields[1].endswith("p")
                    break
            else:
                file_backed = False
    except Exception:
        return None
    if not file_backed:
        return None
    MADV_DONTNEED = 4

    def release(t) -> None:
        if not t.is_contiguous():
            return
        start = t.data_ptr()
        end = start + t.numel() * t.element_size()
        a, b = -(-start // page) * page, end // page * page     # whole pages inside the tensor only
        if b > a:
            madvise(a, b - a, MADV_DONTNEED)

    return release


# --- helpers -----------------------------------------------------------------------------------

def _numel(shape: tuple) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _shape(shape: tuple) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _head(name: str) -> str:
    return name.split(".", 1)[0]


def _names(names: list[str], max_names: int) -> str:
    shown = ", ".join(names[:max_names])
    return shown + (f", ... and {len(names) - max_names} more" if len(names) > max_names else "")


def _first_line(exc: BaseException) -> str:
    text = (str(exc).strip() or type(exc).__name__).splitlines()[0]
    if len(text) > 120 and ". " in text:  # torch's messages run on; the first sentence says it
        text = text.split(". ", 1)[0]
    return text[:200]

