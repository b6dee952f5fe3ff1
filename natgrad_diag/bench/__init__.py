"""Internal: ``natgrad-diag bench`` (or ``python scripts/bench.py``), ratios against GPflow and TensorFlow, one run."""
