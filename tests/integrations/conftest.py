"""vLLM integration tests: they run only where vLLM is installed (``make test-vllm`` builds
that venv); the main test venv has no vLLM and does not collect this folder.

On a machine without a GPU, vLLM's CUDA wheel resolves no platform and turns Triton off
(it finds no active driver) unless ``CUDA_VISIBLE_DEVICES`` is set and empty; set so, its
rejection-sampler kernels run under ``TRITON_INTERPRET=1`` on CPU tensors, like ours.
"""

from __future__ import annotations

import importlib.util
import os

VLLM_MISSING = importlib.util.find_spec("vllm") is None
REASON = (
    "tests/integrations not collected: vllm is not importable in this environment "
    "(run `make test-vllm`, which builds a venv with vllm==0.33.0 and its torch)"
)

if VLLM_MISSING:
    collect_ignore_glob = ["test_*.py"]

    def pytest_terminal_summary(terminalreporter):
        terminalreporter.write_line(REASON)

else:
    import torch

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # every config here comes from local files
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    if not torch.cuda.is_available():
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
        from vllm.platforms import current_platform

        # with no driver, host memory cannot be pinned, but the unresolved platform says it
        # can (vLLM reads this once, into PIN_MEMORY, when vllm.utils.torch_utils loads)
        type(current_platform).is_pin_memory_available = classmethod(lambda cls: False)
