"""Which checkpoint a model was loaded from: a record that goes with every result it makes.

A benchmark number names the target and the drafter that made it. A path alone does not: a folder can be
retrained in place, and ``builtin:dspark-smollm2`` is whatever drafter the installed package ships. Each record
holds the resolved path and digests of what was read:

- a drafter folder: the sha256 of its weights (from the sha256 of every shard its index records, so nothing
  is hashed twice; of the weights file where the index records none) and of its calibration file;
- a target folder converted from a GGUF (:func:`dspark.models.loading.prepare_smollm2`): the GGUF's name and
  sha256 from the conversion's manifest and the dtype it was converted to;
- any other Hugging Face folder: the sha256 of its ``config.json`` and of its weights files when they
  total at most :data:`HASH_LIMIT_BYTES` (larger ones are recorded by name and size, and the record says so).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from dspark.models.drafter import INDEX_FILE, PACKED_SUFFIX, TEMPERATURES_FILE, WEIGHTS_FILE
from dspark.models.loading import MANIFEST_NAME, file_sha256, safetensors_files

HASH_LIMIT_BYTES = 2 << 30  # hashing 2 GiB takes a few seconds; a larger checkpoint is recorded by size


def _digest_of_records(records: dict[str, str]) -> str:
    """One sha256 over named digests (sorted by name), so a set of shards has one identity."""
    text = "\n".join(f"{name} {sha}" for name, sha in sorted(records.items()))
    return hashlib.sha256(text.encode()).hexdigest()


def _shard_files(folder: Path, names: set[str]) -> dict[str, Path]:
    """Each shard's file on disk: the shard itself, else its packed (xz) form."""
    out = {}
    for name in sorted(names):
        plain, packed = folder / name, folder / (name + PACKED_SUFFIX)
        out[name] = plain if plain.is_file() else packed
    return out


def calibration_record(folder: str | Path) -> dict[str, Any] | None:
    """The calibration file of ``folder`` (``temperatures.json``): path, sha256 and method; None without one."""
    path = Path(folder) / TEMPERATURES_FILE
    if not path.is_file():
        return None
    try:
        method = json.loads(path.read_text()).get("method")
    except (OSError, ValueError, AttributeError):
        method = None
    return {"path": str(path.resolve()), "sha256": file_sha256(path), "method": method}


def drafter_record(folder: str | Path) -> dict[str, Any]:
    """Path, weights sha256 and calibration of the drafter checkpoint in ``folder`` (one that loaded)."""
    src = Path(folder)
    index_path = src / INDEX_FILE
    if index_path.is_file():
        index = json.loads(index_path.read_text())
        recorded = (index.get("metadata") or {}).get("files") or {}
        names = set((index.get("weight_map") or {}).values())
        shas = {name: (recorded.get(name) or {}).get("sha256") for name in names}
        missing = [name for name, sha in shas.items() if not sha]
        if missing:  # an index without digests: hash what is on disk (a packed shard as stored)
            shas.update({name: file_sha256(path) for name, path in _shard_files(src, set(missing)).items()})
        weights = _digest_of_records(shas)
    else:
        weights = file_sha256(src / WEIGHTS_FILE)
    return {"path": str(src.resolve()), "weights_sha256": weights, "calibration": calibration_record(src)}


def target_record(folder: str | Path) -> dict[str, Any]:
    """Path and digests of the target checkpoint in ``folder`` (see the module docstring)."""
    src = Path(folder)
    out: dict[str, Any] = {"path": str(src.resolve())}
    manifest_path = src / MANIFEST_NAME
    if manifest_path.is_file():
        manifest = json.loads(manifest_path.read_text())
        out.update({"source": manifest.get("source_name"), "source_sha256": manifest.get("source_sha256"),
                    "converted_dtype": manifest.get("dtype")})
        return out
    config = src / "config.json"
    out["config_sha256"] = file_sha256(config) if config.is_file() else None
    weights = safetensors_files(src)  # the files load_hf_folder reads
    total = sum(p.stat().st_size for p in weights)
    if total <= HASH_LIMIT_BYTES:
        out["weights_sha256"] = _digest_of_records({p.name: file_sha256(p) for p in weights})
    else:
        out["weights_sha256"] = None
        out["weights_not_hashed"] = (f"{total / 2**30:.1f} GiB in {len(weights)} files, over the "
                                     f"{HASH_LIMIT_BYTES / 2**30:.0f} GiB hashed; sizes recorded")
        out["weights_sizes"] = {p.name: p.stat().st_size for p in weights}
    return out
