"""Endpoint backend: any SPARQL 1.1 endpoint over HTTP, through SPARQLWrapper, on keep-alive
connections.

Virtuoso, QLever, Oxigraph server, Fuseki and GraphDB all answer the same read-only queries.
SPARQLWrapper is the client (:class:`KeepAliveSPARQLWrapper`, a subclass): it builds each
request (the SPARQL protocol's form-encoded POST, its Accept header and format parameters,
user agent, custom headers) and its ``QueryResult`` parses the JSON results. Only its
transport differs: ``_query`` sends the request on the thread's persistent ``http.client``
connection instead of urllib's ``urlopen``, which opens a new TCP connection per query; that
cost more than a small query itself, and left thousands of sockets in TIME_WAIT after a walk
run. The query form (SELECT or ASK) is the one the caller asked for, not SPARQLWrapper's regex
guess. Each query has a timeout; connection errors, HTTP 429 and 5xx are retried a bounded
number of times with exponential backoff, after which :class:`KGUnavailableError` says the
endpoint is down; a connection the server closed while idle is reopened at once.
``http_proxy``/``https_proxy`` and ``no_proxy`` are honoured as urllib honours them. Engine
quirks are absorbed here, not in callers:

- Virtuoso writes typed literals as ``"type": "typed-literal"`` in its JSON results;
- Virtuoso names blank nodes ``nodeID://…`` (kept as blank nodes);
- Virtuoso's ``ResultSetMaxRows`` setting silently truncates large results, so set it high in
  its ini for walks over big KGs (the test fixture does).
"""

from __future__ import annotations

import base64
import http.client
import logging
import os
import re
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from SPARQLWrapper import ASK, JSON, POST, SELECT, URLENCODED, SPARQLWrapper

from kgsynth.core.errors import KGError, KGTimeoutError, KGUnavailableError, QueryRejectedError
from kgsynth.core.text import clean_text, redact_text
from kgsynth.kg.base import KG
from kgsynth.kg.profiles import KGProfile
from kgsynth.kg.terms import Row, Term

log = logging.getLogger(__name__)

# what engines answer (HTTP 5xx) for a query stopped for its run time: Virtuoso's estimate
# check ("The estimated execution time … exceeds the limit") and its timeout (SR171)
_OVER_TIME = re.compile(
    r"estimated execution time .* exceeds the limit|SR171: Transaction timed out"
)

_XSD_STRING = "http://www.w3.org/2001/XMLSchema#string"
_RDF_LANG_STRING = "http://www.w3.org/1999/02/22-rdf-syntax-ns#langString"
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


class _OneWrite:
    """Writes a request's head and bytes body with one ``send``: http.client writes them apart,
    a second system call and TCP segment per query (about 8% of the one-hop rate over loopback,
    which pays for SPARQLWrapper's request building), and with Nagle's algorithm on a real
    network the body can wait for the server to acknowledge the head. Overrides http.client's
    ``_send_output``; a test checks that a query is one write."""

    _buffer: list[bytes]

    def _send_output(self, message_body: Any = None, encode_chunked: bool = False) -> None:
        if isinstance(message_body, bytes) and not encode_chunked:
            self._buffer.extend((b"", b""))  # the blank line that ends the head
            head = b"\r\n".join(self._buffer)
            del self._buffer[:]
            self.send(head + message_body)  # type: ignore[attr-defined]
            return
        super()._send_output(message_body, encode_chunked)  # type: ignore[misc]


class _HTTPConnection(_OneWrite, http.client.HTTPConnection):
    pass


class _HTTPSConnection(_OneWrite, http.client.HTTPSConnection):
    pass


class _Response:
    """The part of a urllib response SPARQLWrapper's :class:`QueryResult` reads: status,
    headers, body, URL."""

    def __init__(self, url: str, status: int, headers: Any, body: bytes) -> None:
        self.url, self.status, self.headers, self.body = url, status, headers, body

    def read(self) -> bytes:
        return self.body

    def info(self) -> Any:
        return self.headers

    def geturl(self) -> str:
        return self.url


# request -> timeout -> response: what the wrapper sends its requests through
Transport = Callable[[urllib.request.Request, float], _Response]


