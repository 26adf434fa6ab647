"""Test helpers of genmanip-testbed: a plain ``http.client`` wrapper and decoders written from the reference facts.

The conformance tests deliberately avoid the eval client and the codec's untagging: they read the
pickles with the allow-list unpickler only and decode the tagged values themselves, as the facts
describe them.
"""

from __future__ import annotations

import base64
import http.client
import json
import pickle
import time
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import simplejpeg
from genmanip_protocol.codec import safe_loads

OCTET = "application/octet-stream"


class Raw:
    """One keep-alive connection; returns (status, headers, body bytes)."""

    def __init__(self, url: str, token: str | None = None) -> None:
        u = urlsplit(url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.token = token
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=30)

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        ctype: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        h = dict(headers or {})
        if ctype:
            h["Content-Type"] = ctype
        if self.token:
            h.setdefault("Authorization", f"Bearer {self.token}")
        try:
            self.conn.request(method, path, body=body, headers=h)
            r = self.conn.getresponse()
            data = r.read()
        except (ConnectionError, http.client.HTTPException):
            self.conn.close()
            raise
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data

    def pickle_post(self, path: str, obj: Any) -> tuple[int, Any]:
        st, _, data = self.request(
            "POST", path, pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), ctype=OCTET
        )
        if st == 200:
            return st, safe_loads(data)
        return st, _body(data)

    def json_post(self, path: str, obj: Any) -> tuple[int, Any]:
        st, _, data = self.request("POST", path, json.dumps(obj).encode(), ctype="application/json")
        return st, _body(data)

    def get_json(self, path: str) -> tuple[int, Any]:
        st, _, data = self.request("GET", path)
        return st, _body(data)

    def close(self) -> None:
        self.conn.close()


def _body(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return data.decode("utf-8", "replace")


def untag(v: Any) -> Any:
    """Decode the tagged values of facts §7.3 (numpy_array, jpeg_bytes) recursively."""
    if isinstance(v, dict):
        t = v.get("type")
        if t == "numpy_array":
            arr = np.frombuffer(base64.b64decode(v["data"]), dtype=np.dtype(v["dtype"]))
            return arr.reshape(v["shape"])
        if t == "jpeg_bytes":
            img = simplejpeg.decode_jpeg(v["data"], colorspace="RGB")
            assert list(img.shape) == list(v["shape"])
            return img
        return {k: untag(x) for k, x in v.items()}
    if isinstance(v, list):
        return [untag(x) for x in v]
    return v


def poll_reset(
    raw: Raw, wids: list[str], path: str = "", deadline_s: float = 20.0
) -> dict[str, Any]:
    """POST /reset_result until no listed worker is pending; returns the decoded entries."""
    out: dict[str, Any] = {}
    pending = list(wids)
    end = time.monotonic() + deadline_s
    while pending:
        st, resp = raw.pickle_post(f"{path}/reset_result", {"worker_ids": sorted(pending)})
        assert st == 200, resp
        for wid in list(pending):
            e = resp[wid]
            if not e.get("reset_pending"):
                out[wid] = e
                pending.remove(wid)
        assert time.monotonic() < end, "reset never finished"
        if pending:
            time.sleep(0.01)
    return out
