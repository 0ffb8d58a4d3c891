"""Which checkpoint a model came from (dspark.models.provenance), as an engine and an A/B record it."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from dspark.config import EngineConfig
from dspark.engine import Engine
from dspark.models import provenance
from dspark.models.drafter import DSparkDrafter, compress_shards
from dspark.models.loading import MANIFEST_NAME, file_sha256
from dspark.training.calibration import save_temperatures
from tiny import tiny_drafter, tiny_target


@pytest.fixture
def target():
    return tiny_target(seed=0)


def test_a_loaded_drafter_names_its_weights_and_calibration(target, tmp_path):
    drafter = tiny_drafter(target, seed=1)
    drafter.save(tmp_path)
    loaded = DSparkDrafter.load(tmp_path, target.cfg)
    assert loaded.origin == {"path": str(tmp_path.resolve()),
                             "weights_sha256": file_sha256(tmp_path / "model.safetensors"), "calibration": None}
    save_temperatures(tmp_path, [1.5] * drafter.block_size)
    calibrated = DSparkDrafter.load(tmp_path, target.cfg).origin
    assert calibrated["weights_sha256"] == loaded.origin["weights_sha256"]
    assert calibrated["calibration"]["sha256"] == file_sha256(tmp_path / "temperatures.json")
    assert calibrated["calibration"]["method"] == json.loads((tmp_path / "temperatures.json").read_text())["method"]
    # Other weights, another identity; a drafter built in memory has none.
    other = tmp_path / "other"
    tiny_drafter(target, seed=2).save(other)
    assert DSparkDrafter.load(other, target.cfg).origin["weights_sha256"] != loaded.origin["weights_sha256"]
    assert drafter.origin is None


def test_sharded_drafter_identity_survives_packing_and_a_bare_index(target, tmp_path):
    tiny_drafter(target, seed=1).save(tmp_path, max_shard_bytes=20_000)
    recorded = provenance.drafter_record(tmp_path)["weights_sha256"]
    # An index without digests: the shards on disk are hashed, to the same identity.
    index_path = tmp_path / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    bare = {**index, "metadata": {}}
    index_path.write_text(json.dumps(bare))
    assert provenance.drafter_record(tmp_path)["weights_sha256"] == recorded
    # Packed (xz) shards, as the shipped drafter is stored: the index's digests are of the unpacked bytes.
    index_path.write_text(json.dumps(index))
    assert compress_shards(tmp_path, preset=1)
    assert DSparkDrafter.load(tmp_path, target.cfg).origin["weights_sha256"] == recorded


def test_target_records(tmp_path, monkeypatch):
    converted = tmp_path / "converted"
    converted.mkdir()
    (converted / MANIFEST_NAME).write_text(json.dumps({"source_name": "m.gguf", "source_sha256": "ab" * 32,
                                                       "dtype": "float32"}))
    assert provenance.target_record(converted) == {"path": str(converted.resolve()), "source": "m.gguf",
                                                   "source_sha256": "ab" * 32, "converted_dtype": "float32"}
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    save_file({"w": torch.ones(4)}, str(folder / "model.safetensors"))
    record = provenance.target_record(folder)
    assert record["config_sha256"] == file_sha256(folder / "config.json")
    assert record["weights_sha256"] and "weights_not_hashed" not in record
    monkeypatch.setattr(provenance, "HASH_LIMIT_BYTES", 0)
    large = provenance.target_record(folder)
    assert large["weights_sha256"] is None and "sizes recorded" in large["weights_not_hashed"]
    assert large["weights_sizes"] == {"model.safetensors": (folder / "model.safetensors").stat().st_size}


def test_engine_models_name_the_calibration_in_effect(target, tmp_path):
    tiny_drafter(target, seed=1).save(tmp_path / "drafter")
    save_temperatures(tmp_path / "drafter", [1.5] * 4)
    drafter = DSparkDrafter.load(tmp_path / "drafter", target.cfg)
    models = Engine(target, None, EngineConfig(), drafter).models()
    assert models["target"] == {"arch": "llama-h64-L4-V97", "dtype": "float32", "origin": None}
    assert models["drafter"]["arch"] == "block4-L1-r8-vanilla"
    assert models["drafter"]["origin"] == drafter.origin
    assert models["drafter"]["calibration"] == drafter.origin["calibration"]
    save_temperatures(tmp_path / "other_calibration", [2.0] * 4)
    engine = Engine(target, None, EngineConfig(confidence_calibration=str(tmp_path / "other_calibration")), drafter)
    effective = engine.models()["drafter"]["calibration"]
    assert effective["sha256"] == file_sha256(tmp_path / "other_calibration" / "temperatures.json")
    assert effective["sha256"] != drafter.origin["calibration"]["sha256"]
    assert Engine(target, None, EngineConfig(spec="off")).models()["drafter"] is None
