"""One TLS context per process for every httpx client.

httpx builds a fresh SSL context (and loads the CA bundle into it) for every client it creates:
~0.15 s on the 2-core box, paid even for the plain-http loopback calls rlfleet makes to vLLM (a
health check, a rollout's client, each weight reload). Passing this shared context makes a client
cost ~2 ms, and https URLs are still verified against the same CA bundle.
"""

from __future__ import annotations

import functools
import ssl

import certifi


@functools.cache
def tls() -> ssl.SSLContext:
    return ssl.create_default_context(cafile=certifi.where())
