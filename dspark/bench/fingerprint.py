"""What machine and code produced a result: a node fingerprint and live device telemetry.

A speed-up means nothing without the node, the driver, the exact commit and the
exact configuration it was measured with; two results are comparable only when
their fingerprints say so. Nothing here raises on a missing tool: an absent value is
recorded as such ("not installed", None, or a ``reason``).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

VERSIONED_PACKAGES = {"torch": "torch", "triton": "triton", "project": "dspark-bench", "numpy": "numpy",
                      "wandb": "wandb"}
GIT_TIMEOUT_S = 10


def config_hash(config: Any) -> str:
    """sha256 of the canonical JSON of ``config`` (sorted keys; non-JSON values as str)."""
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def package_versions() -> dict[str, str]:
    versions = {}
    for label, dist in VERSIONED_PACKAGES.items():
        try:
            versions[label] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[label] = "not installed"
    return versions


def _git(args: list[str], cwd: Path) -> str | None:
    # --no-optional-locks: reading status must never write the index of a tree others use.
    try:
        proc = subprocess.run(["git", "--no-optional-locks", *args], cwd=cwd, capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def git_state(project_root: Path) -> dict[str, Any]:
    """``{"sha": str | None, "dirty": bool | None}``; both None outside a git checkout."""
    sha = _git(["rev-parse", "HEAD"], Path(project_root))
    if sha is None:
        return {"sha": None, "dirty": None}
    status = _git(["status", "--porcelain", "--untracked-files=no"], Path(project_root))
    return {"sha": sha, "dirty": None if status is None else bool(status)}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _nvidia_driver_version() -> str:
    try:
        import pynvml  # provided by the nvidia-ml-py package
        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
            return version.decode() if isinstance(version, bytes) else str(version)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # NVML missing or unusable: ask the CLI next
        pass
    try:
        proc = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=False)
        if proc.returncode == 0 and proc.stdout.strip():
            return proc.stdout.strip().splitlines()[0]
    except (OSError, subprocess.TimeoutExpired):
        pass
    return "unknown (neither NVML nor nvidia-smi answered)"


def device_info() -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {"device": "cpu", "cpu_model": _cpu_model(), "torch": "not installed"}
    if not torch.cuda.is_available():
        return {"device": "cpu", "cpu_model": _cpu_model(), "cpu_count": os.cpu_count()}
    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    return {
        "device": "cuda",
        "device_name": torch.cuda.get_device_name(index),
        "device_count": torch.cuda.device_count(),
        "compute_capability": f"{props.major}.{props.minor}",
        "total_memory_gib": round(props.total_memory / 2**30, 2),
        "cuda_runtime": torch.version.cuda,
        "driver": _nvidia_driver_version(),
        "cpu_model": _cpu_model(),
    }


def node_fingerprint(config: dict | None, project_root: Path) -> dict[str, Any]:
    """Hostname, platform, versions, device, git commit and config hash of this run. (Which kernels
    ran is each engine's configuration, ``engine.attention_backend``, ``engine.batch_invariant`` and
    ``engine.kernels.*``, recorded with the engine's config and in cost-table fingerprints.)"""
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "versions": package_versions(),
        **device_info(),
        "git": git_state(project_root),
        "config_hash": None if config is None else config_hash(config),
    }


def device_telemetry() -> dict[str, Any]:
    """NVML clocks (MHz), temperature (C) and power (W) per GPU, read now. Never raises."""
    try:
        import pynvml
    except ImportError:
        return {"available": False, "reason": "pynvml not importable (pip install nvidia-ml-py)"}
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        return {"available": False, "reason": f"nvmlInit failed: {exc}"}
    try:
        devices = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            readings: dict[str, Any] = {"index": index}
            probes = {
                "sm_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                "mem_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
                "temperature_c": lambda: pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
                "power_w": lambda: pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
            }
            for key, probe in probes.items():
                try:
                    readings[key] = probe()
                except Exception as exc:  # one unreadable sensor must not hide the others
                    readings[key] = None
                    readings.setdefault("unreadable", {})[key] = str(exc)
            devices.append(readings)
        return {"available": True, "devices": devices}
    except Exception as exc:
        return {"available": False, "reason": f"NVML query failed: {exc}"}
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
