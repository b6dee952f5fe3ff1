"""Natural-gradient training: the monitor, its records and TensorBoard log, the guard around a step.

Internal: :class:`natgrad_diag.NatGradMonitor` and :mod:`natgrad_diag.keras` are the public names.
"""
