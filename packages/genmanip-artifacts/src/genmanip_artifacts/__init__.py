"""genmanip-artifacts: episode plots, plot-overlaid videos and safe cleanup of generated files.

``plot_episode(ep_dir)`` writes ``state_plot.png``, ``action_plot.png`` and
``merged_with_plot.mp4`` for one episode of either results layout; ``plan_clean`` /
``execute_clean`` implement ``gmp clean`` (a dry-run plan first, then exactly that plan).
matplotlib is imported only when something is drawn.
"""

from __future__ import annotations

from .__about__ import __version__
from .clean import (
    CATEGORIES,
    CleanItem,
    CleanPlan,
    CleanReport,
    Refusal,
    default_cache_dir,
    execute_clean,
    plan_clean,
)
from .episode import EpisodeSeries, load_series
from .errors import (
    AlignmentError,
    ArtifactsUsageError,
    CacheDirNotGmpError,
    EpisodeDataError,
    GenmanipArtifactsError,
    PlotFailures,
)
from .hooks import PlotHook, plot_hook
from .plot import (
    ACTION_PLOT,
    MERGED_VIDEO,
    PLOT_LOG,
    PLOT_OUTPUTS,
    STATE_PLOT,
    EpisodeOutcome,
    PlotResult,
    plot_episode,
    plot_episodes,
)

__all__ = [
    "ACTION_PLOT",
    "CATEGORIES",
    "MERGED_VIDEO",
    "PLOT_LOG",
    "PLOT_OUTPUTS",
    "STATE_PLOT",
    "AlignmentError",
    "ArtifactsUsageError",
    "CacheDirNotGmpError",
    "CleanItem",
    "CleanPlan",
    "CleanReport",
    "EpisodeDataError",
    "EpisodeOutcome",
    "EpisodeSeries",
    "GenmanipArtifactsError",
    "PlotFailures",
    "PlotHook",
    "PlotResult",
    "Refusal",
    "__version__",
    "default_cache_dir",
    "execute_clean",
    "load_series",
    "plan_clean",
    "plot_episode",
    "plot_episodes",
    "plot_hook",
]
