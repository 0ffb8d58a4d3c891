"""Programmatic dependent launch (PDL) for the engine's Triton kernels, on Hopper and later.

A kernel launched with PDL may start while the kernel before it on the stream is still running:
its programs are scheduled early and block in ``griddepcontrol.wait`` (``tl.extra.cuda.gdc_wait``)
until the previous kernel has finished and its writes are visible. What runs before the wait is
free to overlap the previous kernel's tail; in a chain of small decode kernels that hides most of
the launch gap between them. CUDA graphs keep the edge (stream capture records it).

The contract every kernel here follows when ``USE_PDL`` is set:

- ``gdc_wait()`` is reached by every program, before its first read of anything an earlier
  kernel writes and before its first write (outputs may still be read by the previous kernel),
  and before any early return (a grid whose programs all returned unsynchronised would let the
  *next* kernel's wait pass while the one before is still running);
- what runs before the wait reads only data no kernel in the step writes (weights);
- ``gdc_launch_dependents()`` comes first, so the next kernel is scheduled as early as possible.

The switch: ``DSPARK_PDL=1`` turns it on (default off until measured on the device),
``DSPARK_PDL=0`` off. It is only ever on for CUDA tensors on compute capability >= 9.0 with a
Triton that has the launch option; :func:`pdl_launch` then returns the launch keyword. Under the
CPU interpreter it is always off (the interpreter has no grid dependency control).
"""

from __future__ import annotations

import functools

import torch

from kernels.switches import interpreted, opt_in


@functools.lru_cache(maxsize=None)
def _triton_has_pdl() -> bool:
    try:
        import triton.language as tl
        from triton.backends.nvidia.compiler import CUDAOptions
    except Exception:  # pragma: no cover - no triton / no nvidia backend
        return False
    return hasattr(tl.extra.cuda, "gdc_wait") and "launch_pdl" in getattr(CUDAOptions, "__dataclass_fields__", {})


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def requested() -> bool:
    """What DSPARK_PDL asks for (values other than 0/1 are refused)."""
    return opt_in("DSPARK_PDL", "programmatic dependent launch on")


def pdl_enabled(device: torch.device) -> bool:
    """True when kernels on ``device`` launch with PDL (see the module docstring)."""
    if not requested() or device.type != "cuda" or interpreted():
        return False
    if not _triton_has_pdl():
        raise RuntimeError("DSPARK_PDL=1 but this Triton has no launch_pdl option (needs Triton >= 3.3); "
                           "unset DSPARK_PDL")
    return _capability(device.index if device.index is not None else torch.cuda.current_device()) >= (9, 0)


def pdl_launch(device: torch.device) -> tuple[bool, dict]:
    """(USE_PDL constexpr, extra launch kwargs) for a kernel launched on ``device``."""
    on = pdl_enabled(device)
    return on, ({"launch_pdl": True} if on else {})


__all__ = ["pdl_enabled", "pdl_launch", "requested"]
