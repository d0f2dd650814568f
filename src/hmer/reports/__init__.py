"""Reports: MLflow runs turned into the tables a paper prints, plots, and `hmer report`.

`hmer report` (`hmer.cli.report`) writes them as files. The names below load on first use, so
`import hmer.reports` stays cheap; their use: docs/reports.md, "Library".
"""

from __future__ import annotations

from ..tracking import lazy_exports

_EXPORTS = {
    "NoRunsError": "runs", "PredictionsNotFound": "runs", "curve_runs": "runs", "list_studies": "runs",
    "load_history": "runs", "load_predictions": "runs", "load_runs": "runs", "scored_years": "runs",
    "format_table": "tables", "scored": "tables", "scores_long": "tables", "study_table": "tables",
    "variant_order": "tables", "variant_table": "tables",
    "plot_exprate": "plots", "plot_training_curves": "plots",
    "analyze": "analysis", "breakdown": "analysis",
    "compare_runs": "analysis", "confusions": "analysis", "format_breakdown": "analysis",
    "format_comparison": "analysis", "format_confusions": "analysis", "plot_breakdown": "analysis",
    "run_expressions": "analysis", "top_confusions": "analysis", "variant_analysis": "analysis",
    "format_published": "published", "paper_of": "published",
    "CLAIMS": "paper_claims", "claims_table": "paper_claims", "format_claims": "paper_claims", "plot_claims": "plots",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
