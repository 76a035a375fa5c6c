"""The bottom layer: atomic file writes, device selection, and the names of a run directory's files.

Imports nothing else of adaptune."""
