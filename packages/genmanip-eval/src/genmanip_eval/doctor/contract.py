"""Part 2 of ``gmp doctor``: the policy's contract, checked on real observations from the server.

A :class:`ContractChecker` is fed, step by step, each observation of the probe episode and what the
policy returned for it (one action, or a chunk). It checks every action against the robot spec
(:mod:`genmanip_protocol.robots`) and the server's rules (``docs/protocol.md``), and, once the
probe is over, what only shows across steps (constant outputs, joints that never move). Findings
carry the step they were first seen at, the evidence and the fix.

Limits the checks use (the real server's, facts §8 and §8.1):

* an arm joint may move at most :data:`MAX_JOINT_JUMP` rad per step (``arm_state_jump_too_large``)
  and stay within :data:`MAX_JOINT_ABS` rad (``arm_state_out_of_range``); both end the episode
  with score 0;
* a gripper joint must stay within its open/closed values +- :data:`GRIPPER_TOL`;
* a relative ``base_motion`` is clipped to +-0.015 m and +-1 degree per step (yaw in degrees);
* a quaternion (w, x, y, z) must have unit norm within :data:`QUAT_TOL`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from genmanip_protocol.errors import ValidationError
from genmanip_protocol.robots import RobotSpec
from genmanip_protocol.schema import validate_action
from genmanip_runtime.text import safe_text

from .findings import Finding

__all__ = [
    "GRIPPER_TOL",
    "MAX_JOINT_ABS",
    "MAX_JOINT_JUMP",
    "QUAT_TOL",
    "ContractChecker",
]

#: Largest arm joint change per step the server accepts (rad).
MAX_JOINT_JUMP = 1.0
#: Largest arm joint value the server accepts (rad).
MAX_JOINT_ABS = 10.0
#: Tolerance around a gripper's open/closed values (the server's bound).
GRIPPER_TOL = 0.01
#: Tolerance on a quaternion's norm.
QUAT_TOL = 1e-3
#: Relative base motion clip per step: x, y in m, yaw in degrees.
_BASE_CLIP = (0.015, 0.015, 1.0)
#: A relative arm command this close to the observed joints (while large) looks absolute (rad).
_LOOKS_ABSOLUTE = 0.05
#: A joint that changes less than this over the probe never moved (rad).
_STILL = 1e-4


@dataclass
class _Hit:
    severity: str
    title: str
    fix: str
    evidence: str
    first_step: int
    count: int = 1
    data: dict[str, Any] = field(default_factory=dict)


def _numbers(value: Any) -> list[float]:
    """Every numeric leaf of ``value`` (lists, tuples, arrays), as floats, in order."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "iuf":
            return [float(x) for x in value.ravel().tolist()]
        return []
    if isinstance(value, (list, tuple)):
        out: list[float] = []
        for v in value:
            out.extend(_numbers(v))
        return out
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        return [float(value)]
    return []


def _array(obs: Mapping[str, Any], key: str) -> np.ndarray | None:
    try:
        value = obs.get(key)
    except Exception:  # an observation that cannot be read is just not used here
        return None
    if value is None:
        return None
    vals = _numbers(value)
    return np.asarray(vals, dtype=np.float64) if vals else None


def _about_finiteness(v: Any) -> bool:
    return str(v.expected) == "a finite float" or (
        "finite floats" in str(v.expected) and "bad values" in str(v.actual)
    )


def _fmt(values: Sequence[float], n: int = 6) -> str:
    shown = ", ".join(f"{v:.4g}" for v in list(values)[:n])
    return f"[{shown}{', ...' if len(values) > n else ''}]"


def _fingerprint(obs: Mapping[str, Any]) -> str:
    """A digest of what the policy sees (state and cameras), timestep and ids left out."""
    h = hashlib.blake2b(digest_size=16)
    for key in sorted(str(k) for k in obs.keys()):
        if not (key.startswith("state.") or key.startswith("video.")):
            continue
        h.update(key.encode())
        raw: bytes | None = None
        frame_bytes = getattr(obs, "frame_bytes", None)
        if key.startswith("video.") and callable(frame_bytes):
            try:
                raw = frame_bytes(key)
            except KeyError:
                raw = None
        if raw is None:
            try:
                raw = np.ascontiguousarray(np.asarray(obs[key])).tobytes()
            except Exception:  # an undecodable value still gets a stable digest
                raw = repr(type(obs[key])).encode()
        h.update(raw)
    return h.hexdigest()


