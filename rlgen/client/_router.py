"""Behind a router: an `sglang-router` (the SGLang Model Gateway) in front of several servers.

Owns: telling a router from a server (`is_router`), the router's worker list (`GET /workers`),
and `RouterClient`, the client an Engine attached to a router talks through. It differs from a
server's `Client` in three ways (docs/sglang-api.md section 6 has the probe behind each):

- /generate goes one prompt per request with one rid (the router answers 422 to a list of rids,
  texts or sampling params); `one_prompt_per_request` tells the generate core so.
- The control routes the router does not have (/update_weights_from_disk, /release_memory_occupation,
  /resume_memory_occupation, /abort_request, ...: 404 there) go to every worker it lists, at once;
  `fan_out` tries them all, then raises one `WorkerRequestError` naming each worker that failed.
- What the router does not answer itself comes from its workers: `get_info("server")` is a
  worker's /server_info, with the running-request capacity of all of them and the router's own
  answer under "router".

- A request that fails because its worker died (unreachable, or 5xx from the router once its own
  retries are spent) may be sent again by the generate core: `may_resend` says whether, from what
  the owner of the workers (`Engine(replicas=N)`) sees of their processes (`await_may_resend`
  waits up to `DEATH_GRACE_S` for a death that has not shown yet). Off for a router rlgen
  does not own (`resend_limit` 0): it cannot tell a dead worker from a failing request. A re-send
  goes straight to a live worker (`live_worker`): the router may still pick the dead one until
  its health check marks it down.

The router adds nothing to a response that says which worker served it (no header, no
meta_info field), so rows cannot record their worker.

Knows nothing about processes, prompts or results.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core._errors import RequestError, ServerRequestError, WorkerRequestError
from ._http import Client

__all__ = ["DEATH_GRACE_S", "OWNED_RESEND_LIMIT", "RouterClient", "Worker", "is_router", "parse_workers"]

# How often rlgen re-sends one request whose worker died, behind a router whose workers it owns.
OWNED_RESEND_LIMIT = 3
# How long a failed request waits for a worker's death to show (`await_may_resend`): a SIGKILLed
# process has closed its sockets (the router's request to it fails) a moment before waitpid or
# /proc show it gone; on a loaded machine that moment was long enough to fail a call.
DEATH_GRACE_S = 2.0


@dataclass(frozen=True)
class Worker:
    """One worker as the router lists it."""

    url: str
    healthy: bool | None   # the router's view: it checks every 60 s by default, so a dead worker can look healthy
    load: int | None       # requests the router has in flight on it
    model: str | None

    def as_dict(self) -> dict[str, Any]:
        return {"url": self.url, "healthy": self.healthy, "load": self.load, "model": self.model}


async def is_router(client: Client) -> bool:
    """Whether `client`'s URL is an sglang-router: its /get_server_info is the router's own
    `{"router_manager": true, ...}`, where a server answers its settings (or 404 in a later SGLang)."""
    try:
        info = await client.get("/get_server_info", timeout=30)
    except ServerRequestError:
        return False
    return isinstance(info, dict) and info.get("router_manager") is True


def parse_workers(body: Any) -> list[Worker]:
    """`GET /workers`' answer: `{"workers": [{"url", "is_healthy", "load", "model_id", ...}], ...}`."""
    items = body.get("workers") if isinstance(body, dict) else None
    if not isinstance(items, list):
        raise RequestError(f"the router's /workers answered {str(body)[:200]!r}, not a list of workers")
    workers = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("url"), str):
            continue
        healthy, load, model = item.get("is_healthy"), item.get("load"), item.get("model_id")
        workers.append(Worker(
            url=item["url"].rstrip("/"),
            healthy=healthy if isinstance(healthy, bool) else None,
            load=load if isinstance(load, int) and not isinstance(load, bool) else None,
            model=model if isinstance(model, str) else None,
        ))
    return workers


