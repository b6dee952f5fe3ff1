"""The natural-gradient step: GPflow's step recorded line by line, its closed form, LAPACK, the drop-in optimizer, the map's Jacobian.

Internal: the public names are re-exported by :mod:`natgrad_diag`.
"""
