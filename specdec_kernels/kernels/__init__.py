"""Triton kernels and their launchers: the CUDA path of every op.

Launchers allocate outputs and pick block sizes; they do not validate (the op layer in
``specdec_kernels.ops`` validates once). With ``TRITON_INTERPRET=1`` they also run on CPU
tensors, which is how the test-suite checks them on machines without a GPU.
"""
