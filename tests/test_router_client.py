"""rlgen.client._router.RouterClient's re-send decision, without processes: `workers_alive` is the
owner's view of its workers' processes, given here as a function whose answer changes over time."""

from __future__ import annotations

import asyncio
import time

from rlgen.client._router import OWNED_RESEND_LIMIT, RouterClient
from rlgen.core._errors import RequestError, ServerRequestError


def owned_router(alive_after_kill: dict[str, bool], *, dies_after_s: float) -> RouterClient:
    """A client whose two workers both look alive until `dies_after_s`, then as `alive_after_kill`."""
    client = RouterClient("http://127.0.0.1:9")  # nothing is sent: only the decision is tested
    client.resend_limit = OWNED_RESEND_LIMIT
    start = time.monotonic()
    both = {"http://w0": True, "http://w1": True}
    client.workers_alive = lambda: both if time.monotonic() - start < dies_after_s else alive_after_kill
    return client


UNREACHABLE = ServerRequestError("/generate failed with HTTP 500: error sending request", status=500)


def test_a_failure_just_before_its_workers_death_shows_is_sent_again_once_the_death_shows() -> None:
    # SIGKILL closes a worker's sockets (the router's request fails) a moment before waitpid shows it dead
    client = owned_router({"http://w0": True, "http://w1": False}, dies_after_s=0.3)
    assert asyncio.run(client.await_may_resend(UNREACHABLE, 0)) is True
    assert client.resent == 1


def test_a_failure_while_every_worker_keeps_running_is_not_sent_again() -> None:
    client = owned_router({"http://w0": True, "http://w1": True}, dies_after_s=0.0)
    t0 = time.monotonic()
    assert asyncio.run(client.await_may_resend(UNREACHABLE, 0, grace_s=0.3)) is False
    assert 0.25 <= time.monotonic() - t0 < 2.0  # it looked again for the grace period, then gave up


def test_no_resend_with_no_worker_left_past_the_limit_or_for_a_client_error() -> None:
    none_left = owned_router({"http://w0": False, "http://w1": False}, dies_after_s=0.0)
    assert asyncio.run(none_left.await_may_resend(UNREACHABLE, 0)) is False
    one_dead = owned_router({"http://w0": True, "http://w1": False}, dies_after_s=0.0)
    assert asyncio.run(one_dead.await_may_resend(UNREACHABLE, OWNED_RESEND_LIMIT)) is False
    assert asyncio.run(one_dead.await_may_resend(ServerRequestError("bad", status=400), 0)) is False
    assert asyncio.run(one_dead.await_may_resend(RequestError("cannot reach"), 0)) is True
    not_owned = RouterClient("http://127.0.0.1:9")  # resend_limit 0: a router rlgen does not own
    assert asyncio.run(not_owned.await_may_resend(UNREACHABLE, 0)) is False
