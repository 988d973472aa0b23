"""One source of truth for settings: every SessionConfig field carries setting() metadata, gets a
flag in run / gui / eval (and bench for the streaming engine's), round-trips through the flags and
the defaults file, and old `extra` keys land in their typed fields."""
import dataclasses
import json

import pytest

from app.cli import build_parser
from app.config_flags import config_from_args, flag_name, given_settings
from app.settings import DEFAULTS_FILE, session_defaults
from engine.api import (SessionConfig, SettingError, _field_kind, engine_capabilities, setting_fields,
                        setting_problems)

FIELDS = [f for f in dataclasses.fields(SessionConfig) if f.name != "extra"]


def _sub(name):
    parser = build_parser()
    return parser, next(a for a in parser._subparsers._group_actions).choices[name]


def _nondefault(f, meta):
    """A valid value different from the default."""
    kind = _field_kind(f)
    if f.name == "engine":
        return "lingbot-map"
    if f.name == "device":
        return "cuda:1"
    if f.name == "intrinsics":
        return (500.0, 501.0, 320.0, 240.0, 640.0, 480.0)
    if meta["choices"]:
        return next(c for c in meta["choices"] if c != f.default)
    if kind is bool:
        return not f.default
    if kind in (int, float):
        lo, hi = meta["range"]
        step = meta["step"] or (1 if kind is int else 0.05)
        v = f.default + step if f.default + step <= hi else f.default - step
        return kind(round(v, 6)) if kind is float else int(v)
    return "/some/file.txt"


def _argv(cfg):
    out = []
    for f, meta in setting_fields():
        v = getattr(cfg, f.name)
        if v == f.default:
            continue
        if isinstance(v, bool):
            out.append(flag_name(f.name) if v else "--no-" + f.name.replace("_", "-"))
        elif isinstance(v, tuple):
            out += [flag_name(f.name), ",".join(f"{x:g}" for x in v)]
        else:
            out += [flag_name(f.name), str(v)]
    return out


def test_every_field_is_a_described_setting():
    described = {f.name for f, _ in setting_fields()}
    assert described == {f.name for f in FIELDS}
    for f, meta in setting_fields():
        assert meta["label"] and len(meta["tooltip"]) > 20, f.name
        if meta["choices"]:
            assert f.default in meta["choices"], f.name
        if meta["range"] and f.default is not None:
            assert meta["range"][0] <= f.default <= meta["range"][1], f.name
    assert setting_problems(SessionConfig()) == []


@pytest.mark.parametrize("command", ["run", "gui", "eval"])
def test_every_field_has_a_flag_and_round_trips(command, tmp_path):
    parser, sub = _sub(command)
    flags = {o for a in sub._actions for o in a.option_strings}
    for f in FIELDS:
        assert flag_name(f.name) in flags, (command, f.name)
    cfg = SessionConfig(**{f.name: _nondefault(f, f.metadata["setting"]) for f in FIELDS
                           if f.name != "intrinsics_file"})
    pos = {"run": ["INPUT"], "eval": ["SEQ"], "gui": []}[command]
    args = parser.parse_args([command, *pos, *_argv(cfg)])
    back = config_from_args(args)
    assert back == cfg
    # a file given to --intrinsics goes to intrinsics_file
    f = tmp_path / "intrinsics.txt"
    f.write_text("500 500 320 240 640 480\n")
    args = parser.parse_args([command, *pos, "--intrinsics", str(f)])
    assert given_settings(args) == {"intrinsics_file": str(f)}
    # nothing given = nothing overridden
    assert given_settings(parser.parse_args([command, *pos])) == {}


def test_bench_flags_cover_the_streaming_engine():
    parser, sub = _sub("bench")
    flags = {o for a in sub._actions for o in a.option_strings}
    caps = engine_capabilities("lingbot-map")
    for name in caps["fields"]:
        if name not in ("checkpoint", "mode", "fps", "decode_max_side"):   # bench: no input decoding
            assert flag_name(name) in flags, name
    args = parser.parse_args(["bench", "--kv-compression", "token_merge", "--kv-keep-ratio", "0.25",
                              "--kv-dtype", "int8", "--no-cuda-graphs"])
    assert given_settings(args) == {"kv_compression": "token_merge", "kv_keep_ratio": 0.25,
                                    "kv_dtype": "int8", "cuda_graphs": False}
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "--kv-keep-ratio", "3"])       # outside the declared range


def test_defaults_file_is_generated_from_the_metadata():
    d = json.loads(DEFAULTS_FILE.read_text(encoding="utf-8"))
    assert d["session"] == json.loads(json.dumps(session_defaults())), "run `python -m app.settings`"
    assert SessionConfig.from_dict(d["session"]) == SessionConfig()
    cfg = SessionConfig(**{f.name: _nondefault(f, f.metadata["setting"]) for f in FIELDS})
    assert SessionConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_old_extra_keys_become_typed_fields():
    old = {"engine": "lingbot-map", "extra": {"cuda_graphs": "false", "model": "lingbot-map-tiny",
                                             "intrinsics_file": "/x/intrinsics.txt", "depth": 0,
                                             "depth_width": "256", "max_features": 300, "future_knob": 7}}
    cfg = SessionConfig.from_dict(old)
    assert (cfg.cuda_graphs, cfg.model, cfg.intrinsics_file, cfg.depth, cfg.depth_width, cfg.max_features) == \
        (False, "lingbot-map-tiny", "/x/intrinsics.txt", False, 256, 300)
    assert cfg.extra == {"future_knob": 7}
    assert SessionConfig(extra={"model": "lingbot-map-tiny"}).model == "lingbot-map-tiny"
    with pytest.raises(SettingError, match="max_features"):
        SessionConfig.from_dict({"max_features": "many"})
    assert any("kv_keep_ratio" in p for p in setting_problems(SessionConfig(kv_keep_ratio=2.0)))


def test_capabilities_fields_and_tooltips_come_from_the_metadata():
    geo = engine_capabilities("geometric")
    assert {"depth", "depth_width", "depth_max_lag", "max_features", "intrinsics_file"} <= set(geo["fields"])
    assert "window" not in geo["fields"]
    lb = engine_capabilities("lingbot-map")
    assert {"kv_compression", "kv_dtype", "kv_keep_ratio", "weight_dtype", "cuda_graphs", "model"} <= set(lb["fields"])
    assert lb["tooltips"]["kv_keep_ratio"] == dict(
        (f.name, m["tooltip"]) for f, m in setting_fields())["kv_keep_ratio"]
    assert lb["model_choices"] == ["lingbot-map", "lingbot-map-tiny"]
