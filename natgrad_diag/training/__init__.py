"""Natural-gradient training: the monitor, its records and TensorBoard log, the guard around a step, the Keras callback.
Internal: :class:`natgrad_diag.NatGradMonitor` and :mod:`natgrad_diag.keras` are the public names."""
