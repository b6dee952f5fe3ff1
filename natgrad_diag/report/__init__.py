"""Reports: records at the bottom (importing nothing else of the package), then text, HTML, Markdown and files;
``timeline`` makes a training monitor's records a report. Internal: the public names are re-exported by
:mod:`natgrad_diag`; pictures are :mod:`natgrad_diag.pictures`."""
