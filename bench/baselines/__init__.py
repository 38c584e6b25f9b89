"""Baselines: what an engine without this library would run for each op.

- :mod:`bench.baselines.ngram_numba`: a numba single-pass KMP proposer, parallel over
  requests (the kind of CPU proposer vLLM runs); needs ``numba`` (the ``bench`` extra).
- :mod:`bench.baselines.ngram_torch`: an eager torch proposer (compare every window), the
  device-side baseline on the GPU.
- :mod:`bench.baselines.rejection_torch`: plain torch rejection sampling (softmax, gather,
  compare, residual, multinomial), as engines without fused kernels do.
- :mod:`bench.baselines.bookkeeping_torch`: eager torch slot mapping, verify-input
  packing and token commit.
"""