class ContractChecker:
    """Collects contract findings over the probe episode.

    Args:
        robot: the robot the server runs.
        chunk_size: ``--chunk-size`` (None or 1: no chunking asked for).
        chunked: the policy is called for chunks (``get_action_chunk``), not single actions.
    """

    def __init__(self, robot: RobotSpec, *, chunk_size: int | None, chunked: bool) -> None:
        self.robot = robot
        self.chunk_size = chunk_size if chunk_size and chunk_size > 1 else None
        self.chunked = chunked
        self._hits: dict[str, _Hit] = {}
        self._prints: list[str] = []
        self._outputs: list[tuple[float, ...]] = []
        self._joint_states: list[np.ndarray] = []
        self._chunk_lengths: list[int] = []
        self.checked = 0
        self.policy_broken = False

    @property
    def max_chunk(self) -> int | None:
        """The longest chunk the policy returned so far (None: no chunk yet)."""
        return max(self._chunk_lengths) if self._chunk_lengths else None

    # ------------------------------------------------------------------ recording hits

    def _hit(
        self,
        fid: str,
        severity: str,
        title: str,
        *,
        evidence: str,
        fix: str,
        step: int,
        **data: Any,
    ) -> None:
        hit = self._hits.get(fid)
        if hit is None:
            self._hits[fid] = _Hit(severity, title, fix, evidence, step, data=dict(data))
        else:
            hit.count += 1

    # ------------------------------------------------------------------ per step

    def observe(self, step: int, obs: Mapping[str, Any], actions: Sequence[Any]) -> dict[str, Any] | None:
        """Check what the policy returned for ``obs`` (probe step ``step``).

        Returns the first action normalized by :func:`genmanip_protocol.schema.validate_action`
        when it is safe to send (valid, and within the server's per-step limits), else None (the
        caller sends the robot's neutral action instead, so the probe does not end the episode).
        """
        self.checked += 1
        self._prints.append(_fingerprint(obs))
        joints = _array(obs, "state.joints")
        if joints is not None:
            self._joint_states.append(joints)
        if self.chunked:
            self._chunk_lengths.append(len(actions))
        first_safe: dict[str, Any] | None = None
        for i, action in enumerate(actions):
            norm, safe = self._check_one(step, obs, action, where=f"chunk[{i}]" if self.chunked else "")
            if i == 0:
                first_safe = norm if safe else None
                if norm is not None:
                    self._outputs.append(tuple(_numbers(norm.get("action"))
                                               + _numbers(norm.get("base_motion"))))
        return first_safe

    def _check_one(
        self, step: int, obs: Mapping[str, Any], action: Any, *, where: str
    ) -> tuple[dict[str, Any] | None, bool]:
        spec = self.robot
        at = f"step {step}" + (f" {where}" if where else "")
        raw = action.get("action") if isinstance(action, Mapping) else None
        values = _numbers(raw) + _numbers(action.get("base_motion") if isinstance(action, Mapping) else None)
        bad = [i for i, v in enumerate(values) if not math.isfinite(v)]
        if bad:
            self._hit(
                "contract.non_finite", "fail", "the policy outputs NaN or inf",
                evidence=f"{at}: {len(bad)} non-finite value(s) at flat index {bad[:8]} of "
                         f"{_fmt(values, 8)}",
                fix="check the model's output (a division by zero, an unnormalised output, a "
                    "missing checkpoint key); the client refuses such actions and the server would "
                    "fail on them",
                step=step, indices=bad[:32],
            )
        if isinstance(raw, np.ndarray) and raw.dtype.kind in "iu":
            self._hit(
                "contract.dtype", "warn", f"the action is an integer array ({raw.dtype})",
                evidence=f"{at}: action dtype {raw.dtype}, shape {tuple(raw.shape)}",
                fix="return float32/float64 values (joint positions in rad, gripper in m)",
                step=step,
            )
        try:
            norm = validate_action(spec, action)
        except ValidationError as exc:
            # Non-finite values already have their own finding.
            shape = [v for v in exc.violations if not (bad and _about_finiteness(v))]
            if shape:
                text = "; ".join(safe_text(str(v), limit=160) for v in shape[:4])
                self._hit(
                    "contract.shape", "fail",
                    f"the action does not fit {spec.robot_id} (shape, keys or types)",
                    evidence=f"{at}: {text}",
                    fix=f"{spec.robot_id} takes joint_position = {spec.action_dim} floats "
                        f"(per arm {spec.arm_dof} joints then {spec.gripper_dof} gripper values) or "
                        f"ee_pose = [position(3), quaternion_wxyz(4), gripper({spec.gripper_dof})]"
                        + (" per arm, [left, right]" if spec.dual_arm else ""),
                    step=step, violations=[str(v) for v in shape[:8]],
                )
            return None, False
        safe = True
        if "is_rel" not in norm:
            self._hit(
                "contract.is_rel_missing", "warn", "the action does not say whether it is relative",
                evidence=f"{at}: no is_rel key: the server's -ira flag decides (absolute by default)",
                fix="set is_rel=True for deltas or is_rel=False for absolute targets",
                step=step,
            )
        if norm["control_type"] == "joint_position":
            safe &= self._check_joints(step, at, obs, norm)
        else:
            safe &= self._check_ee(step, at, obs, norm)
        safe &= self._check_grippers(step, at, obs, norm)
        self._check_base(step, at, norm)
        return norm, safe

    def _grippers(self, norm: Mapping[str, Any]) -> list[list[float]]:
        spec = self.robot
        if norm["control_type"] == "joint_position":
            vec = norm["action"]
            return [list(vec[s]) for s in spec.gripper_slices]
        arms = norm["action"] if spec.dual_arm else [norm["action"]]
        return [list(arm[2]) for arm in arms]

    def _check_joints(self, step: int, at: str, obs: Mapping[str, Any], norm: Mapping[str, Any]) -> bool:
        spec = self.robot
        vec = norm["action"]
        arm = np.asarray([v for s in spec.arm_slices for v in vec[s]], dtype=np.float64)
        joints = _array(obs, "state.joints")
        rel = bool(norm.get("is_rel", False))
        if not rel:
            if np.max(np.abs(arm)) > MAX_JOINT_ABS:
                self._hit(
                    "contract.range", "fail", f"arm targets beyond +-{MAX_JOINT_ABS:g} rad",
                    evidence=f"{at}: max |target| = {np.max(np.abs(arm)):.3g} rad",
                    fix="joint targets are radians; check units (degrees?) and the de-normalisation",
                    step=step,
                )
                return False
            if joints is not None and joints.shape == arm.shape:
                jump = float(np.max(np.abs(arm - joints)))
                if jump > MAX_JOINT_JUMP:
                    looks_delta = float(np.max(np.abs(arm))) < 0.2 < float(np.max(np.abs(joints)))
                    self._hit(
                        "contract.rel_abs", "fail",
                        "absolute arm targets far from the observed joints (is_rel=False)",
                        evidence=f"{at}: max |target - state.joints| = {jump:.3g} rad > "
                                 f"{MAX_JOINT_JUMP:g} rad per step (the server ends the episode: "
                                 "arm_state_jump_too_large)"
                                 + ("; the values are small, like deltas" if looks_delta else ""),
                        fix="if the policy outputs deltas, send is_rel=True; else check the joint "
                            "order and the de-normalisation against state.joints",
                        step=step, max_jump=jump,
                    )
                    return False
        else:
            biggest = float(np.max(np.abs(arm))) if arm.size else 0.0
            near_state = (joints is not None and joints.shape == arm.shape
                          and float(np.max(np.abs(arm - joints))) < _LOOKS_ABSOLUTE < biggest)
            if biggest > MAX_JOINT_JUMP or near_state:
                self._hit(
                    "contract.rel_abs", "fail",
                    "relative arm commands (is_rel=True) that look like absolute targets",
                    evidence=f"{at}: max |delta| = {biggest:.3g} rad"
                             + (" and the values match state.joints" if near_state else
                                f" > {MAX_JOINT_JUMP:g} rad per step"),
                    fix="if the policy outputs joint positions, send is_rel=False (deltas add to "
                        "the previously commanded targets, not to the measured state)",
                    step=step, max_delta=biggest,
                )
                return False
        return True

    def _check_ee(self, step: int, at: str, obs: Mapping[str, Any], norm: Mapping[str, Any]) -> bool:
        spec = self.robot
        arms = norm["action"] if spec.dual_arm else [norm["action"]]
        ok = True
        for k, (_pos, quat, _grip) in enumerate(arms):
            qn = math.sqrt(sum(q * q for q in quat))
            if abs(qn - 1.0) > QUAT_TOL:
                self._hit(
                    "contract.quaternion", "fail", "an ee_pose quaternion is not unit length",
                    evidence=f"{at}: arm {k} quaternion {_fmt(quat)} has norm {qn:.4g}",
                    fix="normalise the quaternion (w, x, y, z order) before sending it; a model's "
                        "raw 4-vector output is not a rotation",
                    step=step, norm=qn,
                )
                ok = False
        ee = _array(obs, "state.ee_pose")
        rel = bool(norm.get("is_rel", False))
        for k, (pos, _quat, _grip) in enumerate(arms):
            p = np.asarray(pos, dtype=np.float64)
            if rel:
                if float(np.linalg.norm(p)) > 0.1:
                    self._hit(
                        "contract.rel_abs", "warn",
                        "relative ee_pose deltas (is_rel=True) of more than 10 cm per step",
                        evidence=f"{at}: arm {k} position delta {_fmt(p.tolist())} "
                                 f"({np.linalg.norm(p):.3g} m)",
                        fix="if the policy outputs poses in the arm-base frame, send is_rel=False",
                        step=step,
                    )
            elif ee is not None and ee.size >= 7 * (k + 1):
                cur = ee[7 * k: 7 * k + 3]
                dist = float(np.linalg.norm(p - cur))
                if dist > 0.5:
                    self._hit(
                        "contract.rel_abs", "warn",
                        "absolute ee_pose targets more than 50 cm from the observed pose",
                        evidence=f"{at}: arm {k} target {_fmt(p.tolist())}, state.ee_pose "
                                 f"{_fmt(cur.tolist())} ({dist:.3g} m apart)",
                        fix="poses are in the arm-base frame, metres; if they are deltas, send "
                            "is_rel=True",
                        step=step,
                    )
        return ok

    def _check_grippers(self, step: int, at: str, obs: Mapping[str, Any], norm: Mapping[str, Any]) -> bool:
        spec = self.robot
        opened, closed = spec.gripper_open, spec.gripper_closed
        ok = True
        state = _array(obs, "state.gripper")
        first = bool(obs.get("reset", False)) or step == 0
        for k, grip in enumerate(self._grippers(norm)):
            for j, v in enumerate(grip):
                lo = min(opened[j], closed[j]) - GRIPPER_TOL
                hi = max(opened[j], closed[j]) + GRIPPER_TOL
                if not lo <= v <= hi:
                    self._hit(
                        "contract.gripper_range", "fail",
                        f"gripper commands outside {spec.robot_id}'s range",
                        evidence=f"{at}: arm {k} gripper joint {j} = {v:.4g}, range "
                                 f"[{min(opened[j], closed[j]):g}, {max(opened[j], closed[j]):g}] "
                                 f"(open {list(opened)}, closed {list(closed)})",
                        fix="gripper entries are absolute joint values, not a 0..1 command: map "
                            f"open -> {list(opened)} and closed -> {list(closed)}",
                        step=step, value=v,
                    )
                    ok = False
            if not first or state is None or state.size < spec.gripper_dof * (k + 1):
                continue
            seen = state[k * spec.gripper_dof:(k + 1) * spec.gripper_dof]
            span = [o - c for o, c in zip(opened, closed, strict=True)]
            cmd_open = float(np.mean([(g - c) / s for g, c, s in zip(grip, closed, span, strict=True)]))
            seen_open = float(np.mean([(g - c) / s for g, c, s in zip(seen, closed, span, strict=True)]))
            if seen_open >= 0.8 and cmd_open <= 0.2:
                self._hit(
                    "contract.gripper_polarity", "warn",
                    "the policy closes an open gripper at the episode's first observation",
                    evidence=f"{at}: arm {k} observed gripper {_fmt(seen.tolist())} (open), "
                             f"command {_fmt(grip)} (closed); {spec.robot_id}: open "
                             f"{list(opened)}, closed {list(closed)}",
                    fix="the gripper convention may be inverted (1 = closed vs open): map the "
                        "model's open/closed to the robot's values above",
                    step=step, observed=seen.tolist(), command=list(grip),
                )
        return ok

    def _check_base(self, step: int, at: str, norm: Mapping[str, Any]) -> None:
        bm = norm.get("base_motion")
        if not bm or not self.robot.has_base or not norm.get("base_is_rel", True):
            return
        over = [i for i, (v, lim) in enumerate(zip(bm, _BASE_CLIP, strict=True)) if abs(v) > lim]
        if over:
            self._hit(
                "contract.base_clip", "warn", "relative base motion beyond the per-step clip",
                evidence=f"{at}: base_motion {_fmt(bm)}; the server clips each step to +-0.015 m "
                         "(x, y) and +-1 degree (yaw)",
                fix="send small per-step deltas; yaw is in degrees in base_motion (radians in "
                    "state.base)",
                step=step,
            )

    # ------------------------------------------------------------------ failures

    def policy_failed(self, step: int, obs: Mapping[str, Any], exc: BaseException) -> None:
        """The policy raised on ``obs``: a ``KeyError`` names the key and the keys present."""
        self.policy_broken = True
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        keys = sorted(str(k) for k in obs.keys())
        if isinstance(cause, KeyError):
            key = safe_text(str(cause.args[0]) if cause.args else "?", limit=120)
            cams = [k for k in keys if k.startswith("video.")]
            fix = (f"read the cameras this server sends: {', '.join(cams) or 'none'} "
                   "(keys are video.<camera>_view)" if key.startswith("video.")
                   else "read only keys the observation has (instruction, state.*, video.*, "
                        "timestep, reset, episode_id, robot_id)")
            self._hit(
                "contract.missing_key", "fail", f"the policy reads obs[{key!r}], which is missing",
                evidence=f"step {step}: KeyError {key!r}; keys present: {', '.join(keys)}",
                fix=fix, step=step, key=key, keys_present=keys,
            )
            return
        self._hit(
            "contract.policy_error", "fail", "the policy raised on a real observation",
            evidence=f"step {step}: {safe_text(str(exc), limit=300)}",
            fix="run the policy on a recorded observation (gmp eval -v shows the traceback)",
            step=step,
        )

    # ------------------------------------------------------------------ across steps

    def findings(self) -> list[Finding]:
        """Every contract finding (per-step ones and the cross-step checks)."""
        self._across()
        out = []
        for fid, h in self._hits.items():
            evidence = h.evidence + (f" (and {h.count - 1} more time(s))" if h.count > 1 else "")
            out.append(Finding(fid, "contract", h.severity, h.title, evidence, h.fix,
                               {"first_step": h.first_step, "count": h.count, **h.data}))
        return out

    def _across(self) -> None:
        n = len(self._outputs)
        distinct_obs = len(set(self._prints))
        if n >= 3 and not self.policy_broken:
            outs = {tuple(round(v, 9) for v in o) for o in self._outputs}
            if len(outs) == 1 and distinct_obs >= 2:
                self._hit(
                    "contract.constant", "warn", "the policy returns the same action for different observations",
                    evidence=f"{n} calls on {distinct_obs} different observations, one output "
                             f"{_fmt(self._outputs[0], 8)}",
                    fix="check that the observation reaches the model (image and state keys, "
                        "normalisation statistics) and that the checkpoint is loaded",
                    step=0, calls=n, distinct_observations=distinct_obs,
                )
            elif len(outs) == 1:
                self._hit(
                    "contract.constant_unchecked", "info",
                    "constant outputs not checked: the observations did not change",
                    evidence=f"{n} calls, every observation the same (the robot did not move)",
                    fix="", step=0,
                )
        if len(self._joint_states) >= 3:
            states = np.stack([s for s in self._joint_states if s.shape == self._joint_states[0].shape])
            moved = np.ptp(states, axis=0) > _STILL
            labels = [lab for lab in self.robot.flat_labels() if "gripper" not in lab and "base" not in lab]
            still = [labels[i] if i < len(labels) else f"joint{i}" for i, m in enumerate(moved) if not m]
            if not moved.any():
                self._hit(
                    "contract.frozen_joints", "warn", "no arm joint moved during the probe",
                    evidence=f"{len(states)} observations, state.joints unchanged",
                    fix="if the policy should move, check is_rel (zero deltas) and the action "
                        "scale; a constant absolute target holds the arm",
                    step=0, joints=still,
                )
            elif still:
                self._hit(
                    "contract.still_joints", "info", "some joints never moved during the probe",
                    evidence=f"{', '.join(still)} unchanged over {len(states)} observations "
                             "(fine when the task does not need them)",
                    fix="", step=0, joints=still,
                )
        if self.chunked and self._chunk_lengths:
            lengths = sorted(set(self._chunk_lengths))
            if self.chunk_size is not None and any(n_ != self.chunk_size for n_ in lengths):
                shorter = any(n_ < self.chunk_size for n_ in lengths)
                self._hit(
                    "contract.chunk_length", "warn", "chunk lengths differ from --chunk-size",
                    evidence=f"chunks of {lengths} action(s), --chunk-size {self.chunk_size}",
                    fix=("the policy returns fewer actions than asked: the runner calls it sooner "
                         if shorter else "gmp eval cuts each chunk to --chunk-size: ")
                        + "pass --chunk-size equal to the model's horizon (or its policy arg)",
                    step=0, lengths=lengths,
                )
