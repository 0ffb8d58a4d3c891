"""Compute kernels: each op has a plain-PyTorch reference (the specification) and a Triton kernel."""
