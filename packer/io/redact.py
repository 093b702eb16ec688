"""Credentials out of what packer prints, raises or writes: a URI's userinfo and secret query values as ***.

    redact("s3://AKIA:SECRET@bucket/ds?region=x")           -> "s3://***@bucket/ds?region=x"
    redact("abfs://acct.dfs.core.windows.net/c?sig=S&sv=1") -> "abfs://acct.dfs.core.windows.net/c?sig=***&sv=1"

Its own module so that every io module (retry, fs, ...) can redact without importing fs.
"""

from __future__ import annotations

import os
import re

# Query parameters whose value is a credential. pyarrow's from_uri takes credentials only as
# userinfo for s3 (ACCESS:SECRET@), as client_secret or a SAS token (its secret part: sig) for
# abfs, and passes any unknown hdfs parameter on as Hadoop configuration (fs.s3a.secret.key,
# ...password, ...token); gs takes none. fsspec URLs may carry tokens too: match by name.
_SECRET_PARAM = re.compile(r"secret|passw|token|key|credential|^sig$|signature", re.IGNORECASE)
_URI_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]*[^\s'\"<>),.;:\]]")  # not its closing ")" or ","


def redact(loc) -> str:
    """`loc` as text with its credentials replaced by ***: userinfo (user:password@; a bare
    name@ is kept only on abfs/abfss, where it names the container) and the values of
    secret-bearing query parameters. Plain paths, and URIs without secrets, come back unchanged."""
    text = loc.uri if hasattr(loc, "uri") else os.fspath(loc) if not isinstance(loc, str) else loc
    if "://" not in text:
        return text
    scheme, rest = text.split("://", 1)
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:cut], rest[cut:]
    if "@" in authority:
        userinfo, host = authority.rsplit("@", 1)
        if ":" in userinfo or scheme.lower() not in ("abfs", "abfss"):
            authority = f"***@{host}"
    path, sep, query = tail.partition("?")
    if sep:
        query, hash_, fragment = query.partition("#")
        params = [p.split("=", 1) for p in query.split("&")]
        query = "&".join(
            f"{kv[0]}=***" if len(kv) == 2 and _SECRET_PARAM.search(kv[0]) else "=".join(kv) for kv in params
        ) + hash_ + fragment
    return f"{scheme}://{authority}{path}{sep}{query}"


def redact_text(text: str) -> str:
    """Every URI in a message (an error, a warning) redacted; the rest of the text as is."""
    return _URI_IN_TEXT.sub(lambda m: redact(m.group(0)), str(text))


def redact_json(obj):
    """A JSON value with `redact_text` applied to every string in it (keys too)."""
    if isinstance(obj, str):
        return redact_text(obj) if "://" in obj else obj
    if isinstance(obj, dict):
        return {redact_json(k): redact_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact_json(v) for v in obj]
    return obj
