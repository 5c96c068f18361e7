"""Tensor-parallel (TP=2) check on the lab GPUs: prepare, run, analyze (bench/tensor_parallel/README.md)."""
