"""The benchmark behind natgrad-diag bench: ratios against GPflow and TensorFlow, from one run.

Internal: run it as ``natgrad-diag bench`` or ``python scripts/bench.py``.
"""
