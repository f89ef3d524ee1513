"""The built-in datasets from the command line: `python -m litforge.data_tools` (fetch,
export-images)."""
