"""numba kernels, one per op: the CPU path (``docs/design.md``, "CPU path")."""
