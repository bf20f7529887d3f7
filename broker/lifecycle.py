"""A broker's life in the cluster, as the active controller sees it: register, catch up on
the metadata log, get unfenced, run, and shut down under control (KIP-631).

How this works. The broker replicates the metadata log as a Raft observer (its ``RaftNode``
is not a voter) into a ``MetadataStateMachine``; this class talks to the active controller
through a ``ControllerClient``:

1. ``start`` registers (a new incarnation id each process start) and gets a broker epoch;
   the broker is fenced.
2. A heartbeat every ``heartbeat_interval_ms`` reports the metadata offset the broker has
   applied; once it has caught up the controller unfences it: the broker is RUNNING. While
   fenced it heartbeats every ``FENCED_HEARTBEAT_INTERVAL_MS`` instead, so it is unfenced
   about that soon after it has caught up (Kafka's broker heartbeats every 10 ms until it
   has caught up). With the plain interval a starting broker, whose first heartbeat comes
   right after registration and before its metadata caught up, stayed fenced for a whole
   interval (2 s by default) of every start.
3. ``shutdown`` asks for a controlled shutdown: the background heartbeats stop, and
   heartbeats saying ``want_shutdown`` go until the controller has moved every leadership
   away and answers ``should_shut_down`` (or the time limit passes, or
   ``skip_controlled_shutdown`` is called: a second SIGTERM), then the broker stops. A
   broker that never registered has nothing to hand over: it just stops. Nothing registers
   once shutting down: an answer that the registration is gone ends the shutdown.

An answer of STALE_BROKER_EPOCH or BROKER_ID_NOT_REGISTERED (the controller lost or replaced
the registration) makes it register again. Registration itself is retried with backoff while
the answer is DUPLICATE_BROKER_REGISTRATION: after a restart, the previous process's session
must expire first (``broker_session_timeout_ms``), as in Kafka. Errors reaching the
controller are retried by the client; a heartbeat that fails altogether is logged and the
next one tries again: the controller fences a broker it has not heard from for its session
timeout. A heartbeat's attempts are short (``HEARTBEAT_ATTEMPT_INTERVALS`` intervals), so
one sent to a paused controller moves on to the next active one within the session timeout
that controller starts counting when it takes over. A registration again that fails in a
way that may pass (no controller answered; still a duplicate after ``REGISTER_TIMEOUT_S``)
is logged and tried again with backoff; one the controller refuses
(``RegistrationRefused``) ends the heartbeats: the broker cannot go on, and ``on_fatal``
tells the node (as does any other end of the heartbeats, a bug).

What the broker leads and follows is not this class's business: the broker's data plane
(``broker/runtime.py``) hears of every committed image from the state machine itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import os
from collections.abc import Callable, Sequence

from controller.client import ControllerClient, ControllerUnavailable
from proto import controller_pb2 as cpb
from proto import metadata_pb2 as mpb
from raft.driver import RaftNode

__all__ = ["BrokerLifecycle", "BrokerState", "RegistrationRefused"]

_log = logging.getLogger(__name__)
INCARNATION_ID_BYTES = 16
_REREGISTER = frozenset({cpb.STALE_BROKER_EPOCH, cpb.BROKER_ID_NOT_REGISTERED})
_RETRY_REGISTRATION = frozenset(
    {cpb.DUPLICATE_BROKER_REGISTRATION, cpb.REQUEST_TIMED_OUT, cpb.UNKNOWN_SERVER_ERROR}
)
REGISTER_TIMEOUT_S = 120.0  # beyond a session timeout (9 s by default) with room to spare
# One heartbeat attempt waits at most this many heartbeat intervals (and this long at least):
# a paused controller must not hold a heartbeat past the session timeout the next active
# controller counts from its start (Kafka's controller requests time out after 2 s too).
HEARTBEAT_ATTEMPT_INTERVALS = 2
HEARTBEAT_ATTEMPT_MIN_MS = 1_000
REGISTER_BACKOFF_S = 0.2
FENCED_HEARTBEAT_INTERVAL_MS = 50  # the heartbeat interval while fenced, at most
REGISTER_BACKOFF_MAX_S = 2.0


class RegistrationRefused(RuntimeError):
    """The controller refused the registration with an error that retrying does not pass
    (INVALID_REQUEST, say); the message names it."""


class BrokerState(enum.Enum):
    STARTING = "starting"  # not registered yet
    FENCED = "fenced"  # registered, catching up (or fenced by the controller)
    RUNNING = "running"  # unfenced
    SHUTTING_DOWN = "shutting-down"  # controlled shutdown asked for
    STOPPED = "stopped"


class BrokerLifecycle:
    """One broker's registration, heartbeats and shutdown. Use from the node's event loop."""

    def __init__(
        self,
        broker_id: int,
        listeners: Sequence[mpb.Listener],
        rack: str | None,
        client: ControllerClient,
        node: RaftNode,
        heartbeat_interval_ms: int,
    ) -> None:
        self.broker_id = broker_id
        self.incarnation_id = os.urandom(INCARNATION_ID_BYTES)
        self.listeners = list(listeners)
        self.rack = rack
        self.client = client
        self.node = node
        self.heartbeat_interval_s = heartbeat_interval_ms / 1000
        attempt_ms = max(
            HEARTBEAT_ATTEMPT_MIN_MS, HEARTBEAT_ATTEMPT_INTERVALS * heartbeat_interval_ms
        )
        self.heartbeat_policy = dataclasses.replace(client.policy, rpc_timeout_ms=attempt_ms)
        self.state = BrokerState.STARTING
        self.broker_epoch = -1
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self._skip_shutdown = asyncio.Event()
        # Told once, with the reason, if the heartbeats end other than by close(): the broker
        # cannot go on (module doc); the node stops.
        self.on_fatal: Callable[[str], None] | None = None

    async def start(self) -> None:
        """Register, then heartbeat in the background."""
        await self._register()
        self._task = asyncio.get_running_loop().create_task(
            self._heartbeats(), name=f"broker-{self.broker_id}-heartbeats"
        )
        self._task.add_done_callback(self._on_heartbeats_done)

    async def wait_for(self, state: BrokerState, timeout_s: float) -> None:
        async with asyncio.timeout(timeout_s):
            while self.state is not state:
                self._changed.clear()
                await self._changed.wait()

    async def shutdown(self, timeout_s: float) -> bool:
        """Controlled shutdown; True if the controller let the broker go in time (or no
        longer holds its registration). A broker that never registered just stops (False)."""
        registered = self.broker_epoch >= 0
        self._set_state(BrokerState.SHUTTING_DOWN)
        await self._stop_heartbeats()  # nothing else heartbeats, nor registers, from now on
        released = False
        try:
            if not registered:
                _log.info("broker %d: never registered; nothing to hand over", self.broker_id)
            else:
                released = await self._controlled_shutdown(timeout_s)
        finally:
            await self.close()
        return released

    def skip_controlled_shutdown(self) -> None:
        """End a controlled shutdown in progress (or the next one) at once: the broker stops
        without waiting for the controller (a second SIGTERM)."""
        self._skip_shutdown.set()

    async def close(self) -> None:
        await self._stop_heartbeats()
        self._set_state(BrokerState.STOPPED)

    # -- internals -------------------------------------------------------------------------
    async def _register(self) -> None:
        """Register, retrying what may pass: a previous process's session that has not
        expired yet (DUPLICATE_BROKER_REGISTRATION, after a restart) or a slow commit."""
        request = cpb.RegisterBrokerRequest(
            broker_id=self.broker_id,
            incarnation_id=self.incarnation_id,
            listeners=self.listeners,
            rack=self.rack or "",
        )
        backoff_s = REGISTER_BACKOFF_S
        async with asyncio.timeout(REGISTER_TIMEOUT_S):
            while True:
                response = await self.client.call("RegisterBroker", request)
                error = response.header.error
                if error == cpb.NONE:
                    break
                name = cpb.ErrorCode.Name(error)
                if error not in _RETRY_REGISTRATION:
                    raise RegistrationRefused(
                        f"broker {self.broker_id}: {name}: {response.header.message}"
                    )
                _log.info(
                    "broker %d: %s; registering again in %.1f s", self.broker_id, name, backoff_s
                )
                await asyncio.sleep(backoff_s)
                backoff_s = min(2 * backoff_s, REGISTER_BACKOFF_MAX_S)
        self.broker_epoch = response.broker_epoch
        self._set_state(BrokerState.FENCED)
        _log.info("broker %d registered with epoch %d", self.broker_id, self.broker_epoch)

    async def _stop_heartbeats(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])  # an error it ended with was logged by its callback

    def _on_heartbeats_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        error = task.exception()
        reason = f"heartbeats ended: {error!r}"
        if isinstance(error, RegistrationRefused):
            _log.error("broker %d: %s; it cannot go on", self.broker_id, reason)
        else:  # a bug
            _log.error("broker %d: %s", self.broker_id, reason, exc_info=error)
        if self.on_fatal is not None:
            self.on_fatal(f"broker {self.broker_id}: {reason}")

    async def _controlled_shutdown(self, timeout_s: float) -> bool:
        asking = asyncio.ensure_future(self._until_released())
        skipped = asyncio.ensure_future(self._skip_shutdown.wait())
        try:
            done, _ = await asyncio.wait(
                {asking, skipped}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for waiter in (asking, skipped):
                waiter.cancel()
            await asyncio.wait({asking, skipped})
        if asking in done:
            return asking.result()
        if skipped in done:
            _log.warning("broker %d: controlled shutdown skipped", self.broker_id)
        else:
            _log.warning(
                "broker %d: controlled shutdown timed out after %.0f s", self.broker_id, timeout_s
            )
        return False

    async def _until_released(self) -> bool:
        """Heartbeats with ``want_shutdown`` until the controller says ``should_shut_down``
        or that it holds no registration of this incarnation (then nothing is left to move)."""
        while True:
            response = await self._heartbeat(want_shutdown=True)
            if response is not None and response.header.error in _REREGISTER:
                name = cpb.ErrorCode.Name(response.header.error)
                _log.warning(
                    "broker %d: %s while shutting down; not registering again", self.broker_id, name
                )
                return True
            if response is not None and response.should_shut_down:
                return True
            await asyncio.sleep(min(self.heartbeat_interval_s, 0.1))

    async def _heartbeats(self) -> None:
        fenced_interval_s = min(self.heartbeat_interval_s, FENCED_HEARTBEAT_INTERVAL_MS / 1000)
        while True:
            response = await self._heartbeat(want_shutdown=False)
            if response is not None and response.header.error in _REREGISTER:
                name = cpb.ErrorCode.Name(response.header.error)
                _log.warning("broker %d: %s; registering again", self.broker_id, name)
                await self._register_again()
            elif response is not None and response.header.error == cpb.NONE:
                running = not response.is_fenced
                self._set_state(BrokerState.RUNNING if running else BrokerState.FENCED)
            fenced = self.state is BrokerState.FENCED
            await asyncio.sleep(fenced_interval_s if fenced else self.heartbeat_interval_s)

    async def _register_again(self) -> None:
        """Register until it works, backing off after a failure that may pass; a refusal
        (``RegistrationRefused``) ends the heartbeats (module doc)."""
        backoff_s = REGISTER_BACKOFF_S
        while True:
            try:
                await self._register()
                return
            except (ControllerUnavailable, TimeoutError) as e:
                _log.warning(
                    "broker %d: registering again failed: %s; trying again in %.1f s",
                    self.broker_id,
                    str(e) or f"no registration within {REGISTER_TIMEOUT_S:.0f} s",
                    backoff_s,
                )
            await asyncio.sleep(backoff_s)
            backoff_s = min(2 * backoff_s, REGISTER_BACKOFF_MAX_S)

    async def _heartbeat(self, want_shutdown: bool) -> cpb.BrokerHeartbeatResponse | None:
        """One heartbeat's answer (None when no controller answered); an error other than
        a lost registration is logged here, the caller handles the rest."""
        request = cpb.BrokerHeartbeatRequest(
            broker_id=self.broker_id,
            broker_epoch=self.broker_epoch,
            metadata_offset=self.node.applied_end,
            want_shutdown=want_shutdown,
        )
        try:
            response: cpb.BrokerHeartbeatResponse = await self.client.call(
                "BrokerHeartbeat", request, self.heartbeat_policy
            )
        except ControllerUnavailable as e:
            _log.warning("broker %d: heartbeat failed: %s", self.broker_id, e)
            return None
        error = response.header.error
        if error != cpb.NONE and error not in _REREGISTER:
            _log.warning("broker %d: heartbeat refused: %s", self.broker_id, response.header)
        return response

    def _set_state(self, state: BrokerState) -> None:
        if state is not self.state:
            _log.info("broker %d: %s -> %s", self.broker_id, self.state.value, state.value)
            self.state = state
        self._changed.set()
