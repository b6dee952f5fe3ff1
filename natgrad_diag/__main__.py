"""``python -m natgrad_diag`` is the ``natgrad-diag`` command."""

from .cli import main

raise SystemExit(main())
