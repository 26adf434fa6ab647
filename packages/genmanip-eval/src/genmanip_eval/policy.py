"""The policy interface of ``gmp eval`` and how policies are found.

A **policy** is any object with

* ``get_action(obs) -> action_dict`` and/or ``get_action_chunk(obs) -> list[action_dict]``, where
  ``obs`` is ONE worker's observation (a mapping with ``instruction``, ``state.*``, ``video.*``,
  ``timestep``, ``reset``, ``episode_id``, ``robot_id``; camera frames decode lazily on access);
* optionally ``reset()``, called before the first observation of every episode.

``gmp eval`` makes one policy instance per worker, so a policy may keep per-episode state.
A **factory** is a callable taking keyword arguments (the ``--policy-arg k=v`` values, as strings:
the factory parses them) and returning a policy. ``--policy`` names it

* as ``package.module:callable`` (imported directly), or
* by a bare name registered in the ``genmanip.policies`` entry-point group
  (:data:`POLICY_GROUP`), the way a model repo registers its own policy::

      [project.entry-points."genmanip.policies"]
      mymodel = "mymodel.policy:make"

  genmanip-eval registers ``zero`` (:class:`ZeroPolicy`); other gmp distributions register theirs
  (the testbed's scripted ``expert``). genmanip-eval never imports them by name: it only reads the
  group, so it does not depend on what sits above it.

An unknown name raises :class:`PolicyNotInstalledError` listing the installed names with a
did-you-mean. Its install hint comes from the ``genmanip.providers`` tables
(:mod:`genmanip_eval.plugins`), so the hint names the distribution to install without this package
knowing it.

A returned action may also be wrapped as ``{worker_id: action_dict}`` (the EBench ``ModelClient``
style); the single value is unwrapped.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import inspect
import logging
import os
import sysconfig
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import EntryPoint, packages_distributions
from types import TracebackType
from typing import Any

from genmanip_protocol.errors import ExitCode, ValidationError
from genmanip_protocol.robots import get_robot
from genmanip_protocol.schema import CONTROL_TYPES

from .actions import is_action_dict
from .errors import PolicyCodeError, PolicyError
from .plugins import entry_points_of, providers

__all__ = [
    "POLICY_GROUP",
    "PolicyHandle",
    "PolicyNotInstalledError",
    "ZeroPolicy",
    "check_action",
    "check_chunk",
    "installed_policies",
    "instantiate",
    "load_policy_factory",
    "parse_policy_args",
    "policy_code_error",
    "user_frame",
    "zero_policy",
]

log = logging.getLogger("genmanip_eval.policy")

#: Entry-point group of policy factories: ``name = "package.module:factory"``.
POLICY_GROUP = "genmanip.policies"

@functools.lru_cache(maxsize=1)
def _gmp_modules() -> frozenset[str]:
    """Top-level import names of gmp's own distributions (``genmanip*``, from the installed
    metadata, so no name above this package is spelled here): their frames are never "the user's
    code"."""
    names = {"genmanip_eval", "genmanip_client", "genmanip_protocol", "genmanip_runtime",
             "genmanip_results"}
    for top, dists in packages_distributions().items():
        if any(d.lower().replace("_", "-").startswith("genmanip") for d in dists):
            names.add(top)
    return frozenset(names)
#: The hint of every error raised by the user's policy code.
USER_CODE_HINT = "the error is in your policy's code, not in gmp: run with -v for the traceback"


def _stdlib_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib") if paths.get(k)}
    return tuple(d.rstrip(os.sep) + os.sep for d in dirs)


_STDLIB = _stdlib_dirs()


def _third_party(filename: str) -> bool:
    parts = filename.replace("\\", "/").split("/")
    return "site-packages" in parts or "dist-packages" in parts


def _is_stdlib(filename: str) -> bool:
    if filename.startswith("<"):  # <frozen importlib._bootstrap>, <string>
        return True
    real = os.path.realpath(filename)
    return real.startswith(_STDLIB) and not _third_party(real)


