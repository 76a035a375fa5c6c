"""The paper's tables and figures from a results directory, beside its published numbers.

`build_report(results_dir, out_dir) -> Path` is what the pipeline's report component and
`python -m adaptune render` call; the notebooks call the table and figure functions directly.
"""

from __future__ import annotations

from adaptune.report.markdown import build_report

__all__ = ["build_report"]
