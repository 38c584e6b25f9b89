"""The public API: validated, typed wrappers around the ``torch.ops.specdec`` operators.

Installed as ``specdec_kernels.ops`` (the ``ops/`` folder at the repository root is
mapped there by ``pyproject.toml``). Importing it registers every operator.
"""

from specdec_kernels.ops.bookkeeping import (
    CommitResult,
    VerifyInputs,
    commit_accepted_tokens,
    compute_slot_mapping,
    prepare_verify_inputs,
)
from specdec_kernels.ops.ngram import NgramProposal, ngram_propose
from specdec_kernels.ops.rejection import RejectionOutput, rejection_sample, sampling_offsets

__all__ = [
    "CommitResult",
    "NgramProposal",
    "RejectionOutput",
    "VerifyInputs",
    "commit_accepted_tokens",
    "compute_slot_mapping",
    "ngram_propose",
    "prepare_verify_inputs",
    "rejection_sample",
    "sampling_offsets",
]
