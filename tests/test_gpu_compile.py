"""Compile every Triton kernel for a real GPU target (sm_90) on a machine without a GPU.

The interpreter accepts code the GPU compiler rejects (a non-constexpr global read inside a
kernel, a scalar/block type mismatch...). ``triton.compile`` with an explicit ``GPUTarget``
needs no device, so each kernel variant is built here in a subprocess without
``TRITON_INTERPRET``.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
import torch

_PRELUDE = r"""
import os, sys
os.environ.pop("TRITON_INTERPRET", None)
try:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
except ImportError:
    sys.exit(3)

def build(fn, consts, ptrs=None, ints=None):
    ptrs, ints = ptrs or {}, ints or {}
    sig = {}
    for name in fn.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = ptrs.get(name, "*i32")
        else:
            sig[name] = ints.get(name, "i32")
    try:
        src = ASTSource(fn=fn, signature=sig, constexprs=consts)
    except TypeError:  # another Triton's API: nothing to check here
        sys.exit(3)
    triton.compile(src, target=GPUTarget("cuda", 90, 32))
"""

_NGRAM = r"""
from specdec_kernels.kernels import ngram as K
ptrs = {"keys_ptr": "*i64", "source_ptr": "*i8", "corpus_meta_ptr": "*i64",
        "corpus_index_ptr": "*i64", "corpus_state_ptr": "*i64"}
for tie_last in (False, True):
    for has_req in (False, True):
        absent = {} if has_req else dict(req_indices_ptr=None)  # None: an absent tensor
        build(K._ngram_scan_kernel,
              dict(MIN_N=2, MAX_N=5, HAS_REQ_INDICES=has_req, TIE_LAST=tie_last, BLOCK=1024,
                   **absent), ptrs)
        for index, corpus in ((False, False), (True, False), (False, True), (True, True)):
            absent = {} if has_req else dict(req_indices_ptr=None, max_draft_tokens_ptr=None)
            absent.update(dict(keys_ptr=None) if index else dict(index_ptr=None))
            if not corpus:
                absent.update({n: None for n in ("corpus_tokens_ptr", "corpus_meta_ptr",
                                                 "corpus_index_ptr", "corpus_state_ptr")})
            build(K._ngram_propose_kernel,
                  dict(MIN_N=2, N=4, NB=4 if index or corpus else 1, HAS_REQ_INDICES=has_req,
                       HAS_MAX_DRAFT=has_req, HAS_MAX_MODEL_LEN=has_req, HAS_INDEX=index,
                       HAS_CORPUS=corpus, TIE_LAST=tie_last, KEY_BLOCK=32, K_BLOCK=8, **absent),
                  ptrs)
print("compiled")
"""

_REJECTION = r"""
from specdec_kernels.kernels import rejection as K
f32 = {"temp_ptr": "*fp32", "top_p_ptr": "*fp32", "min_p_ptr": "*fp32", "seeds_ptr": "*i64",
       "offsets_ptr": "*i64", "row_lp_ptr": "*fp32"}
for logits, flags in (("*fp32", (False,) * 6), ("*bf16", (True,) * 6),
                      ("*fp16", (True, True, False, True, False, False)),
                      ("*fp32", (False, True, False, False, True, True))):
    probs, temp, top_k, top_p, min_p, logprobs = flags
    # None: an absent tensor (the launcher passes None for every tensor it does not have)
    absent = {name: None for name, on in (
        ("probs_ptr", probs), ("temp_ptr", temp), ("seeds_ptr", temp), ("offsets_ptr", temp),
        ("top_k_ptr", top_k), ("top_p_ptr", top_p), ("min_p_ptr", min_p),
        ("row_lp_ptr", logprobs)) if not on}
    build(K._rejection_rows_kernel,
          dict(HAS_PROBS=probs, HAS_TEMP=temp, HAS_TOP_K=top_k, HAS_TOP_P=top_p,
               HAS_MIN_P=min_p, LOGPROBS=logprobs, BLOCK=1024, SEARCH_BLOCK=128, NPIV=16,
               **absent),
          dict(f32, logits_ptr=logits, probs_ptr=logits))
    none = {} if logprobs else dict(row_lp_ptr=None, logprobs_ptr=None)
    build(K._rejection_finalize_kernel, dict(LOGPROBS=logprobs, K1_BLOCK=8, **none),
          {"row_lp_ptr": "*fp32", "logprobs_ptr": "*fp32"})
