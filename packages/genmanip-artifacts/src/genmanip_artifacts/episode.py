"""One episode's series, ready to plot: :mod:`genmanip_results.series` plus what plotting needs.

The loading itself (both layouts, the allow-list unpickler for ``meta_record.pkl``, the one
bad-row policy: bad rows are kept as NaN gaps or skipped and *reported*, never fatal) is
:func:`genmanip_results.series.load_series`. This module only adds what is specific to plots:

* an episode with nothing to draw is an :class:`~genmanip_artifacts.errors.EpisodeDataError`
  (no recording, no usable step, no state at all);
* for a known robot the series must have the robot's dimensions (the panels split vectors by
  the robot spec; a plot with wrong splits would be silently wrong): a mismatch of the episode as
  a whole (not of single rows, those are gaps) is an error naming the field;
* an unknown robot is plotted with every recorded dimension, and says so in the warnings.

The plot's warnings are :attr:`EpisodeSeries.warnings`: every issue of the recording, one line
each, written to ``plot.log`` and shown by ``gmp plot``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from genmanip_protocol.errors import GenmanipError
from genmanip_results.series import (
    EpisodeSeries,
    SeriesIssue,
    SeriesNotFoundError,
    order_cameras,
)
from genmanip_results.series import load_series as _load_series

from .errors import EpisodeDataError

__all__ = ["EpisodeSeries", "load_series", "order_cameras"]


def _first_issue(s: EpisodeSeries, field_prefix: str | None = None) -> SeriesIssue | None:
    for issue in s.issues:
        if field_prefix is None or (issue.field or "").startswith(field_prefix):
            return issue
    return None


def _why(s: EpisodeSeries, field_prefix: str | None = None) -> str:
    """``" (first problem: <issue>)"`` when the recording reported one, else ``""``."""
    issue = _first_issue(s, field_prefix) or (_first_issue(s) if field_prefix else None)
    return f" (first problem: {issue})" if issue is not None else ""


def _check(s: EpisodeSeries) -> None:
    """Raise ValueError when ``s`` has nothing to plot or does not fit its robot."""
    src = s.source.name
    if not s.n_steps and not s.state_t.size:
        raise ValueError(f"{src}: no steps recorded{_why(s)}")
    if not s.state_t.size:
        raise ValueError(f"{src}: no row carries a state{_why(s, 'state')}")
    robot = s.robot
    if robot is None:
        return
    want = {"joints": robot.joints_dim, "gripper": robot.gripper_dim, "base": 3}
    for key, n in want.items():
        arr = s.state.get(key)
        name = f"state.{key}"
        if arr is None:
            raise ValueError(f"{src}: {name} missing (needed for {robot.robot_id}){_why(s)}")
        if arr.shape[1] != n:
            got = f"got {arr.shape[1]}" if arr.shape[1] else "no usable values"
            raise ValueError(
                f"{src}: {name}: expected {n} values for {robot.robot_id}, {got}{_why(s, name)}"
            )
    if s.control_type == "joint_position" and s.n_steps and s.action.shape[1] != robot.action_dim:
        got = f"got {s.action.shape[1]}" if s.action.shape[1] else "no usable values"
        raise ValueError(
            f"{src}: action: expected {robot.action_dim} values (joint_position for "
            f"{robot.robot_id}), {got}{_why(s, 'action')}"
        )


def load_series(ep_dir: Path | str) -> EpisodeSeries:
    """Load the plottable series of the episode in ``ep_dir`` (either layout).

    Bad rows do not fail the episode: they are gaps or skipped rows listed in the returned
    series' ``warnings`` (see :mod:`genmanip_results.series`).

    Raises:
        EpisodeDataError: no ``steps.jsonl`` / ``meta_record.pkl``, an unreadable or refused
            recording file, nothing to plot, or dimensions that do not fit the robot (one line
            naming the file and field, and the first problem the recording reported).
    """
    ep_dir = Path(ep_dir)
    if not ep_dir.is_dir():
        raise EpisodeDataError(f"{ep_dir}: not a directory", path=ep_dir)
    try:
        s = _load_series(ep_dir)
    except SeriesNotFoundError as exc:
        raise EpisodeDataError(str(exc), path=ep_dir) from exc
    except GenmanipError as exc:  # SeriesError, or the discovery could not read the directory
        raise EpisodeDataError(f"{ep_dir}: {exc}", path=ep_dir) from exc
    try:
        _check(s)
    except ValueError as exc:
        raise EpisodeDataError(f"{ep_dir}: {exc}", path=ep_dir) from exc
    if s.robot is None and s.robot_id is not None:
        s = dataclasses.replace(
            s, notes=(*s.notes, f"unknown robot {s.robot_id!r}: plotting every recorded dimension")
        )
    return s