def _show_path(filename: str) -> str:
    try:
        rel = os.path.relpath(filename)
    except ValueError:  # another drive (Windows)
        return filename
    return filename if rel.startswith(os.pardir) else rel


def user_frame(exc: BaseException, *, module: str | None = None) -> str | None:
    """``file:line`` of the innermost frame of ``exc``'s traceback that is in the user's code.

    The user's code is anything but gmp's own packages (the ``genmanip*`` distributions) and the standard
    library. Preferred, innermost first: a frame of ``module``'s top-level package (the policy's
    own), then one outside ``site-packages`` (the user's checkout rather than torch), then any
    third-party frame. ``None`` when every frame is gmp's or the stdlib's. The one definition of
    "the user's frame" in gmp. Paths under the current directory are shown relative to it.
    """
    frames: list[tuple[str, str, int]] = []
    tb: TracebackType | None = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        name = str(tb.tb_frame.f_globals.get("__name__") or "")
        frames.append((name.split(".", 1)[0], code.co_filename, tb.tb_lineno))
        tb = tb.tb_next
    gmp = _gmp_modules()
    candidates = [(top, f, n) for top, f, n in frames if top not in gmp and not _is_stdlib(f)]
    if not candidates:
        return None
    own = module.split(".", 1)[0] if module else None
    for pick in (
        [c for c in candidates if own and c[0] == own],
        [c for c in candidates if not _third_party(c[1])],
        candidates,
    ):
        if pick:
            _, filename, line = pick[-1]
            return f"{_show_path(filename)}:{line}"
    return None  # pragma: no cover - candidates is not empty


def policy_code_error(
    what: str, exc: BaseException, *, module: str | None = None, verb: str = "raised"
) -> PolicyCodeError:
    """The error for an exception ``exc`` the user's policy code raised in ``what`` (``"mypkg:make:
    get_action(obs)"``): ``<what> <verb> <type>: <exc> (at <file:line>)`` (:func:`user_frame`) and
    the ``-v`` hint; exit code FAILURE (the run failed; gmp did not). ``module`` is the policy's
    module (its frames are preferred)."""
    where = user_frame(exc, module=module)
    text = str(exc)
    message = f"{what} {verb} {type(exc).__name__}" + (f": {text}" if text else "")
    if where:
        message += f" (at {where})"
    return PolicyCodeError(message, where=where, hint=USER_CODE_HINT)


def _module_of(obj: Any) -> str | None:
    module = getattr(obj, "__module__", None)
    if module is None:
        module = getattr(type(obj), "__module__", None)
    return module if isinstance(module, str) else None


