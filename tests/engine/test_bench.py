"""`reconstudio bench` on CPU with the tiny model: the CSV / JSON carry the documented columns,
and a small sweep shows the KV pages and cache bytes flat once the window and the special cap
are full (no timing assertions)."""
import csv
import json

import pytest

from engine.api import EngineError
from engine.bench import PARTS, SWEEP_COLUMNS, BenchConfig, height_for_width, run_bench


def test_bench_cli_writes_csv_and_json_and_memory_stays_flat(tmp_path):
    from app.cli import main
    csv_path, json_path = tmp_path / "sweep.csv", tmp_path / "bench.json"
    rc = main(["bench", "--model", "lingbot-map-tiny", "--device", "cpu", "--dtype", "fp32",
               "--resolution", "56x42", "--scale-frames", "2", "--window", "2", "--special-cap", "4",
               "--camera-iterations", "1", "--warmup", "2", "--frames", "12", "--breakdown",
               "--sweep", "4,8,10,12", "--csv", str(csv_path), "--json", str(json_path)])
    assert rc == 0
    with open(csv_path) as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == SWEEP_COLUMNS
        rows = list(reader)
    assert [int(r["frames"]) for r in rows] == [4, 8, 10, 12]
    for col in ("frames", "seconds", "fps", "peak_allocated_gib", "peak_reserved_gib"):
        assert col in reader.fieldnames
    assert all(r["peak_allocated_gib"] == "" for r in rows)          # CPU: no GPU figures
    # window (2) and special cap (4 frames) are full from frame 4 on: pages and bytes stay flat
    assert len({r["kv_pages_used"] for r in rows}) == 1
    assert len({r["kv_bytes"] for r in rows}) == 1
    assert [int(r["kv_cached_frames"]) for r in rows] == [4, 4, 4, 4]
    assert [int(r["kv_special_frames"]) for r in rows] == [4, 4, 4, 4]
    assert [int(r["time_index"]) for r in rows] == [4, 8, 10, 12]

    res = json.loads(json_path.read_text())
    for key in ("fps_overall", "fps_steady", "latency_p50_ms", "latency_p95_ms", "peak_allocated_gib",
                "peak_reserved_gib", "kv", "sweep", "breakdown_ms_per_frame", "config"):
        assert key in res
    assert res["frames"] == 12 and res["steady_frames"] == 8          # 12 - 2 scale - 2 warm-up
    assert res["fps_overall"] > 0 and res["fps_steady"] > 0
    assert set(res["breakdown_ms_per_frame"]) == set(PARTS)
    assert res["kv"]["backend"] == "sdpa" and res["kv"]["dtype"] == "float32"


def test_bench_rejects_bad_settings():
    with pytest.raises(EngineError, match="multiples of 14"):
        run_bench(BenchConfig(model="lingbot-map-tiny", device="cpu", width=50, height=42, frames=3))
    with pytest.raises(EngineError, match="scale-frames"):
        run_bench(BenchConfig(model="lingbot-map-tiny", device="cpu", width=56, height=42, frames=1,
                              scale_frames=2))
    assert height_for_width(518) == 378


def test_bench_cli_reports_bad_resolution(capsys):
    from app.cli import main
    with pytest.raises(SystemExit):
        main(["bench", "--resolution", "500x378"])
    assert "multiples of 14" in capsys.readouterr().err


SOME = ("exact", "token_merge 0.5", "block_sparse 0.25", "kv int8", "keyframe interval 2", "windowed")


def test_settings_table_runs_the_settings_on_the_tiny_model(tmp_path):
    """`reconstudio bench --settings-table` (CPU, the tiny model, some of the settings: all of
    them take minutes on a shared 2-core machine): a row per setting, the exact path first with
    no deviation from itself, the lossy settings deviating from it, each row saying its graph
    mode / attention path / reason (engine/fast_path.py), JSON written."""
    from app.cli import main
    from engine.bench import fast_path_settings
    from engine.fast_path import NOT_CUDA
    json_path = tmp_path / "settings.json"
    rc = main(["bench", "--model", "lingbot-map-tiny", "--device", "cpu", "--dtype", "fp32",
               "--resolution", "56x42", "--scale-frames", "2", "--window", "3", "--special-cap", "8",
               "--camera-iterations", "1", "--warmup", "3", "--frames", "9",
               "--settings-table", ",".join(SOME[1:]), "--json", str(json_path)])
    assert rc == 0
    rows = {r["setting"]: r for r in json.loads(json_path.read_text())["rows"]}
    table = fast_path_settings(BenchConfig(window=3, frames=9, scale_frames=2))
    assert list(rows) == list(SOME) and set(SOME) <= set(table) and list(table)[0] == "exact"
    assert {"token_partition 0.5", "random_subset 0.25", "kv fp8", "weights int8", "weights fp8"} <= set(table)
    for name, row in rows.items():
        assert "error" not in row, (name, row.get("error"))
        assert row["fps_steady"] > 0 and row["deviation"]["frames"] == 9, (name, row["deviation"])
        assert row["fast_path"]["graphs"] == "none" and row["fast_path"]["reason"].startswith(NOT_CUDA)
    exact = rows["exact"]["deviation"]
    assert exact["pose_rel"] == 0.0 and exact["depth_median_rel"] == 0.0
    # merging / selecting window tokens, quantizing the store, skipping keyframes change the outputs
    for name in SOME[1:]:
        assert rows[name]["deviation"]["pose_rel"] > 0, name
    # int8 keys / values are close to the float32 store (a relative step of 1/254 per vector)
    assert rows["kv int8"]["deviation"]["pose_rel"] < 5e-2 and rows["kv int8"]["backend"] == "sdpa"
