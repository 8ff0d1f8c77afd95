"""Engine replicas as this proxy worker sees them: health, what each serves, in-flight calls, affinity.

Pure bookkeeping, no I/O: :class:`proxy.routing.Router` probes the engines and loads
adapters, and tells this module what it learned; :mod:`proxy.calls` asks it where
to send a call and reports how that went.

A replica is *in rotation* while ``up``. It leaves rotation at once when a call
cannot connect to it (refused, or the connect timed out), or after
:data:`FAILS_TO_EJECT` failed calls in a row (5xx answers, connections reset before
any response header); the probe brings it back once it
answers ``GET /v1/models`` again and holds every adapter version the routing needs
(the Router loads them first), after a 5xx streak no sooner than
:data:`HOLD_AFTER_5XX_S` (an engine can list its models and still fail every call).
A call for ``served`` (an engine-side model name:
the base model or ``alias@vN``) goes only to a replica in rotation that lists that
name and is not excluded from it (:meth:`ReplicaSet.exclude`, e.g. a replica that
failed attestation for one version). A check never black-holes a model: an exclusion
that would leave ``served`` no other replica to go to is refused (the replica is only
marked ``suspect`` and keeps serving; the caller alerts), and should the replicas
that still may serve it all be tried or gone, the excluded ones are tried last.

Choosing among them: a session's calls go to the replica that served its previous
call while that replica qualifies (the engine's prefix cache then reuses the
conversation); a new session goes to the replica with the fewest calls in flight,
ties broken in turn. Affinity and in-flight counts are this worker's memory: with
several proxy workers or proxy replicas each keeps its own, keyed by session id, so
a session's turns stay on one engine as long as they reach the same worker.

Fallbacks, so that bookkeeping never makes a call fail that could have succeeded:
when no replica in rotation lists ``served``, any replica in rotation is tried (the
caller loads a missing adapter on 404); when none is in rotation at all, every
replica is tried (one may have come back before the probe saw it).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

FAILS_TO_EJECT = 3  # failed calls in a row before a replica leaves rotation (one refused connect is enough)
HOLD_AFTER_5XX_S = 30.0  # it answers probes while it fails calls: the probe does not bring it back before this
AFFINITY_SESSIONS = 65_536  # sessions whose replica this worker remembers (least recently used forgotten)


@dataclass(eq=False)
class Replica:
    """One engine replica: its health, what it lists, and what this worker sends it."""

    url: str
    up: bool = False  # in rotation
    models: set[str] = field(default_factory=set)  # what GET /v1/models listed last, plus what we loaded since
    bases: set[str] = field(default_factory=set)  # the listed models without a parent (base models)
    excluded: set[str] = field(default_factory=set)  # served names this replica must not serve
    suspect: set[str] = field(default_factory=set)  # failed a check, kept serving: no other replica had it
    inflight: int = 0
    fails: int = 0  # consecutive failed calls
    last_error: str | None = None
    since: float = field(default_factory=time.time)  # when ``up`` last changed
    held_until: float = 0.0  # not back in rotation before this (time.time()), after a 5xx streak

    @property
    def adapters(self) -> set[str]:
        return self.models - self.bases

    def state(self, needed: set[str]) -> dict[str, Any]:
        """What /readyz shows for this replica; ``needed``: the engine-side names routing needs now."""
        return {
            "state": "up" if self.up else "down",
            "since": round(self.since, 3),
            "inflight": self.inflight,
            "adapters": sorted(self.adapters),
            "missing": sorted(needed - self.models),
            "excluded": sorted(self.excluded),
            "suspect": sorted(self.suspect),
            "last_error": self.last_error,
        }


class ReplicaSet:
    """All replicas of one proxy worker, and the session → replica affinity."""

    def __init__(self, urls: list[str]) -> None:
        self.replicas = [Replica(u) for u in urls]
        self.by_url = {r.url: r for r in self.replicas}
        self._affinity: OrderedDict[str, Replica] = OrderedDict()
        self._turn = 0

    # ---- choosing -------------------------------------------------------------------
    def pick(self, served: str, session: str | None = None, tried: frozenset[str] = frozenset()) -> Replica | None:
        """The replica for one call to ``served`` (None: every replica was tried)."""
        untried = [r for r in self.replicas if r.url not in tried]
        # Excluded replicas come last, never not at all: a health verdict must not answer a call 502.
        candidates = [r for r in untried if served not in r.excluded] or untried
        ready = [r for r in candidates if r.up and served in r.models]
        if not ready:
            ready = [r for r in candidates if r.up] or candidates
        if not ready:
            return None
        if session is not None:
            previous = self._affinity.get(session)
            if previous is not None and previous in ready:
                self._affinity.move_to_end(session)
                return previous
        least = min(r.inflight for r in ready)
        tied = [r for r in ready if r.inflight == least]
        self._turn += 1
        return tied[self._turn % len(tied)]

    def any_up(self) -> Replica:
        """A replica for a call that needs no adapter and no session (tokenize): least loaded in rotation."""
        replica = self.pick("", None)
        assert replica is not None, "at least one replica is configured"
        return replica

    def remember(self, session: str, replica: Replica) -> None:
        """``session``'s next call should go to ``replica`` (it served this one)."""
        self._affinity[session] = replica
        self._affinity.move_to_end(session)
        if len(self._affinity) > AFFINITY_SESSIONS:
            self._affinity.popitem(last=False)

    # ---- what calls and probes report -------------------------------------------------
    def succeeded(self, replica: Replica) -> None:
        replica.fails = 0

    def failed(self, replica: Replica, error: str, *, eject: bool) -> bool:
        """A call failed on ``replica``; ``eject``: at once (it could not connect). True if it left rotation now."""
        replica.fails += 1
        replica.last_error = error
        if replica.up and (eject or replica.fails >= FAILS_TO_EJECT):
            self._set_up(replica, False)
            if not eject:
                replica.held_until = replica.since + HOLD_AFTER_5XX_S
            return True
        return False

    def answered(self, replica: Replica, listing: list[dict[str, Any]]) -> None:
        """A probe's fresh ``GET /v1/models`` data (the replica may still be out of rotation: see :meth:`admit`)."""
        replica.models = {m["id"] for m in listing}
        replica.bases = {m["id"] for m in listing if not m.get("parent")}

    def admit(self, replica: Replica) -> bool:
        """Back into rotation (the Router loaded what it needs) unless held after a 5xx streak. True if it was out."""
        if not replica.up and time.time() < replica.held_until:
            return False
        replica.fails = 0
        if not replica.up:
            self._set_up(replica, True)
            return True
        return False

    def unreachable(self, replica: Replica, error: str) -> bool:
        """A probe got no answer. True if the replica left rotation now."""
        replica.last_error = error
        if replica.up:
            self._set_up(replica, False)
            return True
        return False

    def exclude(self, url: str, served: str) -> bool:
        """Send calls for ``served`` to other replicas (until :meth:`include`), e.g. this one failed attestation.

        Refused (False) when no other replica in rotation lists ``served`` and may serve it: the replica
        is then only marked ``suspect`` and keeps serving, so a check never leaves a model without one.
        """
        replica = self.by_url[url]
        others = [
            r for r in self.replicas if r is not replica and r.up and served in r.models and served not in r.excluded
        ]
        if not others:
            replica.suspect.add(served)
            return False
        replica.excluded.add(served)
        replica.suspect.discard(served)
        return True

    def include(self, url: str, served: str) -> None:
        """``served`` passed its check again on this replica: back in rotation for it, no longer suspect."""
        self.by_url[url].excluded.discard(served)
        self.by_url[url].suspect.discard(served)

    def servable(self, served: str) -> bool:
        """Whether a replica in rotation lists ``served`` and is neither excluded from it nor suspect."""
        return any(r.up and served in r.models and served not in r.excluded | r.suspect for r in self.replicas)

    def _set_up(self, replica: Replica, up: bool) -> None:
        replica.up = up
        replica.since = time.time()

    # ---- views ------------------------------------------------------------------------
    @property
    def live(self) -> list[Replica]:
        return [r for r in self.replicas if r.up]

    def loaded_on(self, served: str) -> list[str]:
        """The replicas that list ``served`` now."""
        return [r.url for r in self.replicas if served in r.models]

    def export(self, metrics: Any) -> None:
        """Per-replica gauges, set when /metrics is read (no per-call cost)."""
        for r in self.replicas:
            metrics.upstream_up.labels(r.url).set(1 if r.up else 0)
            metrics.upstream_inflight.labels(r.url).set(r.inflight)
            metrics.upstream_adapters.labels(r.url).set(len(r.adapters))