print("compiled")
"""

_LOGPROBS = r"""
from specdec_kernels.kernels import logprobs as K
ptrs = {"rows_ptr": "*i64", "temp_ptr": "*fp32", "top_p_ptr": "*fp32", "min_p_ptr": "*fp32",
        "values_ptr": "*fp32", "tok_lp_ptr": "*fp32", "vals_ptr": "*fp32"}
for logits, on, logits_mode in (("*fp32", True, False), ("*bf16", False, True),
                                ("*fp16", True, True)):
    for nb in (1, 32, K.MAX_KERNEL_N):
        build(K._top_n_kernel, dict(LOGITS=logits_mode, BLOCK=1024, SEARCH_BLOCK=128, NPIV=16,
                                    NB=nb, CAP=max(64, 4 * nb), RB=32),
              dict(ptrs, logits_ptr=logits),
              {"stride_lr": "i64", "stride_lv": "i64"})
    # logprobs = 1 with k = 0 and contiguous rows: Triton makes ints equal to 1 constants
    build(K._top_n_kernel, dict(LOGITS=logits_mode, BLOCK=1024, SEARCH_BLOCK=128, NPIV=16,
                                NB=1, CAP=64, RB=32, N=1, K1=1, stride_lv=1),
          dict(ptrs, logits_ptr=logits), {"stride_lr": "i64"})
    absent = {} if on else dict(top_k_ptr=None, top_p_ptr=None, min_p_ptr=None)
    build(K._processed_values_kernel,
          dict(HAS_TOP_K=on, HAS_TOP_P=on, HAS_MIN_P=on, LOGITS=logits_mode, BLOCK=1024,
               SEARCH_BLOCK=128, NPIV=16, ID_BLOCK=8, **absent),
          dict(ptrs, logits_ptr=logits))
print("compiled")
"""

_BOOKKEEPING = r"""
from specdec_kernels.kernels import commit as C
from specdec_kernels.kernels import verify_inputs as V
i64 = {"positions_ptr": "*i64", "slot_ptr": "*i64"}
for flag in (True, False):
    absent = {} if flag else dict(req_indices_ptr=None, bt_ptr=None)  # None: an absent tensor
    build(V._slot_mapping_kernel,
          dict(HAS_REQ_INDICES=flag, HAS_BLOCK_TABLE=flag, HAS_MAX_MODEL_LEN=flag, BLOCK=1024,
               **absent), i64)
    kb = 4 if flag else 1
    none = {} if flag else dict(req_indices_ptr=None, stop_ptr=None, prompt_ptr=None,
                                min_tokens_ptr=None, max_tokens_ptr=None, computed_ptr=None)
    build(C._commit_kernel,
          dict(HAS_REQ_INDICES=flag, HAS_STOP=flag, HAS_PROMPT=flag, HAS_MIN_TOKENS=flag,
               HAS_MAX_TOKENS=flag, HAS_COMPUTED=flag, KB=kb, SB=2, k1=kb, **none),
          {"finished_ptr": "*i1", "reason_ptr": "*i8"})
for k, kb in ((0, 1), (1, 2), (3, 4)):  # k = 1 is what Triton's specialisation makes of it
    absent = dict(req_indices_ptr=None, bt_ptr=None) if k == 1 else {}
    build(V._prepare_verify_kernel,
          dict(HAS_REQ_INDICES=k > 1, HAS_BLOCK_TABLE=k != 1, ROWS=64, KB=kb, SCAN_BLOCK=1024,
               k=k, block_size=1, **absent), i64)
print("compiled")
"""


_DRAFT_PLAN = r"""
from specdec_kernels.kernels import draft_plan as K
f32 = {"acc_ptr": "*fp32", "cost_ptr": "*fp32", "expected_ptr": "*fp32"}
for flag, bb, kb, k in ((True, 64, 4, 4), (False, 1, 1, 0), (True, 256, 8, 5)):
    absent = {} if flag else dict(req_indices_ptr=None)  # None: an absent tensor
    build(K._plan_kernel,
          dict(K=k, HAS_REQ_INDICES=flag, HAS_MAX_NUM_TOKENS=flag, BB=bb, KB=kb, **absent), f32,
          {"base_gain": "i64" if bb > 64 else "i32"})  # i64 from B = 128 on
    build(K._update_kernel, dict(K=k, HAS_REQ_INDICES=flag, KB=kb, **absent),
          {"acc_ptr": "*fp32"}, {"keep": "fp32", "learn": "fp32"})
