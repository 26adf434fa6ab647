"""One policy as the runner calls it: batches of observations from many workers, on one thread.

A policy is one of two kinds (see :mod:`genmanip_eval.policy` for how ``--policy`` finds it):

* **per worker** (today's interface and the seed's ``ModelClient``): ``get_action(obs)`` and/or
  ``get_action_chunk(obs)``, optionally ``reset()``. The factory is called once per worker id, so
  each worker has its own instance and may keep per-episode state; a batch is served by calling
  the instances of its workers one after another.
* **batched**: ``get_actions(batch)`` and/or ``get_action_chunks(batch)``, where ``batch`` is a
  sequence of :class:`BatchItem` (worker id, episode id, observation), returning one action dict
  (or one chunk, a list of action dicts) per item, in order; optionally ``reset(worker_id)``,
  called just before the batch that holds that worker's first observation of an episode. The
  factory is called once: one instance (one copy of the model) serves every worker.

:class:`Inference` hides the difference. Every call of the user's code goes through it from one
thread (the batcher's), so a policy never needs to be thread-safe.

A ``--policy`` that is a URL (``ws://host:port``) names a policy server: the scheme is looked up in
the ``genmanip.policy_schemes`` entry-point group (:data:`SCHEME_GROUP`), whose factory takes the
URL and the ``--policy-arg`` strings and returns a batched policy.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import PolicyError
from .plugins import entry_points_of, providers
from .policy import check_action, check_chunk, instantiate, load_policy_factory, policy_code_error

__all__ = ["SCHEME_GROUP", "BatchItem", "Inference"]

log = logging.getLogger("genmanip_eval.inference")

#: Entry-point group of policy-server clients by URL scheme: ``ws = "package.module:factory"``.
SCHEME_GROUP = "genmanip.policy_schemes"


@dataclass(frozen=True)
class BatchItem:
    """One worker's observation waiting for an action.

    Attributes:
        worker_id: the server's worker id (a string).
        episode_id: the episode it belongs to (``obs["episode_id"]``; None if the server sent none).
        obs: the observation (a mapping: ``instruction``, ``state.*``, ``video.*``, ``timestep``,
            ``reset``, ``episode_id``, ``robot_id``; frames decode lazily on access).
        new_episode: True on the episode's first observation (the policy's state for this worker
            should start afresh).
    """

    worker_id: str
    episode_id: str | None
    obs: Any
    new_episode: bool = False


class Inference:
    """A loaded policy behind one interface: :meth:`actions` / :meth:`chunks` of a batch.

    Build it with :meth:`create`. ``has_action`` / ``has_chunk`` say which calls the policy
    offers; ``batched`` whether one instance serves all workers.
    """

    def __init__(
        self,
        name: str,
        *,
        batched: Any = None,
        factory: Callable[[], Any] | None = None,
        first: Any = None,
    ) -> None:
        self.name = name
        self._batched = batched
        self._factory = factory
        self._per_worker: dict[str, Any] = {}
        self._spare = first  # the instance made to inspect the policy: the first worker's
        probe = batched if batched is not None else first
        if batched is not None:
            self.has_action = callable(getattr(probe, "get_actions", None))
            self.has_chunk = callable(getattr(probe, "get_action_chunks", None))
        else:
            self.has_action = callable(getattr(probe, "get_action", None))
            self.has_chunk = callable(getattr(probe, "get_action_chunk", None))
            if not (self.has_action or self.has_chunk):
                raise PolicyError(
                    f"{name}: the object returned by the factory ({type(probe).__name__}) has none of "
                    "get_action(obs), get_action_chunk(obs), get_actions(batch), get_action_chunks(batch)"
                )

    #: True for :meth:`wrap` of a per-worker object: every worker shares it, :meth:`drop` never
    #: closes it.
    _shared = False

    @property
    def batched(self) -> bool:
        """True when one instance serves every worker (``get_actions`` / ``get_action_chunks``)."""
        return self._batched is not None

    @property
    def concurrent(self) -> bool:
        """True when calls for different workers may run at the same time, each from its
        worker's thread: a batched policy whose ``concurrent_workers`` attribute is true (a
        ``ws://`` policy: one connection per worker, the policy server batches). The async
        runner then calls it from every lane instead of batching in this process."""
        return self._batched is not None and getattr(self._batched, "concurrent_workers", False) is True

    def batch_size_of(self, worker_id: str) -> int | None:
        """The batch that served ``worker_id``'s last call, as the policy reports it (a policy
        server's batch, its optional ``batch_size_of(worker_id)``); None when it does not say."""
        fn = getattr(self._batched, "batch_size_of", None) if self._batched is not None else None
        n = fn(worker_id) if callable(fn) else None
        return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None

    @property
    def prefers_jpeg(self) -> bool:
        """True when the policy would rather get camera frames as the GenManip server's JPEG than
        raw: a batched policy whose ``prefers_jpeg`` attribute is true (a ``ws://`` policy whose
        server takes JPEG frames forwards them undecoded: a small fraction of the bytes on its
        wire, and no decoding in this process). A hint for choosing the frames of
        ``--frames auto``; read-only, False for every other policy."""
        return self._batched is not None and getattr(self._batched, "prefers_jpeg", False) is True

    @classmethod
    def create(cls, spec: str, args: Mapping[str, str] | None = None) -> Inference:
        """Load ``--policy spec`` (a factory, a registered name or a policy-server URL) with ``args``.

        Raises:
            PolicyError: the spec does not load, the factory fails, or the object is no policy.
        """
        if "://" in spec:
            return cls(spec, batched=_remote_policy(spec, args))
        factory = load_policy_factory(spec)
        first = instantiate(spec, factory, args)
        if is_batched(first):
            return cls(spec, batched=first)
        return cls(spec, factory=lambda: instantiate(spec, factory, args), first=first)

    @classmethod
    def wrap(cls, policy: Any, *, name: str = "policy") -> Inference:
        """An :class:`Inference` over an existing object: batched, or one instance for all workers."""
        if is_batched(policy):
            return cls(name, batched=policy)
        inference = cls(name, factory=lambda: policy, first=policy)
        inference._shared = True
        return inference

    # ------------------------------------------------------------------ calls

    def actions(self, batch: Sequence[BatchItem]) -> list[dict[str, Any]]:
        """One action dict per item of ``batch``, in order."""
        self._resets(batch)
        if self._batched is not None:
            out = self._call("get_actions(batch)", self._batched.get_actions, list(batch))
            return [check_action(self.name, f"get_actions(batch)[{i}]", a)
                    for i, a in enumerate(self._sized(out, batch, "get_actions"))]
        return [
            check_action(self.name, "get_action", self._call("get_action(obs)", self._of(it).get_action, it.obs))
            for it in batch
        ]

    def chunks(self, batch: Sequence[BatchItem]) -> list[list[dict[str, Any]]]:
        """One chunk (a non-empty list of action dicts) per item of ``batch``, in order."""
        self._resets(batch)
        if self._batched is not None:
            out = self._call("get_action_chunks(batch)", self._batched.get_action_chunks, list(batch))
            return [check_chunk(self.name, f"get_action_chunks(batch)[{i}]", c)
                    for i, c in enumerate(self._sized(out, batch, "get_action_chunks"))]
        return [
            check_chunk(self.name, "get_action_chunk",
                        self._call("get_action_chunk(obs)", self._of(it).get_action_chunk, it.obs))
            for it in batch
        ]

    def drop(self, worker_id: str) -> None:
        """Release what the policy keeps for worker ``worker_id`` (that worker is gone for good,
        e.g. a policy server's connection closed).

        A per-worker policy's instance of that worker is forgotten and its ``close()`` (if it has
        one) called; the worker's next observation, if any, gets a new instance. A batched
        policy's optional ``drop(worker_id)`` is called (nothing else happens without one). An
        unknown worker id is ignored. Call it from the thread that calls the policy.

        Raises:
            PolicyError: the batched policy's ``drop(worker_id)`` raised (a per-worker instance's
                failing ``close()`` is only logged).
        """
        if self._batched is not None:
            fn = getattr(self._batched, "drop", None)
            if callable(fn):
                self._call("drop(worker_id)", fn, worker_id)
            return
        inst = self._per_worker.pop(worker_id, None)
        if inst is None or self._shared or any(v is inst for v in self._per_worker.values()):
            return
        fn = getattr(inst, "close", None)
        if callable(fn):
            try:
                fn()
            except Exception as exc:  # one worker's release must not stop the others
                log.warning("%s: close() of worker %s raised %s: %s", self.name, worker_id,
                            type(exc).__name__, exc)

    def close(self) -> None:
        """Release the policy (its ``close()`` if it has one: a remote policy's connections)."""
        targets = [self._batched] if self._batched is not None else list(self._per_worker.values())
        for obj in targets:
            fn = getattr(obj, "close", None)
            if callable(fn):
                try:
                    fn()
                except Exception as exc:  # closing must not mask what made the run stop
                    log.warning("%s: close() raised %s: %s", self.name, type(exc).__name__, exc)

    # ------------------------------------------------------------------ internals

    def _of(self, item: BatchItem) -> Any:
        inst = self._per_worker.get(item.worker_id)
        if inst is None:
            if self._spare is not None:
                inst, self._spare = self._spare, None
            else:
                assert self._factory is not None
                inst = self._factory()
            self._per_worker[item.worker_id] = inst
        return inst

    def reset_worker(self, worker_id: str) -> None:
        """Tell the policy that ``worker_id`` starts an episode now (its ``reset(worker_id)``, or
        that worker's instance's ``reset()``); :meth:`actions` does it by itself for items whose
        ``new_episode`` is set."""
        self._resets([BatchItem(worker_id, None, None, new_episode=True)])

    def _resets(self, batch: Sequence[BatchItem]) -> None:
        for it in batch:
            if not it.new_episode:
                continue
            if self._batched is not None:
                fn = getattr(self._batched, "reset", None)
                if callable(fn):
                    self._call("reset(worker_id)", fn, it.worker_id)
            else:
                fn = getattr(self._of(it), "reset", None)
                if callable(fn):
                    self._call("reset()", fn)

    def _sized(self, out: Any, batch: Sequence[BatchItem], what: str) -> list[Any]:
        if not isinstance(out, (list, tuple)) or len(out) != len(batch):
            got = f"{len(out)} item(s)" if isinstance(out, (list, tuple)) else type(out).__name__
            raise PolicyError(
                f"{self.name}: {what}(batch) returned {got} for a batch of {len(batch)}: expected "
                "one per item, in order"
            )
        return list(out)

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except PolicyError:
            raise
        except Exception as exc:
            # The user's code failed, not gmp: say so, and where (the traceback is shown with -v).
            module = getattr(fn, "__module__", None)
            raise policy_code_error(
                f"{self.name}: {what}", exc, module=module if isinstance(module, str) else None
            ) from exc


