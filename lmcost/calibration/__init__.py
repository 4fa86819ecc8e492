"""Fitting the time models on measurements: the efficiency model on published kernel timings, and the collective model on nccl-tests figures."""
