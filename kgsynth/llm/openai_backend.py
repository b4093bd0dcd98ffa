"""The ``openai`` backend: the official client (async) against any OpenAI-compatible URL.

OpenAI, vLLM, SGLang, Ollama and ``transformers serve`` all answer ``/v1/chat/completions``.
Requests run concurrently up to ``concurrency``. The client retries 408, 409, 429 and 5xx
(honouring ``Retry-After`` up to two minutes), timeouts and connection errors itself, with its
exponential backoff (0.5 s doubling to 8 s, less up to a quarter at random), up to
``max_retries`` times; kgsynth adds what the client cannot do: an unreadable response (bad
JSON, no content) is retried too, from the same budget of attempts (with ``backoff`` doubling
to ``max_backoff``), and a request that fails for good comes back as an error result (the
stage counts and keeps it) instead of raising. ``stats.retries`` counts the attempts after
the first, however they came about (each HTTP request the client sends is counted).

Replies are passed through :func:`~kgsynth.core.text.clean_text` (a reply can carry lone surrogates
as JSON escapes), and error texts through :func:`~kgsynth.core.text.redact_text` with the API key
in use (a server may echo the key or the ``Authorization`` header back). A server may echo the
credentials into a reply too, which stages keep (accepted and rejected rows, the request
cache), so replies lose the key and the base URL's credentials as well
(:func:`~kgsynth.core.text.redact_known`: only those values, the rest of a reply is data).

A base URL may carry its key as a query parameter (``http://host/v1?key=…``): the parameters
are sent with every request (the client would otherwise append its paths after them), and the
URL is recorded with the secret ones as ``***``.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import os
import urllib.parse
from collections.abc import Sequence
from typing import Any

import openai

from kgsynth.core.errors import ConfigError
from kgsynth.core.text import clean_text, redact_known, redact_text, url_secrets
from kgsynth.llm.base import LLM, Completion, ProgressFn, Request

log = logging.getLogger(__name__)

# replies lose known secrets of at least this length: a shorter "key" (ollama, dummy, EMPTY) is
# no credential and would blank ordinary words out of the data
MIN_SECRET_IN_REPLY = 8

# the HTTP requests the client has sent for the chat request this asyncio task is running
# (each task runs in its own copy of the context, so concurrent requests count apart)
_SENT: contextvars.ContextVar[list[int]] = contextvars.ContextVar("kgsynth_openai_sent")


def split_query(base_url: str | None) -> tuple[str | None, dict[str, str]]:
    """``base_url`` without its query string, and the query's parameters (sent with every
    request: the client joins its paths onto the whole URL, query included)."""
    if not base_url:
        return base_url, {}
    parts = urllib.parse.urlsplit(base_url)
    if not parts.query:
        return base_url, {}
    params = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    return urllib.parse.urlunsplit(parts._replace(query="", fragment="")), params


class OpenAILLM(LLM):
    backend = "openai"

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        concurrency: int = 16,
        timeout: float = 120.0,
        max_retries: int = 5,
        backoff: float = 1.0,
        max_backoff: float = 60.0,
    ) -> None:
        super().__init__()
        self.model = model
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL")
        self.api_key = api_key or os.environ.get("OPENAI_API_KEY")
        if not self.api_key:
            if self.base_url and "api.openai.com" not in self.base_url:
                self.api_key = "EMPTY"  # local servers accept any key
            else:
                raise ConfigError(
                    "--api-key: no API key; pass --api-key or set OPENAI_API_KEY "
                    "(or --base-url for a local server)"
                )
        if concurrency < 1:
            raise ConfigError(f"--concurrency must be >= 1 (got {concurrency})")
        if not (math.isfinite(timeout) and timeout > 0):
            raise ConfigError(f"--timeout must be a number of seconds > 0 (got {timeout})")
        if max_retries < 0:
            raise ConfigError(f"--max-retries must be >= 0 (got {max_retries})")
        # what a server may echo back: the key given (not the placeholder a local server gets)
        # and the credentials in the base URL
        given_key = None if self.api_key == "EMPTY" else self.api_key
        self.secrets = tuple(s for s in (given_key, *url_secrets(self.base_url)) if s)
        self.concurrency = concurrency
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff

    @property
    def key_fields(self) -> dict[str, Any]:
        """As manifests record it: the base URL without its credentials."""
        shown = redact_text(self.base_url) if self.base_url else self.base_url
        return {"backend": self.backend, "model": self.model, "base_url": shown}

    @property
    def cache_fields(self) -> dict[str, Any]:
        """The base URL as given, so that cache keys stay what they were."""
        return {**self.key_fields, "base_url": self.base_url}

    def _safe(self, message: str) -> str:
        """An error text fit to log and store: no key, no header, nothing unencodable."""
        return redact_text(clean_text(message), [self.api_key, *self.secrets])

    def _reply(self, text: str) -> str:
        """A reply fit to store: encodable, and without the credentials this client sent."""
        return redact_known(clean_text(text), self.secrets, MIN_SECRET_IN_REPLY)

    async def _one(
        self, client: openai.AsyncOpenAI, sem: asyncio.Semaphore, req: Request
    ) -> Completion:
        p = req.params
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": req.message_dicts(),
            "temperature": p.temperature,
            "top_p": p.top_p,
            "max_tokens": p.max_tokens,
        }
        if p.stop:
            kwargs["stop"] = list(p.stop)
        if p.seed is not None:
            kwargs["seed"] = p.seed
        sent = [0]
        _SENT.set(sent)
        last = "no attempt"
        while True:
            left = self.max_retries - sent[0]  # the retries the next call may make
            api = client if left == self.max_retries else client.with_options(max_retries=left)
            async with sem:
                try:
                    resp = await api.chat.completions.create(**kwargs)
                    choice = resp.choices[0]
                    text = choice.message.content
                    if text is None:
                        raise ValueError("response without message content")
                    usage = resp.usage
                    self.stats.retries += sent[0] - 1
                    return Completion(
                        text=self._reply(text),
                        finish_reason=choice.finish_reason,
                        prompt_tokens=getattr(usage, "prompt_tokens", 0) or 0,
                        completion_tokens=getattr(usage, "completion_tokens", 0) or 0,
                    )
                except openai.RateLimitError as exc:  # the client retried while it could
                    last = f"429 rate limited: {exc.message}"
                    break
                except openai.APIStatusError as exc:
                    detail = f"HTTP {exc.status_code}: {exc.message} {exc.body or ''}".strip()[:500]
                    if exc.status_code < 500 and exc.status_code not in (408, 409):
                        self.stats.retries += sent[0] - 1
                        return Completion("", error=self._safe(detail))
                    last = detail
                    break
                except openai.APITimeoutError:
                    last = f"timed out after {self.timeout:.0f}s"
                    break
                except openai.APIConnectionError as exc:
                    last = f"connection error: {exc}"
                    break
                except (
                    openai.APIResponseValidationError,
                    ValueError,
                    TypeError,
                    IndexError,
                    AttributeError,
                    RecursionError,  # a reply of JSON nested past Python's recursion limit
                ) as exc:
                    last = f"unreadable response: {type(exc).__name__}: {exc}"[:500]
            if sent[0] > self.max_retries:  # the client does not retry these: kgsynth does
                break
            retry = sent[0] - 1
            wait = min(self.max_backoff, self.backoff * 2**retry)
            log.info("request failed (%s); retry %d in %.2fs", self._safe(last), retry + 1, wait)
            await asyncio.sleep(wait)
        self.stats.retries += max(0, sent[0] - 1)
        attempts = max(1, sent[0])
        return Completion("", error=self._safe(f"gave up after {attempts} attempts: {last}"))

    @staticmethod
    async def _count_sent(request: Any) -> None:
        """httpx's request hook: one more HTTP request sent for this task's chat request."""
        sent = _SENT.get(None)
        if sent is not None:
            sent[0] += 1

    async def _run(
        self, requests: Sequence[Request], progress: ProgressFn | None
    ) -> list[Completion]:
        sem = asyncio.Semaphore(self.concurrency)
        base_url, query = split_query(self.base_url)
        client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=self.api_key,
            timeout=self.timeout,
            max_retries=self.max_retries,
            default_query=query or None,
            http_client=openai.DefaultAsyncHttpxClient(
                timeout=self.timeout, event_hooks={"request": [self._count_sent]}
            ),
        )
        try:

            async def job(i: int, req: Request) -> Completion:
                c = await self._one(client, sem, req)
                self.stats.add(c)
                if progress:
                    progress(i, c)
                return c

            return list(await asyncio.gather(*(job(i, r) for i, r in enumerate(requests))))
        finally:
            await client.close()

    def generate_batch(
        self, requests: Sequence[Request], progress: ProgressFn | None = None
    ) -> list[Completion]:
        if not requests:
            return []
        return asyncio.run(self._run(requests, progress))
