"""The benchmark behind natgrad-diag bench: ratios against GPflow and TensorFlow, from one run."""
