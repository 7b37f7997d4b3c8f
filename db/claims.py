"""One tuner per key across `tune run` processes and hosts: a process claims a key in the
database before tuning it, and holds the claim by its heartbeat (tuner.db.liveness) until it
lets go. A claim whose holder is dead by the liveness rule is taken over by the next
claimant: at once where the holder was a process of this host, after CLAIM_LEASE's grace
otherwise."""
from __future__ import annotations

from tuner.db.liveness import CLAIM_LEASE, Heartbeat, Lease, Owner


class ClaimKeeper:
    """This process's claims (Store.claim and its kin), held by one heartbeat."""

    def __init__(self, store, lease: Lease = CLAIM_LEASE):
        self.store, self.lease = store, lease
        # a token of its own: two keepers, or a later process given the same pid, are two
        # owners
        self.owner = str(Owner.this_process(token=True))
        self.heartbeat = Heartbeat(lambda keys: store.heartbeat(keys, self.owner),
                                   lease.beat_s, "claim-heartbeat")

    def claim(self, key: str) -> bool:
        """Whether this process now holds the key: it was free, its holder's lease ran out,
        or its holder is a process of this host that is gone."""
        taken = self.store.claim(key, self.owner, self.lease.grace_s)
        if not taken:
            holder = self.store.claim_owner(key)
            dead = Owner.parse(holder)
            taken = bool(dead and dead.gone and self.store.take_over(key, holder, self.owner))
        if taken:
            self.heartbeat.hold(key)
        return taken

    def release(self, key: str) -> None:
        self.heartbeat.drop(key)
        self.store.release(key, self.owner)

    def close(self) -> None:
        self.heartbeat.stop()
        for key in self.heartbeat.held():
            self.release(key)
