"""Profiling backend: a PyTorch reference decoder, calibration of the local device, traces, validation.

torch is imported only inside this package; the analytic core never needs it.
"""
