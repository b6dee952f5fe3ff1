"""Reports: records at the bottom (importing nothing else of the package), then text, HTML, Markdown and files;
``timeline`` makes a training monitor's records a report.

Internal: :mod:`natgrad_diag` re-exports ``Check``, ``to_terminal`` and ``write_report``; pictures are
:mod:`natgrad_diag.pictures`.
"""
