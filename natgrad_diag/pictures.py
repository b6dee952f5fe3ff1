"""Pictures of reports and Jacobians: the public names of natgrad_diag.report.pictures (``*_data``: no matplotlib)."""

from natgrad_diag.report.pictures import (
    BlockSpan, CheckError, Eta1Comparison, HeatmapData, Picture, check_errors_data, eta1_comparison_data, heatmap_data,
    plot_check_errors, plot_eta1_comparison, plot_jacobian_heatmap, report_pictures, require_matplotlib,
)  # fmt: skip

__all__ = [
    "BlockSpan", "CheckError", "Eta1Comparison", "HeatmapData", "Picture", "check_errors_data",
    "eta1_comparison_data", "heatmap_data", "plot_check_errors", "plot_eta1_comparison", "plot_jacobian_heatmap",
    "report_pictures", "require_matplotlib",
]
