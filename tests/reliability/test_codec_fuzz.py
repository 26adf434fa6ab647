"""Item 7 (fast subset): fuzzed and malicious payloads against every decoder, in a child process.

The full run (>= 100,000 payloads) is ``python bench/reliability/fuzz_codecs.py``.
"""

from __future__ import annotations

import fuzz_codecs
import pytest


@pytest.mark.slow
def test_fuzz_codecs_typed_errors_bounded_memory_no_execution() -> None:
    res = fuzz_codecs.run(n=5000, seed=7, timeout=240)
    assert res["payloads"] == 5000
    assert res["failures"] == 0, res["failure_samples"]
    # every malicious pickle was refused and nothing it asked for happened
    assert res["malicious"] >= 150
    assert res["malicious_refused_unsafe"] >= res["malicious"] - 5
    assert res["sentinels_created"] == [] and res["sentinels_seen_by_parent"] == []
    assert res["rss_growth_mb"] <= fuzz_codecs.RSS_BOUND_MB
    assert res["slowest_s"] < fuzz_codecs.HANG_S
    # the generators reach every decoder on both sides of validity
    for name in ("safe_loads", "LegacyCodec.decode", "MsgpackCodec.decode", "decode_jpeg"):
        assert res["outcomes"].get(f"{name}: ok", 0) > 0
        assert res["outcomes"].get(f"{name}: DecodeError", 0) > 0


def test_malicious_corpus_is_refused_by_name(tmp_path) -> None:
    """Each malicious pickle reaches find_class and is refused naming the global; no sentinel."""
    from genmanip_protocol.codec import safe_loads
    from genmanip_protocol.errors import DecodeError, UnsafePayloadError

    corpus = fuzz_codecs.malicious_pickles(tmp_path)
    unsafe = 0
    for label, payload in corpus:
        with pytest.raises(DecodeError) as ei:
            safe_loads(payload)
        if isinstance(ei.value, UnsafePayloadError):
            unsafe += 1
            assert ei.value.global_name, label
    assert unsafe >= len(corpus) - 5
    assert list(tmp_path.iterdir()) == []


def test_png_decompression_bomb_in_image_tag_is_refused_before_decoding() -> None:
    """Regression (found by this suite): a ~400 KB 'image' value declaring 12000x12000 RGB made the
    legacy decoder allocate 430 MB; it is now refused from the PNG header."""
    import base64
    import pickle

    from genmanip_protocol.codec import LegacyCodec
    from genmanip_protocol.errors import DecodeError

    bomb = fuzz_codecs._png_bomb(12000, rgb=True)
    body = pickle.dumps({"type": "image", "data": base64.b64encode(bomb).decode()})
    with pytest.raises(DecodeError, match="exceeds the limit"):
        LegacyCodec().decode(body)
