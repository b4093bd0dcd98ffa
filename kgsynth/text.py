"""Text at the boundary: what comes in is made encodable, what goes out carries no secrets.

- :func:`clean_text` makes text from outside (model replies, SPARQL results, tool-call
  arguments, command-line text) safe to write: a lone UTF-16 surrogate — what ``json.loads``
  makes of a ``"\\ud83c"`` escape without its pair, or what Python makes of a non-UTF-8 byte
  in ``sys.argv`` — cannot be encoded as UTF-8, so Arrow, Parquet, SQLite and the terminal all
  fail on it. Surrogates are the only code points a Python ``str`` can hold that UTF-8 cannot
  encode; each lone one becomes U+FFFD, and a split pair is joined into its character.
- :func:`redact_argv` and :func:`redact_text` keep API keys, tokens and ``Authorization``
  headers out of manifests, logs and error messages; :class:`RedactingFilter` applies the
  latter to every log record.
"""

from __future__ import annotations

import logging
import re
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
)


def is_secret_option(arg: str) -> bool:
    """True for a command-line option that takes a secret (``--api-key``, ``--hf-token``)."""
    return bool(_SECRET_OPTION.match(arg.partition("=")[0]))


def redact_text(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with ``secrets`` (values known to be secret, e.g. the API key in use) and
    anything shaped like a key, a token or an ``Authorization`` header replaced by ``***``."""
    for secret in secrets:
        if secret and len(secret) >= 4:  # a one-letter "key" would blank out the text
            text = text.replace(secret, REDACTED)
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