def is_batched(policy: Any) -> bool:
    """Does ``policy`` take batches (``get_actions`` / ``get_action_chunks``)?"""
    return callable(getattr(policy, "get_actions", None)) or callable(
        getattr(policy, "get_action_chunks", None)
    )


def _remote_policy(spec: str, args: Mapping[str, str] | None) -> Any:
    scheme = spec.split("://", 1)[0].lower()
    eps = [ep for ep in entry_points_of(SCHEME_GROUP) if ep.name == scheme]
    if not eps:
        dist = providers(SCHEME_GROUP).get(scheme)
        raise PolicyError(
            f"--policy {spec!r}: no installed package connects to {scheme}:// policy servers",
            hint=f"pip install {dist}" if dist else "--policy takes package.module:factory, a policy "
            "name, or the URL of a policy server (ws://HOST:PORT)",
        )
    try:
        factory = eps[0].load()
    except (ImportError, AttributeError) as exc:
        raise PolicyError(f"--policy {spec!r}: the {scheme}:// client does not load: {exc}") from exc
    try:
        policy = factory(spec, **dict(args or {}))
    except PolicyError:
        raise
    except (TypeError, ValueError) as exc:
        raise PolicyError(f"--policy {spec!r}: {exc}") from exc
    if not is_batched(policy):
        raise PolicyError(f"--policy {spec!r}: the {scheme}:// client returned no batched policy")
    return policy
