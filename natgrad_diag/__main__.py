"""``python -m natgrad_diag`` is the ``natgrad-diag`` command."""

from natgrad_diag.cli.app import main

raise SystemExit(main())
