"""The Energon runtime: the task encoder, the savable packing stage, the online loader, state
checks, per-worker statistics, skip logging, pinning and worker-process plumbing.
"""
