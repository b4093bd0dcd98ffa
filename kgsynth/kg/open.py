"""``--kg`` resolution: a store directory, a triple file (imported to a cache on first use),
or an ``http(s)://…`` SPARQL endpoint URL."""

from __future__ import annotations

import hashlib
import logging
import urllib.parse
from pathlib import Path

from kgsynth.core.errors import ConfigError
from kgsynth.kg.base import DEFAULT_MAX_ROWS, DEFAULT_TIMEOUT_S, KG
from kgsynth.kg.embedded import EmbeddedKG, is_store_dir
from kgsynth.kg.graph import cache_dir
from kgsynth.kg.importer import file_sha256, import_kg
from kgsynth.kg.profiles import (
    FREEBASE_NS,
    WIKIDATA_DIRECT,
    KGProfile,
    get_profile,
)
from kgsynth.resources import default_kg

log = logging.getLogger(__name__)

DEFAULT_KG = default_kg()
"""The shipped MetaQA movie KB, packaged (``kgsynth/resources/metaqa/kb_partial.txt.gz``)."""


def detect_endpoint_profile(kg: KG) -> KGProfile:
    """Freebase when the endpoint has ``type.object.name``, Wikidata when it has ``wdt:``
    properties, generic otherwise (one cheap ASK each)."""
    if kg.ask(f"ASK {{ ?s <{FREEBASE_NS}type.object.name> ?o }}"):
        return get_profile("freebase")
    if kg.ask(f"ASK {{ ?s <{WIKIDATA_DIRECT}P31> ?o }}"):
        return get_profile("wikidata")
    return get_profile("generic")


def check_endpoint_url(url: str) -> None:
    """A :class:`ConfigError` naming ``--kg`` for an endpoint URL without a host or with a port
    outside 1..65535."""
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        raise ConfigError(f"--kg: {url} has an invalid port; ports are 1..65535") from None
    if not parts.hostname:
        raise ConfigError(f"--kg: {url} names no host")
    if port == 0:
        raise ConfigError(f"--kg: {url} has an invalid port; ports are 1..65535")


def cached_store_for(
    path: Path, *, profile: str | None = None, names_file: str | None = None
) -> Path:
    """The cache directory a triple file is imported into (keyed by content and options)."""
    key = hashlib.sha256(
        "|".join(
            [
                file_sha256(path),
                profile or "",
                file_sha256(Path(names_file)) if names_file else "",
            ]
        ).encode()
    ).hexdigest()[:20]
    return cache_dir() / "kg" / f"{path.name}-{key}"


def open_kg(
    source: str | Path | None = None,
    *,
    profile: str | None = None,
    names_file: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    retries: int = 3,
    max_rows: int = DEFAULT_MAX_ROWS,
    isolate: bool = False,
) -> KG:
    """Open the KG at ``source``: a store directory, a triple file or an endpoint URL (default:
    the shipped MetaQA KB).

    Every query gets ``timeout`` seconds and at most ``max_rows`` rows unless the call says
    otherwise; ``isolate`` runs an embedded store's queries in a child process that is killed
    at the deadline (see :mod:`kgsynth.kg.embedded`; endpoints time out on their own).
    """
    if max_rows < 1:
        raise ConfigError(f"max_rows: {max_rows} is not a row cap (use 1 or more)")
    if timeout <= 0:
        raise ConfigError(f"timeout: {timeout} is not a timeout (use seconds > 0)")
    bounds = {"timeout": timeout, "max_rows": max_rows, "isolate": isolate}
    text = str(source) if source is not None else str(DEFAULT_KG)
    if text.startswith(("http://", "https://")):
        from kgsynth.kg.endpoint import SparqlEndpointKG

        check_endpoint_url(text)

        kg = SparqlEndpointKG(
            text, get_profile(profile or "generic"), timeout=timeout, retries=retries
        )
        kg.max_rows = max_rows
        if profile is None:
            kg.profile = detect_endpoint_profile(kg)
        return kg
    path = Path(text)
    if is_store_dir(path):
        return EmbeddedKG.open(path, get_profile(profile) if profile else None, **bounds)
    if path.is_file() and path.suffix.lower() == ".parquet":
        raise ConfigError(
            f"--kg: {text} is a Parquet file; give a store directory, a triple file "
            "(.nt, .ttl, s|r|o or TSV) or an http(s)://…/sparql endpoint URL"
        )
    if path.is_dir() and ((path / "kg.json").exists() or (path / "oxigraph").exists()):
        raise ConfigError(
            f"--kg: {text} is an incomplete store (it needs both kg.json and oxigraph/); "
            "import the triple file again with kgsynth kg import FILE --out DIR --force"
        )
    if path.is_file():
        store = cached_store_for(path, profile=profile, names_file=names_file)
        if not is_store_dir(store):
            log.info("importing %s into the cache %s", path, store)
            import_kg(path, store, profile=profile, names_file=names_file, force=True)
        return EmbeddedKG.open(store, **bounds)
    raise ConfigError(
        f"--kg: {text} is not a store directory (with kg.json), a triple file, "
        "or an http(s)://…/sparql endpoint URL"
    )
