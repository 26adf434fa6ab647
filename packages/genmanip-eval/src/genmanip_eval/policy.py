"""The policy interface of ``gmp eval`` and how policies are loaded.

A **policy** is any object with

* ``get_action(obs) -> action_dict`` and/or ``get_action_chunk(obs) -> list[action_dict]``, where
  ``obs`` is ONE worker's observation (a mapping with ``instruction``, ``state.*``, ``video.*``,
  ``timestep``, ``reset``, ``episode_id``, ``robot_id``; camera frames decode lazily on access);
* optionally ``reset()``, called before the first observation of every episode.

``gmp eval`` makes one policy instance per worker, so a policy may keep per-episode state.
A **factory** is a callable taking keyword arguments (the ``--policy-arg k=v`` values, as strings:
the factory parses them) and returning a policy; it is named ``package.module:callable`` or by a
built-in name: ``zero`` (the no-op actions the reference ``gmp eval`` sent) or ``expert``
(``genmanip_testbed.policies:expert``, the testbed's scripted expert).

A returned action may also be wrapped as ``{worker_id: action_dict}`` (the EBench ``ModelClient``
style); the single value is unwrapped.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from genmanip_protocol.errors import ExitCode
from genmanip_protocol.robots import get_robot
from genmanip_protocol.schema import CONTROL_TYPES

from .actions import is_action_dict
from .errors import PolicyError

__all__ = [
    "BUILTIN_POLICIES",
    "PolicyHandle",
    "ZeroPolicy",
    "load_policy_factory",
    "parse_policy_args",
]


class ZeroPolicy:
    """Actions that hold the robot still: relative all-zero joint deltas (``is_rel=True``).

    This is what the reference client's ``gmp eval`` sent. The action length comes from the
    observation's ``robot_id`` (or ``robot=``). With ``control_type="ee_pose"`` each arm gets the
    identity pose delta ``[[0, 0, 0], [1, 0, 0, 0], gripper]`` (relative; the gripper, always
    absolute, is kept where ``state.gripper`` says it is).
    """

    def __init__(self, robot: str | None = None, control_type: str = "joint_position") -> None:
        if control_type not in CONTROL_TYPES:
            raise PolicyError(
                f"policy 'zero': control_type must be one of {', '.join(CONTROL_TYPES)}, got {control_type!r}"
            )
        self._robot = robot
        self.control_type = control_type

    def reset(self) -> None:
        """Nothing to reset."""

    def get_action(self, obs: Mapping[str, Any]) -> dict[str, Any]:
        spec = get_robot(self._robot or obs.get("robot_id") or "")
        action: dict[str, Any] = {"control_type": self.control_type, "is_rel": True}
        if self.control_type == "joint_position":
            action["action"] = [0.0] * spec.action_dim
        else:
            state = obs.get("state.gripper")
            grip = [float(x) for x in state] if state is not None and len(state) == spec.gripper_dim else None
            arms = []
            for i in range(spec.n_arms):
                g = grip[i * spec.gripper_dof : (i + 1) * spec.gripper_dof] if grip else list(spec.gripper_open)
                arms.append([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], g])
            action["action"] = arms if spec.dual_arm else arms[0]
        if spec.has_base:
            action["base_motion"] = [0.0, 0.0, 0.0]
            action["base_is_rel"] = True
        return action


def _zero_factory(**kwargs: str) -> ZeroPolicy:
    unknown = set(kwargs) - {"robot", "control_type"}
    if unknown:
        raise PolicyError(f"policy 'zero' takes only robot=... and control_type=..., got {sorted(unknown)}")
    return ZeroPolicy(robot=kwargs.get("robot"), control_type=kwargs.get("control_type", "joint_position"))


def _expert_factory(**kwargs: str) -> Any:
    try:
        mod = importlib.import_module("genmanip_testbed.policies")
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] == "genmanip_testbed":
            raise PolicyError(
                "policy 'expert' is the testbed's scripted expert and needs the genmanip-testbed "
                "package",
                hint="pip install genmanip-testbed (or 'genmanip[testbed]')",
            ) from exc
        raise
    return mod.expert(**kwargs)


#: Built-in policy names -> factories.
BUILTIN_POLICIES: Mapping[str, Callable[..., Any]] = {
    "zero": _zero_factory,
    "expert": _expert_factory,
}


def parse_policy_args(items: Sequence[str] | None) -> dict[str, str]:
    """``["k=v", ...]`` -> ``{"k": "v"}``; a malformed item raises :class:`PolicyError`."""
    out: dict[str, str] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise PolicyError(
                f"--policy-arg {item!r}: expected KEY=VALUE with KEY a Python identifier"
            )
        out[key] = value
    return out


def load_policy_factory(spec: str) -> Callable[..., Any]:
    """Resolve ``zero``, ``expert`` or ``package.module:callable`` to a factory."""
    if spec in BUILTIN_POLICIES:
        return BUILTIN_POLICIES[spec]
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise PolicyError(
            f"--policy {spec!r}: expected 'package.module:factory' or one of "
            f"{', '.join(BUILTIN_POLICIES)}"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise PolicyError(
            f"--policy {spec!r}: cannot import {module_name!r}: {exc}",
            hint="is the policy's package installed in this Python, or its directory on PYTHONPATH?",
        ) from exc
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise PolicyError(f"--policy {spec!r}: {module_name} has no attribute {attr!r}") from None
    if not callable(obj):
        raise PolicyError(f"--policy {spec!r}: {attr} is not callable")
    return obj  # type: ignore[no-any-return]


def _unwrap(result: Any, what: str) -> Any:
    if isinstance(result, Mapping) and not is_action_dict(result) and len(result) == 1:
        (inner,) = result.values()
        return inner
    return result


class PolicyHandle:
    """A loaded policy instance with the checks ``gmp eval`` needs."""

    def __init__(self, policy: Any, *, name: str = "policy") -> None:
        self.policy = policy
        self.name = name
        self.has_action = callable(getattr(policy, "get_action", None))
        self.has_chunk = callable(getattr(policy, "get_action_chunk", None))
        if not (self.has_action or self.has_chunk):
            raise PolicyError(
                f"{name}: the object returned by the factory ({type(policy).__name__}) has neither "
                "get_action(obs) nor get_action_chunk(obs)"
            )

    @classmethod
    def create(cls, spec: str, args: Mapping[str, str] | None = None) -> PolicyHandle:
        """Load ``spec`` and instantiate it with ``args``."""
        factory = load_policy_factory(spec)
        try:
            policy = factory(**dict(args or {}))
        except PolicyError:
            raise
        except TypeError as exc:
            raise PolicyError(f"--policy {spec!r}: the factory rejected its arguments: {exc}") from exc
        return cls(policy, name=spec)

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except PolicyError:
            raise
        except Exception as exc:
            # The user's code failed, not gmp: say so (the traceback is shown with gmp -v).
            err = PolicyError(f"{self.name}: {what} raised {type(exc).__name__}: {exc}")
            err.exit_code = ExitCode.FAILURE  # type: ignore[misc]
            raise err from exc

    def reset(self) -> None:
        fn = getattr(self.policy, "reset", None)
        if callable(fn):
            self._call("reset()", fn)

    def action(self, obs: Any) -> Any:
        result = _unwrap(self._call("get_action(obs)", self.policy.get_action, obs), "get_action")
        if not is_action_dict(result):
            raise PolicyError(
                f"{self.name}: get_action returned {type(result).__name__}, expected an action dict "
                "with 'action' and 'control_type'"
            )
        return result

    def chunk(self, obs: Any) -> list[Any]:
        result = _unwrap(
            self._call("get_action_chunk(obs)", self.policy.get_action_chunk, obs), "get_action_chunk"
        )
        if isinstance(result, Mapping) and is_action_dict(result):
            result = [result]
        if not isinstance(result, (list, tuple)) or not result:
            raise PolicyError(
                f"{self.name}: get_action_chunk returned {type(result).__name__}, expected a "
                "non-empty list of action dicts"
            )
        for i, a in enumerate(result):
            if not is_action_dict(a):
                raise PolicyError(
                    f"{self.name}: get_action_chunk()[{i}] is {type(a).__name__}, not an action dict"
                )
        return list(result)
