"""The natural-gradient checks: one evaluator, one module per oracle, the bounds, the causes and the report.

Internal: the public names are re-exported by :mod:`natgrad_diag` and :mod:`natgrad_diag.testing`.
"""
