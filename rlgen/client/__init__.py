"""The client layer: talking to a running server over SGLang's native HTTP API.

Owns: the HTTP client and its error mapping (`_http`), a router-aware client that fans control
calls out to every worker (`client._router`), the generate core that chunks, sends and collects batched
`/generate` requests (`client._generate`), turning prompts and per-prompt data into what is sent
(`client._prompts`), and the completion cache (`client._completion_cache`). Knows nothing about server
processes, the result object or rewards: it returns the server's answers as dicts.
"""

from __future__ import annotations

from ._http import Client
from ._router import RouterClient

__all__ = ["Client", "RouterClient"]
