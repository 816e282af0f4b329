"""Where the results database is: the one parser of `--db` values (a SQLAlchemy URL or a bare SQLite
file path), how long SQLite waits for a lock, and the one redaction of passwords in URLs (every message
rpg prints goes through `redact`). Standard library only."""

from __future__ import annotations

import re
import urllib.parse

from rpg_cli.rundir import STORE_FILE

DEFAULT_DB_URL = f"sqlite:///runs/{STORE_FILE}"
# where `--db` is read from when not given: a team's PostgreSQL URL (and its password) set once, out of `ps`
DB_ENVVAR = "RPG_DB"
SQLITE_BUSY_TIMEOUT_S = 60.0


# how a StoreError whose fix is to retry ends (a full disk): a caller with a better retry says it instead
RUN_AGAIN = "run the same command again (what was recorded is kept)"


class StoreError(RuntimeError):
    """A store problem the user can fix (missing database, unsupported URL); one-line message."""


class NoStoreError(StoreError):
    """No results database where one is read: nothing recorded there yet."""


class EmptyStoreError(NoStoreError):
    """A database without rpg's tables where one is read (a 0-byte file, a new PostgreSQL database)."""


def display_url(db_url: str) -> str:
    """The URL for a message: its password hidden (`redact`)."""
    return redact(db_url)


def normalize_url(db: str) -> str:
    """Accept a SQLAlchemy URL, or a bare file path meaning a SQLite database there."""
    return db if "://" in db else f"sqlite:///{db}"


def sqlite_path(db_url: str) -> str | None:
    """The file of a SQLite URL or bare path ('' for an in-memory database); None when it is not SQLite."""
    scheme, sep, rest = normalize_url(db_url).partition("://")
    if not sep or scheme.split("+")[0] != "sqlite":
        return None
    path = rest[1:] if rest.startswith("/") else rest  # sqlite:///rel -> 'rel', sqlite:////abs -> '/abs'
    path = path.split("?", 1)[0]
    return "" if path in ("", ":memory:") else path


# scheme://user:PASSWORD@host: the password runs to the last "@" before a blank or a quote, so one
# holding "@", ":" or "/" unencoded is hidden whole (hiding a little too much is the safe side)
_PASSWORD_IN_URL = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@'\"<>]*:)[^\s'\"<>]*(@)")
# a parameter: ?name=..., &name=..., libpq's "name=...", an env line's NAME=...: its value runs to the next & ; blank
# or quote
_PARAM = re.compile(r"((?:^|[?&;\s'\"(,])([^=&;\s'\"<>?(,]+)=)([^&;\s'\"<>]*)")
# names whose value is a secret (judged percent-decoded): ...password, ...passwd, ...pass (sslpassword, DB_PASS),
# ...pwd (ODBC, MYSQL_PWD), ...secret, ...token, api/access/secret/private keys
_SECRET_NAME = re.compile(r"(?i)(?:pass(?:word|wd)?|pwd|secret|token|(?:api|access|secret|private)[_-]?key)\Z")


def redact(text: str) -> str:
    """`text` with every password in it replaced by ***: a URL's user:***@host, its ?password=*** and
    &password=*** (any ...password=, ...passwd=, ...pwd=, ...secret=, ...token= or api key parameter), a libpq
    `password=***`, an env line's DB_PASS=***. A parameter's name is judged percent-decoded, as a server reads
    it (`?%70assword=` is `?password=`; `%2570` decodes to it twice). Every message rpg prints that may hold a
    database URL goes through here."""

    def decoded(name: str) -> str:
        for _ in range(4):  # a few rounds: a double-encoded name is still a name someone decodes
            plain = urllib.parse.unquote(name)
            if plain == name:
                break
            name = plain
        return name

    def hide(match: re.Match) -> str:
        if _SECRET_NAME.search(decoded(match.group(2))):
            return match.group(1) + "***"
        return match.group(1) + _PARAM.sub(hide, match.group(3))  # a value may hold a URL with its own parameters

    return _PARAM.sub(hide, _PASSWORD_IN_URL.sub(r"\1***\2", text))
