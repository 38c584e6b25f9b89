"""vLLM integration (tested with vLLM 0.33.0; ``pip install specdec-kernels[vllm]``).

- :class:`NgramProposer`: a ``custom_class`` proposer,
  ``speculative_config={"method": "custom_class", "model":
  "specdec_kernels.integrations.vllm.NgramProposer", "num_speculative_tokens": k}``, with
  ``additional_config={"specdec_kernels": {"prompt_lookup_min": .., "prompt_lookup_max":
  ..}}`` (vLLM 0.33.0 zeroes ``prompt_lookup_*`` for custom classes).
- :func:`register`: the ``vllm.general_plugins`` entry point; with
  ``SPECDEC_VLLM_REJECTION=1`` it routes vLLM V1's rejection sampling to
  :func:`specdec_kernels.ops.rejection_sample` (see :mod:`.rejection`).

Importing this package does not import vLLM; ``import specdec_kernels`` does not import
this package.
"""

from specdec_kernels.integrations.vllm.proposer import NgramProposer, NgramSettings, ngram_settings
from specdec_kernels.integrations.vllm.rejection import (
    ENV_VAR,
    TESTED_VLLM_VERSIONS,
    enabled,
    install,
    register,
    request_seeds,
    uninstall,
    unsupported_reason,
    verify,
)

__all__ = [
    "ENV_VAR",
    "TESTED_VLLM_VERSIONS",
    "NgramProposer",
    "NgramSettings",
    "enabled",
    "install",
    "ngram_settings",
    "register",
    "request_seeds",
    "uninstall",
    "unsupported_reason",
    "verify",
]
