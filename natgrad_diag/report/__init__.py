"""Reports: records at the bottom, then text, HTML, Markdown and files; ``timeline`` makes a monitor's records a report.
Internal: :mod:`natgrad_diag` re-exports the public names; pictures are :mod:`natgrad_diag.pictures`."""
