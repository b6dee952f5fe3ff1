"""Reports: records at the bottom (importing nothing else of the package), then text, HTML, Markdown, pictures and files."""
