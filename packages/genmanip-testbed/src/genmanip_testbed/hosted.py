"""Emulations of the hosted services (facts §10, §11) on the testbed's own port.

* Online evaluation service: ``POST /api/v1/benchmark/onlineEvaluation/createTask`` and ``.../ready``
  (``{code, msg, data}`` envelope, Bearer token), then an eval endpoint
  ``<base>/online/<task_id>`` that serves the evaluation routes with the task id as the run id, and
  ``<endpoint>/stop?run_id=``.
* Leaderboard: ``POST /api/upload`` (multipart: ``file``, ``submission_name``, ``leaderboard_name``,
  ``author_token``, ``submission_infos``) and ``GET /upload_status/<id>``. Zips are checked by
  the one zip verifier (:func:`genmanip_leaderboard.bundle.verify_zip`: unsafe member names,
  symlink or directory members, encryption, unknown methods, zip bombs, corrupt data); refused
  zips, oversize uploads and bad tokens get ``{"error": ...}`` and a 4xx status.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import threading
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from genmanip_leaderboard.bundle import verify_zip
from genmanip_leaderboard.errors import (
    BundleMemberNameError,
    BundleTooLargeError,
    BundleVerifyError,
)
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Message

from .core import EvalCore
from .tasks import resolve_configs

if TYPE_CHECKING:
    from .server import LocalServer

__all__ = ["ONLINE_PREFIX", "HostedServices"]

ONLINE_PREFIX = "/api/v1/benchmark/onlineEvaluation"
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_CODE_BAD_REQUEST = 40001
_CODE_UNKNOWN_TASK = 40004
_CODE_RUN_MISMATCH = 40009


def _env(data: Any = None, code: int = 0, msg: str = "success", status: int = 200) -> JSONResponse:
    return JSONResponse({"code": code, "msg": msg, "data": data}, status_code=status)


class _TooLarge(Exception):
    pass


#: An accepted zip may expand to at most this many times the upload limit (a zip bomb is
#: refused from its declared sizes before anything is decompressed).
_MAX_UNZIPPED_RATIO = 64


class _OnlineTask:
    def __init__(self, task_id: str, fields: dict[str, Any], configs: list[str]) -> None:
        self.task_id = task_id
        self.fields = fields
        self.configs = configs
        self.polls = 0
        self.core: EvalCore | None = None
        self.stopped = False
        self.created = time.time()


class HostedServices:
    """State and routes of the online-service and leaderboard emulations of one testbed."""

    def __init__(self, server: LocalServer) -> None:
        self.server = server
        self._lock = threading.Lock()
        self._tasks: dict[str, _OnlineTask] = {}
        self._subs: dict[str, dict[str, Any]] = {}

    # ============================================================================ online ====
    def online_core(self, task_id: str) -> EvalCore | None:
        with self._lock:
            t = self._tasks.get(task_id)
            return t.core if t is not None else None

    async def _json(self, request: Request) -> Any:
        try:
            data = json.loads(await request.body() or b"{}")
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None
        return data if isinstance(data, dict) else None

    async def create_task(self, request: Request) -> Response:
        body = await self._json(request)
        if body is None:
            return _env(None, _CODE_BAD_REQUEST, "request body must be a JSON object")
        task_id = body.get("task_id")
        with self._lock:
            if task_id is not None and str(task_id) in self._tasks:
                return _env({"task_id": str(task_id), "status": "queued"})
        if task_id is None and not body.get("model_name"):
            return _env(None, _CODE_BAD_REQUEST, "missing field: model_name")
        if task_id is not None and not _SAFE_ID.match(str(task_id)):
            return _env(
                None, _CODE_BAD_REQUEST, "task_id must be 1-128 characters of [A-Za-z0-9_.-]"
            )
        bench = body.get("benchmark_set")
        configs = list(self.server.options.tasks)
        if bench:
            try:
                resolve_configs([str(bench)])
            except (ValueError, AssertionError):
                return _env(None, _CODE_BAD_REQUEST, f"unknown benchmark_set {bench!r}")
            configs = [str(bench)]
        tid = str(task_id) if task_id is not None else uuid.uuid4().hex[:16]
        fields: dict[str, Any] = {
            k: body.get(k)
            for k in (
                "model_name",
                "model_type",
                "benchmark_set",
                "submitter_name",
                "submitter_homepage",
                "is_public",
            )
            if k in body
        }
        with self._lock:
            self._tasks.setdefault(tid, _OnlineTask(tid, fields, configs))
        return _env({"task_id": tid, "status": "queued"})

    async def ready(self, request: Request) -> Response:
        body = await self._json(request)
        if body is None:
            return _env(None, _CODE_BAD_REQUEST, "request body must be a JSON object")
        tid = body.get("task_id")
        if not tid:
            return _env(None, _CODE_BAD_REQUEST, "missing field: task_id")
        with self._lock:
            t = self._tasks.get(str(tid))
        if t is None:
            return _env(None, _CODE_UNKNOWN_TASK, f"unknown task_id {tid!r}")
        t.polls += 1
        wait = self.server.options.online_ready_after
        if t.polls <= wait:
            left = wait - t.polls + 1
            return _env(
                {
                    "task_id": t.task_id,
                    "ready": False,
                    "status": "queued",
                    "queue_position": left,
                    "eta_seconds": 5 * left,
                }
            )
        if t.core is None:
            opts = self.server.options
            core = EvalCore(opts.core_config(), stats=self.server.stats, faults=self.server.faults)
            core.start_new_job(t.configs, t.task_id)
            with self._lock:
                t.core = core
        base = str(request.base_url).rstrip("/")
        return _env(
            {
                "task_id": t.task_id,
                "ready": True,
                "status": "running",
                "endpoint": f"{base}/online/{t.task_id}",
            }
        )

    async def stop(self, request: Request) -> Response:
        tid = request.path_params["task_id"]
        with self._lock:
            t = self._tasks.get(tid)
        if t is None:
            return JSONResponse({"detail": f"Unknown online task {tid!r}"}, status_code=404)
        run_id = request.query_params.get("run_id")
        if run_id is not None and run_id != tid:
            return _env(None, _CODE_RUN_MISMATCH, f"run_id {run_id!r} does not match task {tid!r}")
        if t.core is not None:
            t.core.kill(list(t.core.workers))
        t.stopped = True
        return _env({"task_id": tid, "run_id": tid, "stopped": True}, msg="stopped")

    # ======================================================================= leaderboard ====
    def _lb_dir(self) -> Path:
        d = self.server.options.data_dir
        assert d is not None
        return Path(d) / "leaderboard"

    async def upload(self, request: Request) -> Response:
        limit = self.server.options.max_upload_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await _drain(request.receive)
            return JSONResponse(
                {"error": f"upload too large: {declared} bytes exceeds the limit of {limit} bytes"},
                status_code=413,
            )
        received = 0
        original = request.receive

        async def limited() -> Message:
            nonlocal received
            msg = await original()
            if msg.get("type") == "http.request":
                received += len(msg.get("body", b""))
                if received > limit:
                    raise _TooLarge
            return msg

        req = Request(request.scope, limited)
        try:
            form = await req.form(max_files=1, max_fields=16)
        except _TooLarge:
            await _drain(original)
            return JSONResponse(
                {"error": f"upload too large: exceeds the limit of {limit} bytes"}, status_code=413
            )
        except Exception as e:
            return JSONResponse(
                {"error": f"malformed multipart body: {type(e).__name__}"}, status_code=400
            )
        try:
            return await self._accept(form)
        finally:
            await form.close()

    async def _accept(self, form: Any) -> Response:
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            return JSONResponse({"error": "missing file part 'file'"}, status_code=400)
        fields = {}
        for name in ("submission_name", "leaderboard_name", "author_token"):
            v = form.get(name)
            if not isinstance(v, str) or not v.strip():
                return JSONResponse({"error": f"missing field: {name}"}, status_code=400)
            fields[name] = v.strip()
        expected = self.server.options.leaderboard_token
        if expected is not None and not hmac.compare_digest(
            fields["author_token"].encode(), expected.encode()
        ):
            return JSONResponse({"error": "invalid author_token"}, status_code=401)
        infos_raw = form.get("submission_infos")
        infos: Any = None
        if isinstance(infos_raw, str) and infos_raw.strip():
            try:
                infos = json.loads(infos_raw)
            except json.JSONDecodeError:
                return JSONResponse(
                    {"error": "submission_infos must be a JSON string"}, status_code=400
                )
        upload.file.seek(0)
        # The one zip verifier (the leaderboard client's, minus the manifest a gmp bundle has):
        # names, kinds, methods, encryption and declared sizes before a byte is decompressed,
        # then every member's CRC, reading at most what each declares; typed errors only.
        limit = self.server.options.max_upload_bytes * _MAX_UNZIPPED_RATIO
        try:
            members = await run_in_threadpool(verify_zip, upload.file, max_bytes=limit, name="zip")
        except BundleMemberNameError as e:
            return JSONResponse(
                {"error": f"unsafe member path in zip: {e.member!r}: {e.problem}"}, status_code=400
            )
        except BundleTooLargeError as e:
            return JSONResponse({"error": f"zip too large: {e}"}, status_code=413)
        except BundleVerifyError as e:
            return JSONResponse({"error": f"invalid zip: {e}"}, status_code=400)
        sid = uuid.uuid4().hex[:12]
        dest = self._lb_dir() / sid
        dest.mkdir(parents=True, exist_ok=True)
        upload.file.seek(0)
        h = hashlib.sha256()
        size = 0
        with open(dest / "bundle.zip", "wb") as out:
            while chunk := upload.file.read(1 << 20):
                h.update(chunk)
                size += len(chunk)
                out.write(chunk)
        record = {
            "submission_id": sid,
            "submission_name": fields["submission_name"],
            "leaderboard_name": fields["leaderboard_name"],
            "submission_infos": infos,
            "filename": Path(upload.filename or "bundle.zip").name,
            "size": size,
            "sha256": h.hexdigest(),
            "members": len(members),
            "created": datetime.now(timezone.utc).isoformat(),
            "status": "processing",
            "polls": 0,
        }
        (dest / "submission.json").write_text(json.dumps(record, indent=2), encoding="utf-8")
        with self._lock:
            self._subs[sid] = record
        return JSONResponse({"status": "success", "submission_id": sid})

    async def upload_status(self, request: Request) -> Response:
        sid = request.path_params["sid"]
        with self._lock:
            rec = self._subs.get(sid)
            if rec is None:
                return JSONResponse({"error": f"unknown submission id {sid!r}"}, status_code=404)
            rec["polls"] += 1
            if rec["polls"] > 1:
                rec["status"] = "completed"
            out = {k: v for k, v in rec.items() if k != "polls"}
        return JSONResponse(out)

    # ============================================================================ wiring ====
    def routes(self) -> list[Any]:
        """Top-level routes of both emulations."""
        return [
            Route(f"{ONLINE_PREFIX}/createTask", self.create_task, methods=["POST"]),
            Route(f"{ONLINE_PREFIX}/ready", self.ready, methods=["POST"]),
            Route("/api/upload", self.upload, methods=["POST"]),
            Route("/upload_status/{sid}", self.upload_status, methods=["GET"]),
        ]

    def online_routes(self) -> list[Any]:
        """Routes added under ``/online/<task_id>`` next to the eval routes."""
        return [Route("/stop", self.stop, methods=["GET", "POST"])]

    def submissions_dir(self) -> Path:
        """Where accepted bundles are stored (``<data_dir>/leaderboard/<id>/bundle.zip``)."""
        return self._lb_dir()

    def close(self) -> None:
        with self._lock:
            cores = [t.core for t in self._tasks.values() if t.core is not None]
        for c in cores:
            c.close()


#: Bytes of a refused upload still read (and discarded) before answering 413: a client that
#: sends its whole body before reading the reply then sees the 413, not a reset connection.
_DRAIN_BUDGET = 8 * 1024 * 1024


async def _drain(receive: Any, budget: int = _DRAIN_BUDGET) -> None:
    while budget > 0:
        msg = await receive()
        if msg.get("type") != "http.request":
            return
        budget -= len(msg.get("body", b""))
        if not msg.get("more_body", False):
            return
