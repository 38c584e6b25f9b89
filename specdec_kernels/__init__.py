"""specdec-kernels: Triton kernels for speculative decoding, exposed as torch ops.

Importing this package registers the ``torch.ops.specdec.*`` operators. It never
touches the GPU driver at import time, so it imports on machines without a GPU.

Layers
------
- ``specdec_kernels.ops``: the public, validated Python API and the torch op layer.
- ``specdec_kernels.kernels``: Triton kernels and their launchers (the CUDA path).
- ``specdec_kernels.cpu``: numba kernels, one per op (the CPU path).
- ``specdec_kernels.reference``: plain, obviously correct implementations (test oracle).
- ``specdec_kernels.constants``: ``PLACEHOLDER``, ``PAD_SLOT``, the finish reasons.

``docs/design.md`` has the contracts and which layer may import which.
"""

from specdec_kernels.constants import PAD_SLOT, PLACEHOLDER

__version__ = "0.3.0"


def _find_ops_in_source_tree() -> None:
    """Let ``specdec_kernels.ops`` resolve to the repository's top-level ``ops/`` folder.

    Installs map ``ops/`` to ``specdec_kernels/ops`` (pyproject package-dir). A source
    checkout used without installing (``python -m pytest`` from the repository root, the
    GPU check on a machine where nothing is installed) has no such folder, so the
    repository root joins this package's search path; in a wheel the condition is false.
    """
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    if not os.path.isfile(os.path.join(here, "ops", "__init__.py")) and os.path.isfile(
        os.path.join(root, "ops", "_library.py")
    ):
        __path__.append(root)


_find_ops_in_source_tree()

from specdec_kernels import ops  # noqa: E402  (registers torch.ops.specdec.*)

__all__ = ["PLACEHOLDER", "PAD_SLOT", "ops", "__version__"]
