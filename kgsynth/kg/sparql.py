"""The one place where outside text enters a SPARQL query.

Every literal or IRI built from text that kgsynth did not write itself (entity names from a
model or a file, relation names, IRIs read back from a KG) goes through :func:`literal` or
:func:`iri`. Nothing else concatenates raw text into a query. :func:`kgsynth.kg.guard.ensure_read_only` is the
guard every query passes before a backend runs it (:mod:`kgsynth.kg.guard`): one
SELECT/ASK/CONSTRUCT/DESCRIBE query without SERVICE, sent in the canonical form it was checked in.
"""

from __future__ import annotations

import re
import unicodedata

# ECHAR escapes of the SPARQL 1.1 grammar (production [160]).
_ECHAR = {
    "\\": "\\\\",
    '"': '\\"',
    "'": "\\'",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\b": "\\b",
    "\f": "\\f",
}
_ECHAR_RE = re.compile(r"[\\\"'\n\r\t\b\f]")
# Characters no KG name contains and no engine treats alike: other C0 controls, DEL, lone
# surrogates and non-characters. A name holding one cannot match, so it is never sent.
_UNSENDABLE_RE = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f\ud800-\udfff\ufffe\uffff]")
# Characters that may not appear inside an IRIREF (production [139]).
_BAD_IRI_RE = re.compile(r"[\x00-\x20<>\"{}|^`\\]")


def is_sendable(text: str) -> bool:
    """True when ``text`` can be written as a SPARQL string literal that every engine parses."""
    return _UNSENDABLE_RE.search(text) is None


def literal(text: str, lang: str | None = None) -> str:
    """A SPARQL string literal for ``text``, optionally language-tagged.

    Raises ``ValueError`` for text that cannot be sent (see :func:`is_sendable`); callers that
    take model or user text check :func:`is_sendable` first and answer "not found".
    """
    if not is_sendable(text):
        raise ValueError("text contains control characters or lone surrogates")
    body = _ECHAR_RE.sub(lambda m: _ECHAR[m.group(0)], text)
    if lang:
        if not re.fullmatch(r"[A-Za-z]+(-[A-Za-z0-9]+)*", lang):
            raise ValueError(f"invalid language tag {lang!r}")
        return f'"{body}"@{lang}'
    return f'"{body}"'


def iri(value: str) -> str:
    """An IRIREF ``<value>``; raises ``ValueError`` when ``value`` is not a valid IRI."""
    if not value or _BAD_IRI_RE.search(value) or ":" not in value:
        raise ValueError(f"not a valid absolute IRI: {value[:80]!r}")
    return f"<{value}>"


def normalize_name(text: str) -> str:
    """The key of the case-insensitive name index: NFKC, case-folded, whitespace collapsed."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())
