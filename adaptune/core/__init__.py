"""The bottom layer: the ADAPTUNE_* settings (environment), atomic file writes (files), the device and its
precision (devices, precision), the backbones and the paper's grids as data (backbones, paper_grids), and the
names of a run directory's files (run_files).

Imports nothing else of adaptune."""
