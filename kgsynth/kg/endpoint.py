"""Endpoint backend: any SPARQL 1.1 endpoint over HTTP, through SPARQLWrapper.

Virtuoso, QLever, Oxigraph server, Fuseki and GraphDB all answer the same read-only queries.
Each query has a timeout; connection errors, HTTP 429 and 5xx are retried a bounded number of
times with exponential backoff, after which :class:`KGUnavailableError` says the endpoint is
down. Engine quirks are absorbed here, not in callers:

- Virtuoso writes typed literals as ``"type": "typed-literal"`` in its JSON results;
- Virtuoso names blank nodes ``nodeID://…`` (kept as blank nodes);
- Virtuoso's ``ResultSetMaxRows`` setting silently truncates large results, so set it high in
  its ini for walks over big KGs (the test fixture does).
"""

from __future__ import annotations

import json
import logging
import socket
import time
import urllib.error
from typing import Any

from SPARQLWrapper import JSON, POST, URLENCODED, SPARQLWrapper
from SPARQLWrapper.SPARQLExceptions import SPARQLWrapperException

from kgsynth.errors import KGError, KGTimeoutError, KGUnavailableError, QueryRejectedError
from kgsynth.kg.base import KG, Row, Term
from kgsynth.kg.profiles import KGProfile

log = logging.getLogger(__name__)

_XSD_STRING = "http://www.w3.org/2001/XMLSchema#string"
_RDF_LANG_STRING = "http://www.w3.org/1999/02/22-rdf-syntax-ns#langString"


def binding_to_term(binding: dict[str, Any]) -> Term:
    """One SPARQL-JSON binding as a :class:`Term` (standard and Virtuoso forms)."""
    kind = binding.get("type")
    value = str(binding.get("value", ""))
    if kind == "uri":
        return Term("iri", value)
    if kind == "bnode":
        return Term("bnode", value)
    if kind in ("literal", "typed-literal"):
        lang = binding.get("xml:lang") or binding.get("lang")
        default = _RDF_LANG_STRING if lang else _XSD_STRING
        return Term("literal", value, binding.get("datatype") or default, lang)
    raise KGError(f"unexpected binding type {kind!r} in endpoint results")


class SparqlEndpointKG(KG):
    """A remote KG behind a SPARQL endpoint URL (read-only)."""

    def __init__(
        self,
        url: str,
        profile: KGProfile,
        *,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.5,
        user_agent: str = "kgsynth",
    ) -> None:
        self.location = url
        self.url = url
        self.profile = profile
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.user_agent = user_agent
        self.name_index = None
        self.stats = {"queries": 0, "retries": 0}

    def _request(self, query: str, timeout: float | None) -> dict[str, Any]:
        limit = timeout or self.timeout
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                delay = self.backoff * 2 ** (attempt - 1)
                self.stats["retries"] += 1
                log.warning("endpoint %s: %s; retry %d in %.1fs", self.url, last, attempt, delay)
                time.sleep(delay)
            wrapper = SPARQLWrapper(self.url, agent=self.user_agent)
            wrapper.setMethod(POST)
            wrapper.setRequestMethod(URLENCODED)
            wrapper.setReturnFormat(JSON)
            wrapper.setTimeout(max(1, round(limit)))
            wrapper.setQuery(query)
            self.stats["queries"] += 1
            try:
                response = wrapper.query().response
                raw = response.read()
            except urllib.error.HTTPError as exc:
                if exc.code == 429 or exc.code >= 500:
                    last = exc
                    continue
                raise KGError(f"endpoint {self.url} answered HTTP {exc.code}") from None
            except SPARQLWrapperException as exc:
                text = str(exc)
                if "QueryBadFormed" in type(exc).__name__ or "400" in text[:40]:
                    raise QueryRejectedError(f"endpoint rejected the query: {text[:300]}") from None
                if "EndPointInternalError" in type(exc).__name__:
                    last = exc
                    continue
                raise KGError(f"endpoint {self.url}: {text[:300]}") from None
            except TimeoutError as exc:
                raise KGTimeoutError(f"query timed out after {limit:.0f}s at {self.url}") from exc
            except (urllib.error.URLError, ConnectionError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                if isinstance(reason, (TimeoutError, socket.timeout)):
                    raise KGTimeoutError(
                        f"query timed out after {limit:.0f}s at {self.url}"
                    ) from exc
                last = exc
                continue
            try:
                return json.loads(raw)
            except ValueError:
                last = KGError("malformed JSON from endpoint")
                continue
        raise KGUnavailableError(
            f"SPARQL endpoint {self.url} unavailable after {self.retries + 1} attempts: {last}"
        )

    def _select(self, query: str, timeout: float | None) -> list[Row]:
        data = self._request(query, timeout)
        try:
            bindings = data["results"]["bindings"]
        except (KeyError, TypeError):
            raise KGError(f"endpoint {self.url} returned no SELECT results") from None
        return [{k: binding_to_term(v) for k, v in b.items()} for b in bindings]

    def _ask(self, query: str, timeout: float | None) -> bool:
        data = self._request(query, timeout)
        if "boolean" not in data:
            raise KGError(f"endpoint {self.url} returned no ASK result")
        return bool(data["boolean"])

    def describe(self) -> dict[str, Any]:
        return {
            "backend": "endpoint",
            "location": self.url,
            "profile": self.profile.name,
            "timeout_s": self.timeout,
            "retries": self.retries,
        }
