"""Pictures of reports and Jacobians: the public names of natgrad_diag.report.pictures (``*_data``: no matplotlib)."""

from natgrad_diag.report.pictures import (
    BlockSpan, CheckError, Eta1Comparison, GammaCurve, HeatmapData, Picture, TimelineData, check_errors_data,
    eta1_comparison_data, gamma_curve_data, heatmap_data, plot_check_errors, plot_eta1_comparison, plot_gamma_losses,
    plot_jacobian_heatmap, plot_training_timeline, report_pictures, require_matplotlib, timeline_data,
)  # fmt: skip

__all__ = [
    "BlockSpan", "CheckError", "Eta1Comparison", "GammaCurve", "HeatmapData", "Picture", "TimelineData",
    "check_errors_data", "eta1_comparison_data", "gamma_curve_data", "heatmap_data", "plot_check_errors",
    "plot_eta1_comparison", "plot_gamma_losses", "plot_jacobian_heatmap", "plot_training_timeline", "report_pictures",
    "require_matplotlib", "timeline_data",
]
