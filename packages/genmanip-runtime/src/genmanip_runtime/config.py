"""The gmp config file and the one precedence rule for settings and tokens.

Precedence, everywhere: command-line flag > environment variable > config file > default.

The file is TOML at ``$GMP_CONFIG``, else ``$XDG_CONFIG_HOME/genmanip/config.toml``, else
``~/.config/genmanip/config.toml``; one table per command family::

    [eval]
    url = "http://127.0.0.1:8087"
    token = "..."                 # or: token_file = "~/.secrets/genmanip-eval"

    [online]
    base_url = "https://..."
    token_file = "~/.secrets/genmanip-online"

    [leaderboard]
    host = "leaderboard.example.org"
    port = 8000

Tokens never appear in messages: every :class:`Secret` and every token :func:`resolve_token` finds
is registered with :mod:`genmanip_runtime.redact`, whose scrubbing every output path of gmp applies
(a server echoing a token back cannot get it printed). A config file holding a token that other
users can read gets a warning (like ssh). See ``docs/configuration.md``.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from genmanip_protocol.errors import ConfigError

from .redact import REDACTED, register_secret

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

__all__ = [
    "CONFIG_ENV",
    "Secret",
    "config_path",
    "load_config",
    "resolve_secret",
    "resolve_setting",
    "resolve_token",
]

log = logging.getLogger(__name__)

#: Environment variable naming the config file explicitly.
CONFIG_ENV = "GMP_CONFIG"

_warned_perms: set[str] = set()


class Secret:
    """A string that does not show itself: ``str()``, ``repr()`` and f-strings give ``'***'``.

    Call :meth:`reveal` at the one place the value is really needed (an ``Authorization`` header).
    Equality compares the hidden values; truthiness is the value's. Creating one registers the
    value with :func:`genmanip_runtime.redact.register_secret`, so printed text never shows it.
    """

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        if not isinstance(value, str):
            raise TypeError(f"Secret needs a str, got {type(value).__name__}")
        self._value = value
        register_secret(value)

    def reveal(self) -> str:
        """The real value."""
        return self._value

    def __str__(self) -> str:
        return REDACTED

    def __repr__(self) -> str:
        return f"Secret({REDACTED!r})"

    def __format__(self, spec: str) -> str:
        return REDACTED

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Secret):
            return self._value == other._value
        return NotImplemented

    def __hash__(self) -> int:
        return hash(("Secret", self._value))

    def __reduce__(self) -> Any:
        # Pickling a secret into a cache or a log record is a leak waiting to happen.
        raise TypeError("Secret values cannot be pickled")


def config_path() -> Path:
    """Where the config file is (it may not exist): ``$GMP_CONFIG``, else
    ``$XDG_CONFIG_HOME/genmanip/config.toml`` (when that is an absolute path), else
    ``~/.config/genmanip/config.toml``."""
    explicit = os.environ.get(CONFIG_ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CONFIG_HOME")
    # The XDG spec says relative values are invalid and must be ignored.
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".config"
    return base / "genmanip" / "config.toml"


_LINE = re.compile(r"\(at line (\d+), column (\d+)\)")


def load_config(path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Parse the config file; ``{}`` when it does not exist.

    Raises:
        ConfigError: malformed TOML (the message names the file and the line), an unreadable
            file, or ``$GMP_CONFIG`` naming a file that does not exist.
    """
    p = Path(path) if path is not None else config_path()
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        if path is None and os.environ.get(CONFIG_ENV):
            raise ConfigError(
                f"config file {p} does not exist (named by ${CONFIG_ENV})",
                hint=f"create it or unset {CONFIG_ENV}",
            ) from None
        return {}
    except IsADirectoryError:
        raise ConfigError(f"config file {p} is a directory") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {p}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(f"config file {p} line {line}: not valid UTF-8") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        m = _LINE.search(msg)
        where = f" line {m.group(1)}" if m else ""
        reason = _LINE.sub("", msg).strip()
        raise ConfigError(
            f"config file {p}{where}: invalid TOML: {reason}",
            hint="see docs/configuration.md for the format",
        ) from None
    return dict(data)


