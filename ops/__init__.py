"""The public API: validated, typed wrappers around the ``torch.ops.specdec`` operators.

Installed as ``specdec_kernels.ops`` (the ``ops/`` folder at the repository root is
mapped there by ``pyproject.toml``). Importing it registers every operator; it does not
import Triton, which loads at the first CUDA call (``ops/_library.py``).
"""

from specdec_kernels import constants as _constants
from specdec_kernels.constants import *  # noqa: F403  (every constant, see __all__)
from specdec_kernels.ops.commit import CommitResult, commit_accepted_tokens
from specdec_kernels.ops.corpus import Corpus, corpus_append, new_corpus
from specdec_kernels.ops.draft_plan import (
    DraftPlan,
    new_acceptance_stats,
    plan_draft_lengths,
    update_acceptance_stats,
)
from specdec_kernels.ops.frequency import FrequencyCorpus, FrequencyIndex
from specdec_kernels.ops.logprobs import TopLogprobs, top_logprobs
from specdec_kernels.ops.ngram import FrequencyProposal, NgramProposal, ngram_propose
from specdec_kernels.ops.ngram_index import (
    NgramIndex,
    new_ngram_index,
    ngram_index_build,
    ngram_index_extend,
)
from specdec_kernels.ops.processing import LogitsProcessing, process_logits, token_bitmask
from specdec_kernels.ops.processing_state import ProcessingState, StateBatch
from specdec_kernels.ops.rejection import RejectionOutput, rejection_sample, sampling_offsets
from specdec_kernels.ops.verify_inputs import (
    VerifyInputs,
    compute_slot_mapping,
    exclusive_cu_num_draft_tokens,
    prepare_verify_inputs,
)

__all__ = [
    *_constants.__all__,
    "CommitResult",
    "Corpus",
    "NgramIndex",
    "DraftPlan",
    "FrequencyCorpus",
    "FrequencyIndex",
    "FrequencyProposal",
    "LogitsProcessing",
    "ProcessingState",
    "StateBatch",
    "NgramProposal",
    "RejectionOutput",
    "TopLogprobs",
    "VerifyInputs",
    "commit_accepted_tokens",
    "compute_slot_mapping",
    "corpus_append",
    "exclusive_cu_num_draft_tokens",
    "new_acceptance_stats",
    "new_corpus",
    "new_ngram_index",
    "ngram_index_build",
    "ngram_index_extend",
    "ngram_propose",
    "plan_draft_lengths",
    "prepare_verify_inputs",
    "process_logits",
    "rejection_sample",
    "sampling_offsets",
    "token_bitmask",
    "top_logprobs",
    "update_acceptance_stats",
]