print("compiled")
"""


def compile_for_gpu(script: str) -> None:
    """Run ``_PRELUDE + script`` in a subprocess without the interpreter; skip if unsupported."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", _PRELUDE + script],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode == 3:
        pytest.skip("this Triton has no ASTSource/GPUTarget compile API")
    assert proc.returncode == 0 and "compiled" in proc.stdout, proc.stderr[-3000:]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU run compiles the kernels for real")
def test_ngram_kernels_compile_for_the_gpu():
    compile_for_gpu(_NGRAM)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU run compiles the kernels for real")
def test_rejection_kernels_compile_for_the_gpu():
    compile_for_gpu(_REJECTION)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU run compiles the kernels for real")
def test_logprobs_kernels_compile_for_the_gpu():
    compile_for_gpu(_LOGPROBS)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU run compiles the kernels for real")
def test_bookkeeping_kernels_compile_for_the_gpu():
    compile_for_gpu(_BOOKKEEPING)


_NGRAM_INDEX = r"""
from specdec_kernels.kernels import ngram_index as K
for flag in (False, True):
    absent = {} if flag else dict(req_indices_ptr=None)  # None: an absent tensor
    build(K._index_clear_kernel, dict(N=4, HAS_REQ_INDICES=flag, BLOCK=4096, **absent))
    for scratch in (False, True):
        build(K._index_insert_kernel,
              dict(MIN_N=2, N=4, HAS_REQ_INDICES=flag, FROM_SCRATCH=scratch,
                   BLOCK=256 if scratch else 16, **absent))
        build(K._index_set_len_kernel,
              dict(HAS_REQ_INDICES=flag, FROM_SCRATCH=scratch, BLOCK=256, **absent))
print("compiled")
"""

_CORPUS = r"""
from specdec_kernels.kernels import corpus as K
i64 = {"corpus_meta_ptr": "*i64", "corpus_index_ptr": "*i64", "corpus_state_ptr": "*i64",
       "plan_ptr": "*i64"}
for flag in (False, True):
    absent = {} if flag else dict(req_indices_ptr=None)  # None: an absent tensor
    build(K._corpus_plan_kernel, dict(HAS_REQ_INDICES=flag, BLOCK=256, **absent), i64)
    build(K._corpus_write_kernel, dict(MIN_N=2, N=4, HAS_REQ_INDICES=flag, BLOCK=256, **absent),
          i64)
print("compiled")
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU run compiles the kernels for real")
def test_ngram_index_kernels_compile_for_the_gpu():
    compile_for_gpu(_NGRAM_INDEX)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU run compiles the kernels for real")
def test_corpus_kernels_compile_for_the_gpu():
    compile_for_gpu(_CORPUS)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU run compiles the kernels for real")
def test_draft_plan_kernels_compile_for_the_gpu():
    compile_for_gpu(_DRAFT_PLAN)


_PROCESSING = r"""
from specdec_kernels.kernels import processing as K
f32 = {"rp_ptr": "*fp32", "fp_ptr": "*fp32", "pp_ptr": "*fp32", "bias_values_ptr": "*fp32",
       "out_ptr": "*fp32"}
for flag in (False, True):
    absent = {} if flag else dict(req_indices_ptr=None)  # None: an absent tensor
    build(K._count_kernel, dict(HAS_REQ_INDICES=flag, BLOCK=1024, **absent), f32)
for logits, flag in (("*fp32", True), ("*bf16", False), ("*fp16", True)):
    names = ("req_indices_ptr", "rp_ptr", "fp_ptr", "pp_ptr", "counts_ptr", "bias_ids_ptr",
             "bias_values_ptr", "allowed_ptr", "grammar_ptr", "bad_ptr", "bans_ptr",
             "min_tokens_ptr", "stops_ptr")
    absent = {} if flag else {n: None for n in names}
    build(K._process_kernel,
          dict(HAS_REQ_INDICES=flag, HAS_PENALTIES=flag, HAS_BIAS=flag, HAS_ALLOWED=flag,
               HAS_GRAMMAR=flag, HAS_BAD=flag, HAS_MIN=flag, BLOCK_B=8, BLOCK_S=16,
               BLOCK_T=16, BLOCK=1024, **absent),
          dict(f32, logits_ptr=logits))
print("compiled")
"""

_PHILOX = r"""
from specdec_kernels.kernels import philox as K
i64 = {"ctr_ptr": "*i64", "key_ptr": "*i64", "out_ptr": "*i64", "seeds_ptr": "*i64",
       "counters_ptr": "*i64"}
