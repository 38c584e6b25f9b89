"""Glue between this library's ops and serving engines (optional; nothing here is imported by
``import specdec_kernels``).

- ``specdec_kernels.integrations.vllm``: a vLLM ``custom_class`` n-gram proposer and an
  opt-in vLLM general plugin that routes V1 rejection sampling to ``rejection_sample``
  (install with the ``vllm`` extra).
"""
