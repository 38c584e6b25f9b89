"""A small paged-KV engine that drives the specdec-kernels ops on a real model."""