build(K._philox_block_kernel, dict(BLOCK=128), i64)
build(K._philox_uniform_kernel, dict(BLOCK=128), dict(i64, out_ptr="*fp32"))
print("compiled")
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU run compiles the kernels for real")
def test_processing_kernels_compile_for_the_gpu():
    compile_for_gpu(_PROCESSING)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU run compiles the kernels for real")
def test_philox_test_kernels_compile_for_the_gpu():
    compile_for_gpu(_PHILOX)


_FREQUENCY = r"""
from specdec_kernels.kernels import frequency as K
i64 = {"keys_ptr": "*i64", "path_ptr": "*i64", "probs_ptr": "*fp32", "source_ptr": "*i8"}
bits = {"min_prob_bits": "i64", "factor_bits": "i64", "offset_bits": "i64"}
for flag in (False, True):
    absent = {} if flag else dict(req_indices_ptr=None)  # None: an absent tensor
    build(K._clear_kernel, dict(HAS_REQ_INDICES=flag, BLOCK=1024, **absent), i64)
    for scratch in (False, True):
        build(K._extend_kernel, dict(FROM_SCRATCH=scratch, HAS_REQ_INDICES=flag, **absent), i64)
    for caps in (False, True):
        cap = {} if caps else dict(max_draft_tokens_ptr=None)
        corpus = {"c_keys_ptr": "*i64", "c_state_ptr": "*i64"} if caps else {}
        none = {} if caps else {f"c_{n}_ptr": None for n in ("tokens", "keys", "vals", "nodes",
                                                              "used", "state")}  # fmt: skip
        build(K._propose_kernel, dict(HAS_REQ_INDICES=flag, HAS_MAX_DRAFT=caps,
              HAS_MAX_MODEL_LEN=caps, HAS_CORPUS=caps, K_BLOCK=8, **absent, **cap, **none),
              {**i64, **corpus}, bits)  # fmt: skip
print("compiled")
"""

_FREQUENCY_CORPUS = r"""
from specdec_kernels.kernels import frequency_corpus as K
i64 = {"keys_ptr": "*i64", "docs_ptr": "*i64", "state_ptr": "*i64", "path_ptr": "*i64"}
for flag in (False, True):
    absent = {} if flag else dict(req_indices_ptr=None)  # None: an absent tensor
    build(K._corpus_append_kernel, dict(HAS_REQ_INDICES=flag, BLOCK=1024, **absent), i64)
print("compiled")
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU run compiles the kernels for real")
def test_frequency_corpus_kernels_compile_for_the_gpu():
    compile_for_gpu(_FREQUENCY_CORPUS)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU run compiles the kernels for real")
def test_frequency_kernels_compile_for_the_gpu():
    """The trie's scalar loops (flags, no ``break``) are what the GPU compiler accepts."""
    compile_for_gpu(_FREQUENCY)


SCRIPTS = {"ngram": _NGRAM, "ngram_index": _NGRAM_INDEX, "corpus": _CORPUS,
           "frequency": _FREQUENCY, "frequency_corpus": _FREQUENCY_CORPUS,
           "rejection": _REJECTION, "logprobs": _LOGPROBS, "commit": _BOOKKEEPING,
           "verify_inputs": _BOOKKEEPING,
           "draft_plan": _DRAFT_PLAN, "processing": _PROCESSING, "philox": _PHILOX}  # fmt: skip
KERNEL_MODULES = sorted(
    p.stem for p in (pathlib.Path(__file__).parents[1] / "specdec_kernels" / "kernels").glob("*.py")
    if not p.stem.startswith("_")
)  # fmt: skip


@pytest.mark.parametrize("family", KERNEL_MODULES)
def test_every_kernel_is_in_a_compile_script(family):
    import importlib
    import re

    module = importlib.import_module(f"specdec_kernels.kernels.{family}")
    kernels = {  # @triton.jit functions (interpreted or not) defined in the module
        name
        for name, obj in vars(module).items()
        if name.endswith("_kernel") and hasattr(obj, "arg_names")
        and getattr(getattr(obj, "fn", None), "__module__", None) == module.__name__
    }  # fmt: skip
    if not kernels:  # sampling: helpers inlined into the rejection kernels
        assert family not in SCRIPTS
        return
    assert family in SCRIPTS, f"kernels/{family}.py has kernels but no compile script"
    built = set(re.findall(r"\b[A-Z]\.(_\w+_kernel)\b", SCRIPTS[family]))
    assert kernels <= built, f"not compiled for sm_90: {sorted(kernels - built)}"
