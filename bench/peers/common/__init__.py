"""What every system's training script shares: the tinygpt workload, the step log the
harness reads, and the in-process faults. Imported inside each peer's own virtual
environment (PYTHONPATH = src:bench), so it needs only torch, numpy and the standard library.
"""