class PolicyNotInstalledError(PolicyError):
    """No installed distribution registers the requested policy name.

    Attributes:
        name: the requested name.
        installed: the names that are installed (sorted).
    """

    exit_code = ExitCode.NOT_INSTALLED

    def __init__(self, message: str, *, name: str, installed: Sequence[str], hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.name = name
        self.installed = list(installed)


class ZeroPolicy:
    """The no-op policy: every action holds the robot still with its grippers open.

    Each action is :meth:`genmanip_protocol.robots.RobotSpec.neutral_action` of the robot:
    ``is_rel=True`` with zero arm deltas, the grippers at their open values (absolute, as gripper
    entries always are), and a zero relative ``base_motion`` on mobile robots. The reference
    client's ``gmp eval`` sends a "fake" no-op of this shape whose values are off for some robots
    (all-zero closes the panda gripper); this one is exact. It scores 0.

    Args:
        robot: robot id or alias; default: each observation's ``robot_id``.
        control_type: ``"joint_position"`` (a flat vector) or ``"ee_pose"`` (identity pose deltas).
        chunk: actions per :meth:`get_action_chunk` call (``gmp eval --chunk-size`` truncates it).
    """

    def __init__(self, robot: str | None = None, control_type: str = "joint_position", chunk: int = 4) -> None:
        if control_type not in CONTROL_TYPES:
            raise PolicyError(
                f"policy 'zero': control_type must be one of {', '.join(CONTROL_TYPES)}, got {control_type!r}"
            )
        if chunk < 1:
            raise PolicyError(f"policy 'zero': chunk must be at least 1, got {chunk}")
        if robot:
            try:
                robot = get_robot(robot).robot_id  # fail at load, not at the first step
            except ValidationError as exc:
                raise PolicyError(f"policy 'zero': robot={robot!r}: {exc}") from exc
        self._robot = robot
        self.control_type = control_type
        self.chunk = chunk

    def reset(self) -> None:
        """Nothing to reset: the policy is stateless."""

    def get_action(self, obs: Mapping[str, Any]) -> dict[str, Any]:
        """The robot's no-op action for ``obs`` (a new dict each call)."""
        rid = self._robot or obs.get("robot_id")
        if not rid:
            raise PolicyError(
                "policy 'zero': the observation has no robot_id",
                hint="pass --policy-arg robot=<robot id> (e.g. manip/lift2/R5a)",
            )
        return get_robot(str(rid)).neutral_action(self.control_type)

    def get_action_chunk(self, obs: Mapping[str, Any]) -> list[dict[str, Any]]:
        """``chunk`` no-op actions (independent dicts): shape ``(chunk, ...)``."""
        return [self.get_action(obs) for _ in range(self.chunk)]


def zero_policy(**kwargs: str) -> ZeroPolicy:
    """Factory of :class:`ZeroPolicy`, entry point ``genmanip.policies:zero``.

    Accepts the strings ``robot=<id>``, ``control_type=joint_position|ee_pose`` and ``chunk=<n>``.
    """
    unknown = set(kwargs) - {"robot", "control_type", "chunk"}
    if unknown:
        raise PolicyError(
            f"policy 'zero' takes only robot=..., control_type=... and chunk=..., got {sorted(unknown)}"
        )
    try:
        chunk = int(kwargs.get("chunk", 4))
    except ValueError:
        raise PolicyError(f"policy 'zero': chunk={kwargs['chunk']!r} is not an integer") from None
    return ZeroPolicy(
        robot=kwargs.get("robot") or None,
        control_type=kwargs.get("control_type", "joint_position"),
        chunk=chunk,
    )


def installed_policies() -> dict[str, list[EntryPoint]]:
    """Every name of the ``genmanip.policies`` group -> its entry points (more than one = a clash)."""
    out: dict[str, list[EntryPoint]] = {}
    for ep in entry_points_of(POLICY_GROUP):
        out.setdefault(ep.name, []).append(ep)
    return out


def _dist_name(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    name = getattr(dist, "name", None) if dist is not None else None
    return str(name) if name else "an unknown distribution"


def _not_installed(spec: str, installed: Mapping[str, Any]) -> PolicyNotInstalledError:
    names = sorted(installed)
    known = providers(POLICY_GROUP)
    message = f"--policy {spec!r}: no installed policy has that name (installed: {', '.join(names) or 'none'})"
    close = difflib.get_close_matches(spec, names, n=1)
    if not close and spec not in known:
        # A typo of a policy this project ships but that is not installed here.
        close = difflib.get_close_matches(spec, sorted(known), n=1)
    guess = close[0] if close else None
    if guess is not None:
        message += f"; did you mean {guess!r}?"
    if spec in known:
        hint = f"policy {spec!r} comes with {known[spec]}: pip install {known[spec]}"
    elif guess is not None and guess in installed:
        hint = f"--policy {guess}"
    elif guess is not None:
        hint = f"policy {guess!r} comes with {known[guess]}: pip install {known[guess]}"
    elif "." in spec:
        hint = f"a module is named with its factory: --policy {spec}:<factory>"
    else:
        # No table names a provider (with genmanip-eval alone there is none, and this package
        # names nothing above it): say how a policy gets a name.
        hint = (
            "install the distribution that provides it, name your factory as "
            f'package.module:callable, or register it under [project.entry-points."{POLICY_GROUP}"]'
        )
    return PolicyNotInstalledError(message, name=spec, installed=names, hint=hint)


def _load_entry_point(spec: str, ep: EntryPoint) -> Callable[..., Any]:
    dist = _dist_name(ep)
    try:
        obj = ep.load()
    except (ImportError, AttributeError) as exc:
        # Installed but broken (a missing dependency, a stale entry point): name who registered it.
        raise PolicyError(
            f"--policy {spec!r}: {dist} registers it as {ep.value!r}, which does not load: "
            f"{type(exc).__name__}: {exc}",
            hint=f"reinstall {dist} (pip install --force-reinstall {dist})",
        ) from exc
    if not callable(obj):
        raise PolicyError(f"--policy {spec!r}: {ep.value} (registered by {dist}) is not callable")
    return obj  # type: ignore[no-any-return]


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
    """Resolve ``package.module:callable`` or a ``genmanip.policies`` name to a factory.

    Raises:
        PolicyNotInstalledError: a bare name nothing installed registers (exit code 3).
        PolicyError: a malformed spec, an import that fails, a clash of two distributions.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep:
        name = spec.strip()
        installed = installed_policies()
        eps = installed.get(name)
        if not name:
            raise PolicyError(
                f"--policy {spec!r}: expected 'package.module:factory' or a policy name "
                f"({', '.join(sorted(installed)) or 'none installed'})"
            )
        if not eps:
            raise _not_installed(name, installed)
        if len(eps) > 1:
            both = ", ".join(f"{_dist_name(e)} ({e.value})" for e in eps)
            raise PolicyError(
                f"--policy {spec!r}: more than one distribution registers it: {both}",
                hint="name the one you mean as package.module:callable",
            )
        return _load_entry_point(name, eps[0])
    if not module_name or not attr:
        raise PolicyError(
            f"--policy {spec!r}: expected 'package.module:factory' or a policy name "
            f"({', '.join(sorted(installed_policies())) or 'none installed'})"
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
            names = [n for n in dir(obj) if not n.startswith("_") and callable(getattr(obj, n, None))]
            close = difflib.get_close_matches(part, names, n=1)
            message = f"--policy {spec!r}: {module_name} has no attribute {attr!r}"
            hint = None
            if close:
                fixed = attr.replace(part, close[0], 1) if "." in attr else close[0]
                message += f"; did you mean {close[0]!r}?"
                hint = f"--policy {module_name}:{fixed}"
            raise PolicyError(message, hint=hint) from None
    if not callable(obj):
        raise PolicyError(f"--policy {spec!r}: {attr} is not callable")
    return obj  # type: ignore[no-any-return]


def _factory_name(factory: Callable[..., Any]) -> str:
    name = getattr(factory, "__qualname__", None) or getattr(factory, "__name__", None)
    module = _module_of(factory)
    if not name:
        return type(factory).__name__
    return f"{module}:{name}" if module else str(name)


def _signature_hint(factory: Callable[..., Any], args: Mapping[str, str]) -> str | None:
    """A did-you-mean for a ``--policy-arg`` name the factory's signature does not have."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    names = [n for n, p in params.items()
             if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    for key in args:
        if key not in params:
            close = difflib.get_close_matches(key, names, n=1)
            if close:
                return f"did you mean --policy-arg {close[0]}=...? (it takes: {', '.join(names) or 'nothing'})"
            return f"it takes: {', '.join(names) or 'no arguments'}"
    return None


def instantiate(spec: str, factory: Callable[..., Any], args: Mapping[str, str] | None) -> Any:
    """Call the policy ``factory`` of ``--policy spec`` with the ``--policy-arg`` strings.

    Raises:
        PolicyError: the factory's signature does not take those arguments (exit USAGE, with a
            did-you-mean), or the factory raised a :class:`PolicyError` itself.
        PolicyCodeError: the factory raised anything else (a missing checkpoint,
            ``float("abc")`` on an argument): named with the exception and the user's
            ``file:line`` (exit FAILURE), never an "internal error" of gmp.
    """
    kwargs = dict(args or {})
    try:
        return factory(**kwargs)
    except PolicyError:
        raise
    except Exception as exc:
        tb = exc.__traceback__
        if isinstance(exc, TypeError) and tb is not None and tb.tb_next is None:
            # Raised by the call itself: the arguments do not fit the factory's signature.
            raise PolicyError(
                f"--policy {spec!r}: the factory rejected its arguments: {exc}",
                hint=_signature_hint(factory, kwargs),
            ) from exc
        given = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        what = (f"--policy {spec!r}: the factory {_factory_name(factory)}"
                + (f"({given})" if given else "()"))
        # Factories parse their string arguments: a TypeError or ValueError is a bad one.
        rejected = bool(kwargs) and isinstance(exc, (TypeError, ValueError))
        verb = "rejected its arguments:" if rejected else "raised"
        raise policy_code_error(what, exc, module=_module_of(factory), verb=verb) from exc


def _unwrap(result: Any, what: str) -> Any:
    if isinstance(result, Mapping) and not is_action_dict(result) and len(result) == 1:
        (inner,) = result.values()
        return inner
    return result


class PolicyHandle:
    """One per-worker policy instance, called one observation at a time.

    A view of :class:`genmanip_eval.inference.Inference` (the one place policies are called,
    checked and their errors named) for code that drives a single worker itself.
    """

    def __init__(self, policy: Any, *, name: str = "policy") -> None:
        from .inference import Inference, is_batched

        if is_batched(policy):
            raise PolicyError(
                f"{name}: a batched policy (get_actions(batch)): call it through "
                "genmanip_eval.inference.Inference"
            )
        self.policy = policy
        self.name = name
        self._inference = Inference.wrap(policy, name=name)
        self.has_action = self._inference.has_action
        self.has_chunk = self._inference.has_chunk

    @classmethod
    def create(cls, spec: str, args: Mapping[str, str] | None = None) -> PolicyHandle:
        """Load ``spec`` and instantiate it with ``args``."""
        return cls(instantiate(spec, load_policy_factory(spec), args), name=spec)

    def reset(self) -> None:
        """The policy's ``reset()`` (before an episode's first observation), if it has one."""
        self._inference.reset_worker(_ONE_WORKER)

    def action(self, obs: Any) -> Any:
        """One action dict for ``obs`` (``get_action``)."""
        return self._inference.actions([self._item(obs)])[0]

    def chunk(self, obs: Any) -> list[Any]:
        """A non-empty list of action dicts for ``obs`` (``get_action_chunk``)."""
        return self._inference.chunks([self._item(obs)])[0]

    @staticmethod
    def _item(obs: Any) -> Any:
        from .inference import BatchItem

        return BatchItem(_ONE_WORKER, None, obs)


#: The worker id of a :class:`PolicyHandle`'s calls (it drives one worker).
_ONE_WORKER = "0"


def check_action(name: str, what: str, result: Any) -> dict[str, Any]:
    """``result`` of the policy's ``what`` as one action dict (a ``{worker_id: action}`` wrapper
    is unwrapped); else :class:`PolicyError` naming the policy and the call."""
    result = _unwrap(result, what)
    if not is_action_dict(result):
        raise PolicyError(
            f"{name}: {what} returned {type(result).__name__}, expected an action dict "
            "with 'action' and 'control_type'"
        )
    return dict(result)


def check_chunk(name: str, what: str, result: Any) -> list[dict[str, Any]]:
    """``result`` of the policy's ``what`` as a non-empty list of action dicts (one action dict is
    a chunk of one); else :class:`PolicyError` naming the policy, the call and the bad index."""
    result = _unwrap(result, what)
    if isinstance(result, Mapping) and is_action_dict(result):
        result = [result]
    if not isinstance(result, (list, tuple)) or not result:
        raise PolicyError(
            f"{name}: {what} returned {type(result).__name__}, expected a non-empty list of action dicts"
        )
    for i, a in enumerate(result):
        if not is_action_dict(a):
            raise PolicyError(f"{name}: {what}[{i}] is {type(a).__name__}, not an action dict")
    return [dict(a) for a in result]
