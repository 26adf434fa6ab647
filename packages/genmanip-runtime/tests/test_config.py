from __future__ import annotations

import logging
import pickle
from pathlib import Path

import pytest
from genmanip_protocol.errors import ConfigError, ExitCode
from genmanip_runtime.config import (
    Secret,
    config_path,
    load_config,
    resolve_secret,
    resolve_setting,
    resolve_token,
)

TOKEN = "tok-abc123-SECRET"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("GMP_CONFIG", "XDG_CONFIG_HOME", "GMP_TEST_TOKEN", "GMP_TEST_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def write_cfg(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    p = tmp_path / "cfg.toml"
    p.write_text(text, encoding="utf-8")
    p.chmod(mode)
    return p


def test_config_path_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert config_path() == tmp_path / "home" / ".config" / "genmanip" / "config.toml"
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/dir")  # invalid per XDG: ignored
    assert config_path() == tmp_path / "home" / ".config" / "genmanip" / "config.toml"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert config_path() == tmp_path / "xdg" / "genmanip" / "config.toml"
    monkeypatch.setenv("GMP_CONFIG", str(tmp_path / "explicit.toml"))
    assert config_path() == tmp_path / "explicit.toml"


def test_load_config_missing_is_empty_unless_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert load_config() == {}
    monkeypatch.setenv("GMP_CONFIG", str(tmp_path / "nope.toml"))
    with pytest.raises(ConfigError, match=r"nope\.toml does not exist"):
        load_config()


def test_load_config_parses(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    p = write_cfg(tmp_path, '[eval]\nurl = "http://127.0.0.1:8087"\n[leaderboard]\nport = 9000\n')
    monkeypatch.setenv("GMP_CONFIG", str(p))
    assert load_config() == {
        "eval": {"url": "http://127.0.0.1:8087"},
        "leaderboard": {"port": 9000},
    }


def test_malformed_toml_names_file_and_line(tmp_path: Path) -> None:
    p = write_cfg(tmp_path, '[eval]\nurl = "x"\ntoken = \n')
    with pytest.raises(ConfigError) as ei:
        load_config(p)
    assert str(p) in str(ei.value) and "line 3" in str(ei.value)
    assert ei.value.exit_code == ExitCode.USAGE
    p.write_bytes(b'[eval]\nurl = "\xff"\n')
    with pytest.raises(ConfigError, match="line 2: not valid UTF-8"):
        load_config(p)
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path)


def test_resolve_setting_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    p = write_cfg(tmp_path, '[eval]\nurl = "from-file"\n[a.b]\nk = 1\n')
    monkeypatch.setenv("GMP_CONFIG", str(p))
    assert resolve_setting(None, "GMP_TEST_URL", "eval", "url", "dflt") == "from-file"
    assert resolve_setting(None, "GMP_TEST_URL", "eval", "missing", "dflt") == "dflt"
    assert resolve_setting(None, "GMP_TEST_URL", "nosection", "url", "dflt") == "dflt"
    assert resolve_setting(None, None, "a.b", "k", 0) == 1
    monkeypatch.setenv("GMP_TEST_URL", "from-env")
    assert resolve_setting(None, "GMP_TEST_URL", "eval", "url", "dflt") == "from-env"
    assert resolve_setting("from-flag", "GMP_TEST_URL", "eval", "url", "dflt") == "from-flag"
    assert resolve_setting(0, "GMP_TEST_URL", "eval", "url", "dflt") == 0  # falsy flag still wins
    monkeypatch.setenv("GMP_TEST_URL", "")
    assert resolve_setting(None, "GMP_TEST_URL", "eval", "url", "dflt") == "from-file"
    assert (
        resolve_setting(None, None, "eval", "url", None, config={"eval": {"url": "given"}})
        == "given"
    )


def test_section_not_a_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GMP_CONFIG", str(write_cfg(tmp_path, "eval = 3\n")))
    with pytest.raises(ConfigError, match=r"\[eval\] must be a table"):
        resolve_setting(None, None, "eval", "url")


def test_resolve_token_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    p = write_cfg(tmp_path, f'[eval]\ntoken = " {TOKEN}-file "\n')
    monkeypatch.setenv("GMP_CONFIG", str(p))
    assert resolve_token(None, "GMP_TEST_TOKEN", "eval") == f"{TOKEN}-file"
    assert resolve_token(None, "GMP_TEST_TOKEN", "online") is None
    monkeypatch.setenv("GMP_TEST_TOKEN", f"{TOKEN}-env")
    assert resolve_token(None, "GMP_TEST_TOKEN", "eval") == f"{TOKEN}-env"
    assert resolve_token(f"{TOKEN}-flag", "GMP_TEST_TOKEN", "eval") == f"{TOKEN}-flag"
    assert resolve_token("   ", "GMP_TEST_TOKEN", "eval") == f"{TOKEN}-env"  # blank flag = unset
    assert resolve_token(Secret("s"), None, "eval") == "s"
    assert type(resolve_token(None, "GMP_TEST_TOKEN", "eval")) is str


def test_token_file(tmp_path: Path) -> None:
    tf = tmp_path / "tok"
    tf.write_text(TOKEN + "\n")
    tf.chmod(0o600)
    cfg = {"online": {"token_file": str(tf)}}
    assert resolve_token(None, None, "online", config=cfg) == TOKEN
    with pytest.raises(ConfigError) as ei:
        resolve_token(None, None, "online", config={"online": {"token_file": str(tmp_path / "x")}})
    assert "cannot read token_file" in str(ei.value)
    with pytest.raises(ConfigError) as ei:
        resolve_token(None, None, "online", config={"online": {"token": 12345}})
    assert "12345" not in str(ei.value)


def test_world_readable_token_warns_without_leaking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    p = write_cfg(tmp_path, f'[eval]\ntoken = "{TOKEN}"\n', mode=0o644)
    monkeypatch.setenv("GMP_CONFIG", str(p))
    with caplog.at_level(logging.WARNING, logger="genmanip_runtime.config"):
        assert resolve_token(None, None, "eval") == TOKEN
    assert "chmod 600" in caplog.text and TOKEN not in caplog.text


def test_errors_never_contain_the_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = write_cfg(tmp_path, f'[eval]\ntoken = "{TOKEN}"\nbroken = \n')
    monkeypatch.setenv("GMP_CONFIG", str(p))
    with pytest.raises(ConfigError) as ei:
        resolve_token(None, None, "eval")
    assert TOKEN not in str(ei.value)


def test_secret_hides_itself() -> None:
    s = Secret(TOKEN)
    assert str(s) == "***" and repr(s) == "Secret('***')" and f"{s}" == "***"
    assert f"Bearer {s}" == "Bearer ***"
    assert "{}".format(s) == "***"  # noqa: UP032
    assert s.reveal() == TOKEN
    assert s == Secret(TOKEN) and s != Secret("other") and bool(s) and not Secret("")
    assert TOKEN not in repr([s, {"t": s}])
    with pytest.raises(TypeError):
        pickle.dumps(s)
    with pytest.raises(TypeError):
        Secret(123)  # type: ignore[arg-type]
    r = resolve_secret(None, None, "eval", config={"eval": {"token": TOKEN}})
    assert isinstance(r, Secret) and r.reveal() == TOKEN
    assert resolve_secret(None, None, "eval", config={}) is None