def _section(config: Mapping[str, Any], section: str | None, path_hint: str) -> Mapping[str, Any]:
    if not section:
        return config
    node: Any = config
    for part in section.split("."):
        if not isinstance(node, Mapping):
            return {}
        node = node.get(part)
        if node is None:
            return {}
    if not isinstance(node, Mapping):
        raise ConfigError(f"config file {path_hint}: [{section}] must be a table, got {node!r}")
    return node


def resolve_setting(
    flag_value: Any,
    env_var: str | None,
    section: str | None,
    key: str,
    default: Any = None,
    *,
    config: Mapping[str, Any] | None = None,
) -> Any:
    """The first of: ``flag_value`` (when not ``None``), ``$env_var`` (when set and non-empty, as
    a str), ``[section] key`` in the config file, ``default``.

    ``section`` may be dotted (``"online.staging"``) or ``None`` for a top-level key; ``config``
    overrides reading the file (tests, callers that already loaded it).
    """
    if flag_value is not None:
        return flag_value
    if env_var:
        env = os.environ.get(env_var)
        if env:
            return env
    cfg = load_config() if config is None else config
    value = _section(cfg, section, str(config_path())).get(key)
    return default if value is None else value


def _check_private(path: Path) -> None:
    try:
        mode = path.stat().st_mode
    except OSError:
        return
    if mode & (stat.S_IRWXG | stat.S_IRWXO) and str(path) not in _warned_perms:
        _warned_perms.add(str(path))
        log.warning(
            "%s holds a token and is readable by other users; run: chmod 600 %s", path, path
        )


def resolve_secret(
    flag_value: str | Secret | None,
    env_var: str | None,
    section: str | None,
    *,
    config: Mapping[str, Any] | None = None,
) -> Secret | None:
    """Like :func:`resolve_token` but wrapped in a :class:`Secret`."""
    tok = resolve_token(flag_value, env_var, section, config=config)
    return None if tok is None else Secret(tok)


def resolve_token(
    flag_value: str | Secret | None,
    env_var: str | None,
    section: str | None,
    *,
    config: Mapping[str, Any] | None = None,
) -> str | None:
    """The token from the flag, else ``$env_var``, else ``[section] token`` (or the file named by
    ``[section] token_file``) in the config file; ``None`` when there is none. Surrounding
    whitespace is stripped; an empty value counts as unset.

    Returns a plain ``str`` (so it can go straight into an ``Authorization`` header); use
    :func:`resolve_secret` to get a :class:`Secret` that cannot be printed by accident. Either way
    the token is registered (:func:`genmanip_runtime.redact.register_secret`): whatever a server
    echoes back, gmp's output scrubs it.

    Raises:
        ConfigError: the token in the config file is not a string, or ``token_file`` cannot be
            read. The message never contains the token.
    """
    token = _find_token(flag_value, env_var, section, config=config)
    register_secret(token)
    return token


def _find_token(
    flag_value: str | Secret | None,
    env_var: str | None,
    section: str | None,
    *,
    config: Mapping[str, Any] | None,
) -> str | None:
    if isinstance(flag_value, Secret):
        flag_value = flag_value.reveal()
    if flag_value is not None and flag_value.strip():
        return flag_value.strip()
    if env_var:
        env = os.environ.get(env_var, "").strip()
        if env:
            return env
    from_file = config is None
    cfg = load_config() if from_file else config
    where = str(config_path()) if from_file else "<config>"
    sec = _section(cfg or {}, section, where)
    label = f"[{section}]" if section else "top level"
    tok = sec.get("token")
    if tok is not None:
        if not isinstance(tok, str):
            raise ConfigError(f"config file {where}: {label} token must be a string")
        if tok.strip():
            if from_file:
                _check_private(config_path())
            return tok.strip()
    tfile = sec.get("token_file")
    if tfile is not None:
        if not isinstance(tfile, str) or not tfile:
            raise ConfigError(f"config file {where}: {label} token_file must be a path string")
        tpath = Path(tfile).expanduser()
        try:
            value = tpath.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(
                f"cannot read token_file {tpath} (from {label} in {where}): "
                f"{exc.strerror or type(exc).__name__}"
            ) from None
        except UnicodeDecodeError:
            raise ConfigError(f"token_file {tpath} is not UTF-8 text") from None
        if value:
            _check_private(tpath)
            return value
    return None