class KeepAliveSPARQLWrapper(SPARQLWrapper):
    """SPARQLWrapper asking for SPARQL JSON results by form-encoded POST, whose requests go out
    through ``transport`` (a persistent connection) instead of urllib's ``urlopen``.

    Only ``_query`` differs from SPARQLWrapper's: it sends the request ``_createRequest`` built
    (method, URL, body, headers: user agent, Accept, credentials, custom headers) with the
    timeout in ``self.timeout``, and returns every status, so the caller decides what to retry
    (SPARQLWrapper raises on some statuses and not others)."""

    def __init__(self, endpoint: str, agent: str, transport: Transport) -> None:
        super().__init__(endpoint, returnFormat=JSON, agent=agent)
        self.setMethod(POST)
        self.setRequestMethod(URLENCODED)
        self._transport = transport

    def set_read_query(self, query: str, form: str) -> None:
        """Set a query the read-only guard admitted, and its form (``SELECT`` for
        ``KG.select``, ``ASK`` for ``KG.ask``).

        ``setQuery`` would guess the form with SPARQLWrapper's regex, which takes the first
        keyword after the ``PREFIX`` lines it recognises, upper case only: ``prefix ex:
        <http://example.org/address#> select …`` reads as an ADD update and would go out as
        ``update=``. The guard has parsed the text as a query, so the caller knows the form."""
        self.queryString = query
        self.queryType = form

    def _query(self) -> tuple[_Response, str]:
        return self._transport(self._createRequest(), self.timeout), self.returnFormat


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
        # messages, logs and describe() show the URL without its credentials (?key=…, user:pw@)
        shown = redact_text(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise KGError(f"not an http(s) SPARQL endpoint URL: {shown!r}")
        self.location = url
        self.url = url
        self.shown_url = shown
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
        self._proxy = self._proxy_for(url)
        self._proxy_auth: dict[str, str] = {}
        if self._proxy is not None and self._proxy.username:
            user = urllib.parse.unquote(self._proxy.username)
            password = urllib.parse.unquote(self._proxy.password or "")
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            self._proxy_auth["Proxy-Authorization"] = f"Basic {token}"
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
            cls = _HTTPSConnection if self._https else _HTTPConnection
            return cls(self._host, self._port, timeout=timeout)
        proxy_cls = _HTTPSConnection if proxy.scheme == "https" else _HTTPConnection
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

    def _wrapper(self) -> KeepAliveSPARQLWrapper:
        """This thread's SPARQLWrapper (it holds the query it sends, so one per thread)."""
        sw = getattr(self._local, "sparqlwrapper", None)
        if sw is None:
            sw = KeepAliveSPARQLWrapper(self.url, self.user_agent, self._send)
            if self._proxy_auth and not self._https:  # a plain HTTP proxy reads it per request
                for name, value in self._proxy_auth.items():
                    sw.addCustomHttpHeader(name, value)
            self._local.sparqlwrapper = sw
        return sw

    def _send(self, request: urllib.request.Request, timeout: float) -> _Response:
        """Send SPARQLWrapper's request on this thread's keep-alive connection. A connection the
        server closed while idle fails on first use; it is reopened and the request (read-only,
        so safe to repeat) sent again once."""
        # a plain HTTP proxy takes the absolute URL; a server or a CONNECT tunnel, the path
        target = (
            request.full_url if self._proxy is not None and not self._https else request.selector
        )
        method, body, headers = request.get_method(), request.data, dict(request.header_items())
        for reopened in (False, True):
            conn = self._connection(timeout)
            reused = conn.sock is not None
            try:
                conn.request(method, target, body, headers)
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
            return _Response(request.full_url, response.status, response.msg, data)
        raise AssertionError("unreachable")

    def _request(self, query: str, form: str, timeout: float | None) -> dict[str, Any]:
        limit = timeout or self.timeout
        sw = self._wrapper()
        sw.set_read_query(query, form)
        sw.timeout = limit  # setTimeout() would round to whole seconds
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                delay = self.backoff * 2 ** (attempt - 1)
                self.stats["retries"] += 1
                log.warning(
                    "endpoint %s: %s; retry %d in %.1fs", self.shown_url, last, attempt, delay
                )
                time.sleep(delay)
            self.stats["queries"] += 1
            try:
                result = sw.query()
            except TimeoutError as exc:
                raise KGTimeoutError(
                    f"query timed out after {limit:.0f}s at {self.shown_url}"
                ) from exc
            except (OSError, http.client.HTTPException) as exc:
                last = exc
                continue
            status, raw = result.response.status, result.response.body
            if status >= 500 and _OVER_TIME.search(raw[:500].decode("utf-8", "replace")):
                # the engine refused or stopped the query for its run time (Virtuoso checks
                # its estimate before it starts): a timeout, and retrying would only repeat it
                raise KGTimeoutError(
                    f"the endpoint stopped the query for its run time: "
                    f"{raw[:200].decode('utf-8', 'replace').strip()}"
                )
            if status == 429 or status >= 500:
                last = KGError(f"HTTP {status}: {raw[:200].decode('utf-8', 'replace')}")
                continue
            if status == 400:
                text = raw[:300].decode("utf-8", "replace")
                raise QueryRejectedError(f"endpoint rejected the query: {text}")
            if status != 200:
                raise KGError(f"endpoint {self.shown_url} answered HTTP {status}")
            try:
                # QueryResult's JSON conversion, by the body: convert() would pick a converter
                # by Content-Type and hand back raw bytes or an XML tree for a mislabelled
                # answer; kgsynth asked for JSON, and anything else is a malformed answer
                return result._convertJSON()
            except (ValueError, TypeError):
                last = KGError("malformed JSON from endpoint")
                continue
        raise KGUnavailableError(
            f"SPARQL endpoint {self.shown_url} unavailable after {self.retries + 1} attempts: {last}"
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
        data = self._request(query, SELECT, timeout)
        try:
            bindings = data["results"]["bindings"]
        except (KeyError, TypeError):
            raise KGError(f"endpoint {self.shown_url} returned no SELECT results") from None
        term = self._term
        return [{k: term(v) for k, v in b.items()} for b in bindings]

    def _ask(self, query: str, timeout: float | None) -> bool:
        data = self._request(query, ASK, timeout)
        if "boolean" not in data:
            raise KGError(f"endpoint {self.shown_url} returned no ASK result")
        return bool(data["boolean"])

    def describe(self) -> dict[str, Any]:
        return {
            "backend": "endpoint",
            "location": self.shown_url,
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
