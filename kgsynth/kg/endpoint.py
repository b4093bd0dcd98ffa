"""Endpoint backend: any SPARQL 1.1 endpoint over HTTP, on keep-alive connections.

Virtuoso, QLever, Oxigraph server, Fuseki and GraphDB all answer the same read-only queries,
sent as the SPARQL protocol's form-encoded POST (the request SPARQLWrapper sends). Each thread
keeps one persistent connection (``http.client``): a new TCP connection per query cost more than
a small query itself, and left thousands of sockets in TIME_WAIT after a walk run. Each query
has a timeout; connection errors, HTTP 429 and 5xx are retried a bounded number of times with
exponential backoff, after which :class:`KGUnavailableError` says the endpoint is down; a
connection the server closed while idle is reopened at once. ``http_proxy``/``https_proxy``
and ``no_proxy`` are honoured as urllib honours them. Engine quirks are absorbed here, not in
callers:

- Virtuoso writes typed literals as ``"type": "typed-literal"`` in its JSON results;
- Virtuoso names blank nodes ``nodeID://…`` (kept as blank nodes);
- Virtuoso's ``ResultSetMaxRows`` setting silently truncates large results, so set it high in
  its ini for walks over big KGs (the test fixture does).
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import os
import threading
import time
import urllib.parse
import urllib.request
from typing import Any

from kgsynth.errors import KGError, KGTimeoutError, KGUnavailableError, QueryRejectedError
from kgsynth.kg.base import KG
from kgsynth.kg.profiles import KGProfile
from kgsynth.kg.terms import Row, Term
from kgsynth.text import clean_text

log = logging.getLogger(__name__)

_XSD_STRING = "http://www.w3.org/2001/XMLSchema#string"
_RDF_LANG_STRING = "http://www.w3.org/1999/02/22-rdf-syntax-ns#langString"
# what SPARQLWrapper asks for with JSON results (VIVO answers application/javascript)
_ACCEPT = "application/sparql-results+json,application/json,text/javascript,application/javascript"
# errors of a request on a connection that may have gone stale while idle
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)
TERM_CACHE_SIZE = 100_000  # converted terms kept per endpoint (cleared when full)


def binding_to_term(binding: dict[str, Any]) -> Term:
    """One SPARQL-JSON binding as a :class:`Term` (standard and Virtuoso forms)."""
    kind = binding.get("type")
    value = clean_text(str(binding.get("value", "")))  # JSON escapes can hold lone surrogates
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
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise KGError(f"not an http(s) SPARQL endpoint URL: {url!r}")
        self.location = url
        self.url = url
        self.profile = profile
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.user_agent = user_agent
        self.name_index = None
        self.stats = {"queries": 0, "retries": 0}
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._target = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
        self._headers = {
            "Content-Type": "application/x-www-form-urlencoded",
            "Accept": _ACCEPT,
            "User-Agent": user_agent,
        }
        self._proxy = self._proxy_for(url)
        self._proxy_auth: dict[str, str] = {}
        if self._proxy is not None and self._proxy.username:
            user = urllib.parse.unquote(self._proxy.username)
            password = urllib.parse.unquote(self._proxy.password or "")
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            self._proxy_auth["Proxy-Authorization"] = f"Basic {token}"
            if not self._https:  # a plain HTTP proxy reads it on every request
                self._headers.update(self._proxy_auth)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[http.client.HTTPConnection] = []
        # (type, value, datatype, lang) -> Term: IRIs and counts come back over and over
        self._terms: dict[tuple[Any, ...], Term] = {}

    # --- transport -----------------------------------------------------------------------

    def _proxy_for(self, url: str) -> urllib.parse.SplitResult | None:
        """The proxy urllib would use for ``url`` (``http_proxy``, ``no_proxy`` …), if any."""
        proxy = urllib.request.getproxies().get("https" if self._https else "http")
        if not proxy or urllib.request.proxy_bypass(self._host):
            return None
        parts = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        return parts if parts.hostname else None

    def _new_connection(self, timeout: float) -> http.client.HTTPConnection:
        proxy = self._proxy
        if proxy is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            return cls(self._host, self._port, timeout=timeout)
        proxy_cls = (
            http.client.HTTPSConnection if proxy.scheme == "https" else http.client.HTTPConnection
        )
        port = proxy.port or (443 if proxy.scheme == "https" else 80)
        conn = proxy_cls(proxy.hostname, port, timeout=timeout)
        if self._https:  # CONNECT through the proxy; a plain HTTP proxy takes absolute URLs
            conn.set_tunnel(self._host, self._port, headers=self._proxy_auth)
        return conn

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        """This thread's connection (a forked child opens its own)."""
        local = self._local
        conn = getattr(local, "conn", None)
        if conn is None or local.pid != os.getpid():
            conn = self._new_connection(timeout)
            local.conn, local.pid = conn, os.getpid()
            with self._lock:
                self._connections.append(conn)
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn

    def _drop_connection(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
            with self._lock:
                if conn in self._connections:
                    self._connections.remove(conn)

    def _post(self, body: bytes, timeout: float) -> tuple[int, bytes]:
        """One POST on this thread's keep-alive connection: (status, body). A connection the
        server closed while idle fails on first use; it is reopened and the request (read-only,
        so safe to repeat) sent again once."""
        target = self.url if self._proxy is not None and not self._https else self._target
        for reopened in (False, True):
            conn = self._connection(timeout)
            reused = conn.sock is not None
            try:
                conn.request("POST", target, body, self._headers)
                response = conn.getresponse()
                data = response.read()
            except _STALE:
                self._drop_connection()
                if reused and not reopened:
                    continue
                raise
            except BaseException:
                # a timeout or a half-read response leaves the connection unusable
                self._drop_connection()
                raise
            return response.status, data
        raise AssertionError("unreachable")

    def _request(self, query: str, timeout: float | None) -> dict[str, Any]:
        limit = timeout or self.timeout
        body = urllib.parse.urlencode(
            # the format parameters SPARQLWrapper sends next to the Accept header
            {"query": query, "format": "json", "output": "json", "results": "json"}
        ).encode("ascii")
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                delay = self.backoff * 2 ** (attempt - 1)
                self.stats["retries"] += 1
                log.warning("endpoint %s: %s; retry %d in %.1fs", self.url, last, attempt, delay)
                time.sleep(delay)
            self.stats["queries"] += 1
            try:
                status, raw = self._post(body, limit)
            except TimeoutError as exc:
                raise KGTimeoutError(f"query timed out after {limit:.0f}s at {self.url}") from exc
            except (OSError, http.client.HTTPException) as exc:
                last = exc
                continue
            if status == 429 or status >= 500:
                last = KGError(f"HTTP {status}: {raw[:200].decode('utf-8', 'replace')}")
                continue
            if status == 400:
                text = raw[:300].decode("utf-8", "replace")
                raise QueryRejectedError(f"endpoint rejected the query: {text}")
            if status != 200:
                raise KGError(f"endpoint {self.url} answered HTTP {status}")
            try:
                return json.loads(raw)
            except ValueError:
                last = KGError("malformed JSON from endpoint")
                continue
        raise KGUnavailableError(
            f"SPARQL endpoint {self.url} unavailable after {self.retries + 1} attempts: {last}"
        )

    # --- the KG protocol -----------------------------------------------------------------

    def _term(self, binding: dict[str, Any]) -> Term:
        key = (
            binding.get("type"),
            binding.get("value"),
            binding.get("datatype"),
            binding.get("xml:lang") or binding.get("lang"),
        )
        try:
            term = self._terms.get(key)
        except TypeError:  # not a term (an RDF-star triple's value is an object)
            return binding_to_term(binding)
        if term is None:
            if len(self._terms) >= TERM_CACHE_SIZE:
                self._terms.clear()
            term = self._terms[key] = binding_to_term(binding)
        return term

    def _select(self, query: str, timeout: float | None) -> list[Row]:
        data = self._request(query, timeout)
        try:
            bindings = data["results"]["bindings"]
        except (KeyError, TypeError):
            raise KGError(f"endpoint {self.url} returned no SELECT results") from None
        term = self._term
        return [{k: term(v) for k, v in b.items()} for b in bindings]

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

    def close(self) -> None:
        """Close every connection this KG opened."""
        with self._lock:
            connections, self._connections = self._connections, []
        for conn in connections:
            conn.close()
