"""Constants shared by every layer and by engines (one home; ``docs/design.md``, "Terms").

Plain Python ints, importable from the CPU path, the Triton launchers, the references
and the public API (``specdec_kernels.ops`` re-exports them). A ``@triton.jit`` function
cannot read a plain-int global; ``specdec_kernels/kernels`` wraps these values in
``tl.constexpr`` where a kernel needs them.
"""

from __future__ import annotations

PLACEHOLDER = -1
"""Marks "no token" in every token-id input and output (draft padding, emitted padding)."""

PAD_SLOT = -1
"""Slot id of a query token that must not be written to the KV cache."""

FINISH_RUNNING = 0
"""``finish_reason`` of a request that goes on."""

FINISH_STOP = 1
"""``finish_reason`` of a request ended by a stop token (the stop token is committed)."""

FINISH_LENGTH = 2
"""``finish_reason`` of a request that reached ``max_tokens`` or ``max_model_len``."""

FINISH_REASON_NAMES = {FINISH_RUNNING: "running", FINISH_STOP: "stop", FINISH_LENGTH: "length"}
"""The name of each ``finish_reason`` value, as OpenAI-style servers report it."""

DRAFT_GAIN_SCALE = 2**24
"""``plan_draft_lengths`` quantises each draft's gain (a probability) to an integer multiple
of ``1 / DRAFT_GAIN_SCALE``, so that its sums are exact in any order and the CPU path, the
Triton kernel and the reference choose the same plan bit for bit."""

DRAFT_SOURCE_NONE, DRAFT_SOURCE_OWN, DRAFT_SOURCE_CORPUS = 0, 1, 2
"""``ngram_propose``'s ``draft_source``: no drafts, the request's own history, the shared
corpus."""

TIE_BREAKS = ("first", "last")
"""``ngram_propose``'s ``tie_break`` values: which own-history occurrence of the longest
matching n-gram gives the drafts (the earliest, as vLLM and Hugging Face; the latest)."""

NGRAM_HASH_MASK = 0xFFFFFFFF
NGRAM_HASH_FNV_OFFSET = 0x811C9DC5
NGRAM_HASH_FNV_PRIME = 0x01000193
NGRAM_HASH_MIX1 = 0x045D9F3B
NGRAM_HASH_MIX2 = 0x2C1B3C6D
"""The 32-bit n-gram hash of the corpus index (FNV-1a over 32-bit words with an xorshift
per word): every implementation must hash alike, so a table one path wrote reads the same
on the other."""

SCORINGS = ("longest", "frequency")
"""``ngram_propose``'s ``scoring`` values: the longest matching n-gram's one occurrence
(prompt lookup, vLLM-compatible), or the most frequent continuations of every matching
context (SuffixDecoding's rule, on a frequency index)."""

FREQUENCY_MAX_DEPTH = 1024
"""The largest ``max_n`` (``D``: context plus drafts) of a frequency index: an append costs
O(D), and a proposal O(D x k) per request."""

FREQUENCY_HASH_C0 = 0x9E3779B1
FREQUENCY_HASH_C1 = 0x85EBCA6B
FREQUENCY_HASH_C2 = 0xC2B2AE35
"""The frequency trie's slot hash of ``(parent node, token)`` (a 32-bit murmur3-style mix,
``specdec_kernels/reference/frequency.py``): the same in every path."""

FREQUENCY_CORPUS_STATE = (
    "active", "size", "reserved0", "reserved1", "rebuilding", "first_survivor", "next_doc",
    "next_offset", "new_size", "head", "tail",
)  # fmt: skip
"""The fields of a frequency corpus's int64 ``state`` (``docs/design.md``, "Frequency-scored
drafting"): the active store, its live slots, the tokens written to each store, whether a
rebuild runs, its first surviving document, the next document (ring index) and offset it
counts and the slots it has counted, and the document ring's head and tail."""

FREQUENCY_CORPUS_WORK = 6
"""Slots a rebuilding corpus counts into its new store per slot added (``1 + (1 - 3r) / r``
rounded up, at the slack ``r = 1/8``): it catches up before the live size passes ``C``."""


def frequency_corpus_budget(token_slots: int) -> int:
    """The budget ``C`` of a frequency corpus whose token arrays hold ``C + C // 8`` slots
    (the three paths' shared rule, not exported: ``docs/design.md``, "Frequency-scored
    drafting")."""
    return token_slots - token_slots // 9


def frequency_corpus_piece(C: int, M: int) -> int:
    """The longest piece a document enters a frequency corpus of ``C`` slots and ``M`` nodes
    a store as: a store holds 8 of them, and an empty store's nodes hold one (2 a token)."""
    return max(min(C // 8, M // 16) - 1, 1)


__all__ = [
    "DRAFT_SOURCE_CORPUS",
    "DRAFT_SOURCE_NONE",
    "DRAFT_SOURCE_OWN",
    "DRAFT_GAIN_SCALE",
    "FINISH_LENGTH",
    "FINISH_REASON_NAMES",
    "FINISH_RUNNING",
    "FINISH_STOP",
    "FREQUENCY_CORPUS_STATE",
    "FREQUENCY_CORPUS_WORK",
    "FREQUENCY_MAX_DEPTH",
    "PAD_SLOT",
    "PLACEHOLDER",
    "SCORINGS",
    "TIE_BREAKS",
]