class RouterClient(Client):
    """A `Client` for a router, with a `Client` per worker for what the router does not route.

    The workers get the same API key as the router (a router in front of servers that require a
    key is given theirs with its own `--api-key`).
    """

    one_prompt_per_request = True

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self._worker_clients: dict[str, Client] = {}
        self.workers: list[Worker] = []  # as the router listed them last
        # rlgen's own re-sends of a request whose worker died (the router's retries come first);
        # set by the owner of the workers, with `workers_alive` (worker URL -> its process runs).
        self.resend_limit = 0
        self.resend_backoff_s = 1.0
        self.workers_alive: Callable[[], dict[str, bool]] | None = None
        self.resent = 0  # requests rlgen sent again so far
        self._next_live = -1

    def may_resend(self, err: RequestError, attempt: int) -> bool:
        """Whether a request that failed with `err` (its `attempt`-th re-send so far) should go
        again: it failed as a dead worker's requests do (unreachable or 5xx), a worker's process
        has died (so that is the likely cause) and another one still runs. Never with no worker left."""
        if self.workers_alive is None or not self._may_ever_resend(err, attempt):
            return False
        alive = self.workers_alive()
        if any(alive.values()) and not all(alive.values()):
            self.resent += 1
            return True
        return False

    async def await_may_resend(self, err: RequestError, attempt: int, *, grace_s: float = DEATH_GRACE_S) -> bool:
        """`may_resend`, allowing for a worker whose death does not show yet: when the error is one
        a dead worker's request gets and every worker still looks alive, look again for up to
        `grace_s` seconds before saying no (a request that fails while no worker dies still fails)."""
        workers_alive = self.workers_alive
        if workers_alive is None or not self._may_ever_resend(err, attempt):
            return False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        while not self.may_resend(err, attempt):
            if not any(workers_alive().values()) or loop.time() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    def _may_ever_resend(self, err: RequestError, attempt: int) -> bool:
        """What no worker's death changes: re-sends left, and an error a dead worker's request gets."""
        return attempt < self.resend_limit and _transient(err)

    def live_worker(self) -> Client | None:
        """A worker whose process runs (in turn), for a re-send: straight to it, since the router may
        still send to the dead one until its health check notices. None when rlgen does not own them."""
        if self.workers_alive is None:
            return None
        live = [u for u, ok in self.workers_alive().items() if ok]
        if not live:
            return None
        self._next_live = (self._next_live + 1) % len(live)
        return self.worker(live[self._next_live])

    def dead_workers(self) -> list[str]:
        """The owned workers whose process has exited (empty when rlgen does not own them)."""
        return [] if self.workers_alive is None else [u for u, ok in self.workers_alive().items() if not ok]

    def worker(self, url: str) -> Client:
        """The client for one worker (made once)."""
        client = self._worker_clients.get(url)
        if client is None:
            client = self._worker_clients[url] = Client(url, request_timeout=self.request_timeout, api_key=self.api_key)
        return client

    async def list_workers(self, *, timeout: float = 30) -> list[Worker]:
        """The router's workers now (`GET /workers`); also kept in `self.workers`."""
        self.workers = parse_workers(await self.get("/workers", timeout=timeout))
        return self.workers

    async def aclose(self) -> None:
        for client in self._worker_clients.values():
            await client.aclose()
        self._worker_clients.clear()
        await super().aclose()

    # -- what the router does not answer ---------------------------------------------------------
    async def get_info(self, which: str, **kwargs: Any) -> Any:
        """"model": the router passes /get_model_info on to a worker. "server": the first worker's
        /server_info, with `internal_states` of every worker (so that their running capacity adds
        up), "workers" (their URLs) and "router" (the router's own /get_server_info)."""
        if which != "server":
            return await super().get_info(which, **kwargs)
        router = await self.get("/get_server_info", **kwargs)
        workers = await self.list_workers()
        if not workers:
            raise RequestError(f"the router at {self.url} lists no workers")
        infos = await asyncio.gather(*(self.worker(w.url).get_info("server", **kwargs) for w in workers),
                                     return_exceptions=True)
        answered = [i for i in infos if isinstance(i, dict)]
        if not answered:
            first = next(i for i in infos if isinstance(i, BaseException))
            raise RequestError(f"no worker of the router at {self.url} answered /server_info ({first})")
        merged = dict(answered[0])
        states = [i.get("internal_states") for i in answered]
        if len(answered) == len(workers) and all(isinstance(s, list) for s in states):
            merged["internal_states"] = [state for s in states if isinstance(s, list) for state in s]
        else:
            merged.pop("internal_states", None)  # capacity unknown: the generate core's fallback
        merged["workers"] = [w.url for w in workers]
        merged["router"] = router
        return merged

    async def fan_out(self, path: str, body: Any = None, *, what: str | None = None, timeout: float | None = None,
                      retries: int = 0, backoff_s: float = 1.0) -> dict[str, Any]:
        """POST `path` to every worker the router lists, at once; returns worker URL -> answer.

        A worker that cannot be reached or answers 5xx is tried again (`retries` times, with
        backoff); one that answers 4xx, or `{"success": false}`, is not. When every worker has
        had its tries and some failed, raises `WorkerRequestError` naming each of them and what
        it said (the others did it: the workers may now differ).
        """
        what = what or path
        workers = await self.list_workers()
        if not workers:
            raise RequestError(f"{what}: the router at {self.url} lists no workers")
        urls = [w.url for w in workers]
        answers: dict[str, Any] = {}
        errors: dict[str, RequestError] = {}
        pending = list(urls)
        for attempt in range(retries + 1):
            outcomes = await asyncio.gather(*(self.worker(u).post(path, body, timeout=timeout) for u in pending),
                                            return_exceptions=True)
            for url, outcome in zip(pending, outcomes):
                if isinstance(outcome, RequestError):
                    errors[url] = outcome
                elif isinstance(outcome, BaseException):
                    raise outcome
                elif isinstance(outcome, dict) and outcome.get("success") is False:
                    errors[url] = ServerRequestError(f"{path}: {outcome.get('message')}", status=200,
                                                     body=str(outcome.get("message")))
                else:
                    answers[url] = outcome
                    errors.pop(url, None)
            pending = [u for u in pending if u in errors and _transient(errors[u])]
            if not pending or attempt == retries:
                break
            await asyncio.sleep(backoff_s * 2**attempt)
        if errors:
            raise _worker_error(what, self.url, urls, answers, errors)
        return answers

    async def abort(self, rids: list[str]) -> None:
        """Abort requests by rid on every worker (the router has no /abort_request; a request whose
        client disconnected from the router is aborted by the router itself)."""
        if not rids:
            return
        try:
            await self.list_workers(timeout=10)
        except RequestError:
            pass  # the last listing will do
        urls = [w.url for w in self.workers]

        async def on(url: str) -> None:
            client = self.worker(url)
            await asyncio.gather(*(client.post("/abort_request", {"rid": rid}, timeout=30) for rid in rids))

        outcomes = await asyncio.gather(*(on(u) for u in urls), return_exceptions=True)
        errors: dict[str, RequestError] = {}
        for url, outcome in zip(urls, outcomes):
            if isinstance(outcome, RequestError):
                errors[url] = outcome
            elif isinstance(outcome, BaseException):
                raise outcome
        if errors:
            raise _worker_error("/abort_request", self.url, urls, {u: None for u in urls if u not in errors}, errors)


def _transient(err: RequestError) -> bool:
    """Worth another try: the worker could not be reached, or answered 5xx."""
    return not isinstance(err, ServerRequestError) or err.status >= 500


def _worker_error(what: str, router: str, urls: list[str], answers: dict[str, Any],
                  errors: dict[str, RequestError]) -> WorkerRequestError:
    lines = [f"  {url}: {err}" for url, err in errors.items()]
    done = [u for u in urls if u in answers]
    tail = (f"it worked on {', '.join(done)}, so the workers may now differ; repeat the call once the failing "
            "workers are fixed" if done else "it worked on none")
    return WorkerRequestError(
        f"{what} failed on {len(errors)} of {len(urls)} workers behind the router {router}:\n" + "\n".join(lines)
        + f"\n{tail}",
        failures={u: str(e) for u, e in errors.items()},
        statuses={u: e.status if isinstance(e, ServerRequestError) else None for u, e in errors.items()},
        succeeded=done,
    )
