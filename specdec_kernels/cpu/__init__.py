"""Vectorised torch implementations: the CPU path of every op."""
