"""The server-process layer: launching, owning and stopping SGLang (or CPU backend) servers.

Owns: the server's command line (`_command`, `server._launch_options`), launching and watching one
server process (`_process`: its own session, a parent-death signal, start-up phases read from its
log by `_log`), the process tree and GPU memory of what rlgen started (`server._process_tree`), the
registry of running and kept servers (`server._registry`), keep-alive across kernel restarts
(`server._keep_alive`), replicas behind an sglang-router (`server._replicas`), the default model and its
conversion (`server._models`), the weights' content hash (`server._weights`) and what a server says about
itself (`_info`), and the one face an Engine sees whatever the kind (`server._handle`: owned, kept, a
fleet, attached). Knows nothing about HTTP requests for generation, results or rewards.
"""

from __future__ import annotations

from ._models import DEFAULT_MODEL, resolve_model
from ._process import ServerProcess, launch_server, reap
from ._registry import list_servers

__all__ = ["DEFAULT_MODEL", "ServerProcess", "launch_server", "list_servers", "reap", "resolve_model"]
