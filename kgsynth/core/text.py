"""Text at the boundary: what comes in is made encodable, what goes out carries no secrets.

- :func:`clean_text` makes text from outside (model replies, SPARQL results, tool-call
  arguments, command-line text) safe to write: a lone UTF-16 surrogate — what ``json.loads``
  makes of a ``"\\ud83c"`` escape without its pair, or what Python makes of a non-UTF-8 byte
  in ``sys.argv`` — cannot be encoded as UTF-8, so Arrow, Parquet, SQLite and the terminal all
  fail on it. Surrogates are the only code points a Python ``str`` can hold that UTF-8 cannot
  encode; each lone one becomes U+FFFD, and a split pair is joined into its character.
- :func:`redact_argv` and :func:`redact_text` keep API keys, tokens, ``Authorization``
  headers and the credentials of a URL (its password, and the values of its query parameters
  named like a secret: ``?key=``, ``&api_key=``, ``&sig=`` …) out of manifests, logs and error
  messages; :class:`RedactingFilter` applies the latter to every log record.
- :func:`url_secrets` and :func:`redact_known` hide the credentials one client was given (its
  API key, its URL's) in text it stores that came from elsewhere, such as a model reply that
  echoes them, without touching anything else in that text.
"""

from __future__ import annotations

import logging
import re
import urllib.parse
from collections.abc import Iterable, Sequence

REPLACEMENT = "\ufffd"
REDACTED = "***"


def clean_text(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD (a surrogate pair written as two
    code points becomes the character it encodes); other text is returned as it is."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # UTF-16 keeps a pair's two halves adjacent, so decoding joins pairs and replaces
        # only the halves without a partner
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


def clean_optional(text: str | None) -> str | None:
    """:func:`clean_text` that passes None through."""
    return None if text is None else clean_text(text)


# --- secrets ---------------------------------------------------------------------------------

# URL query parameters whose value is a secret: key, api_key, apikey, x-api-key, token,
# access_token, hf_token, secret, client_secret, password, sig, signature (X-Amz-Signature), auth
_SECRET_PARAM = (
    r"(?:[\w.-]*[_.-])?(?:key|apikey|token|secret|password|passwd|pwd|sig|signature|auth)"
)
# option names whose value is a secret: --api-key, --hf-key, --token, --hf-token, --password…
_SECRET_OPTION = re.compile(r"^--(?:[\w-]*-)?key$|^--[\w-]*token$|^--[\w-]*(?:secret|password)$")
_SECRET_PATTERNS = (
    # an Authorization header in any spelling: "Authorization: Bearer x", 'authorization': 'x'
    re.compile(
        r"(?i)(\bauthorization[\"']?\s*[:=]\s*[\"']?)(?:(?:bearer|basic|token)\s+)?[^\s\"',}]+"
    ),
    re.compile(r"(?i)(\bbearer\s+)[^\s\"',}]+"),
    # key=value / "api_key": "value" forms
    re.compile(
        r"(?i)(\b(?:api[_-]?key|access[_-]?token|auth[_-]?token|token|secret|password)"
        r"[\"']?\s*[:=]\s*[\"']?)[^\s\"',}&]+"
    ),
    # keys by their shape: OpenAI (sk-…), Hugging Face (hf_…)
    re.compile(r"()\b(?:sk-[A-Za-z0-9_-]{6,}|hf_[A-Za-z0-9]{10,})"),
    # credentials in a URL: scheme://user:password@host
    re.compile(r"(\b[a-z][a-z0-9+.-]*://[^/\s:@]+:)[^/\s@]+(?=@)"),
    # a URL's query parameter named like a secret: …/v1?key=X, …&X-Amz-Signature=X; the
    # punctuation that ends a sentence or a bracket after a URL (…?key=X: …, (…?key=X)) is
    # part of the value only where more of the value follows it
    re.compile(
        rf"(?i)([?&;]{_SECRET_PARAM}=)"
        r"(?:[^&;#\s\"'<>(),:.!]|[(),:.!](?=[^&;#\s\"'<>(),:.!]))+"
    ),
)


def is_secret_option(arg: str) -> bool:
    """True for a command-line option that takes a secret (``--api-key``, ``--hf-token``)."""
    return bool(_SECRET_OPTION.match(arg.partition("=")[0]))


def url_secrets(url: str | None) -> list[str]:
    """The credentials written into ``url``: the password of its ``user:password@`` and the
    values of its query parameters named like a secret (``?key=``, ``&token=``), each as
    written and decoded, so that a server echoing either form is caught."""
    if not url:
        return []
    try:
        parts = urllib.parse.urlsplit(url)
        password = parts.password
    except ValueError:  # not a URL (an unclosed IPv6 bracket, a bad port)
        return []
    found = [password, urllib.parse.unquote(password)] if password else []
    for chunk in re.split(r"[&;]", parts.query):
        name, eq, value = chunk.partition("=")
        if eq and value and re.fullmatch(_SECRET_PARAM, urllib.parse.unquote_plus(name), re.I):
            found += [value, urllib.parse.unquote_plus(value)]
    return list(dict.fromkeys(found))


def redact_known(text: str, secrets: Iterable[str | None], min_length: int = 4) -> str:
    """``text`` with each of ``secrets`` (values known to be secret, e.g. the API key in use)
    replaced by ``***``, and nothing else changed: what :func:`redact_text` does first, and
    all that may be done to a model's reply (its other text is data, however key-like).
    Values shorter than ``min_length`` are left alone: a one-letter "key" would blank out
    the text."""
    for secret in sorted({s for s in secrets if s and len(s) >= min_length}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


def redact_text(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with ``secrets`` (values known to be secret, e.g. the API key in use) and
    anything shaped like a key, a token, an ``Authorization`` header or a URL's credentials
    replaced by ``***``."""
    text = redact_known(text, secrets)
    for pattern in _SECRET_PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + REDACTED, text)
    return text


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A command line with the values of secret options (``--api-key X``, ``--api-key=X``,
    any ``--*-key`` or ``--*token``) replaced by ``***``, and secret-shaped text redacted."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
        elif arg.startswith("--") and is_secret_option(arg):
            name, eq, _ = arg.partition("=")
            if eq:
                out.append(f"{name}={REDACTED}")
            else:
                out.append(arg)
                hide_next = True
        else:
            out.append(redact_text(arg))
    return out


class RedactingFilter(logging.Filter):
    """Redacts secrets (see :func:`redact_text`) in every record that passes; attach it to a
    handler so that records of every library logger are covered."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # a malformed record: let logging report it
            return True
        redacted = redact_text(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True
