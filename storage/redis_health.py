"""Counters of the Redis tier: the TierStats every tier keeps, plus one NodeHealth per Redis node
(a cluster master, or the one server), keyed "host:port". Plain fields; exported at the edge."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from storage.base import TierStats


@dataclass
class NodeHealth:
    up: bool = True  # False from a failure until a later call to the node succeeds
    errors: int = 0  # connection errors, timeouts, error replies
    breaker_opens: int = 0
    skipped_calls: int = 0  # calls that left this node out while it cooled down
    rejected_writes: int = 0  # blocks of its slots it did not take: down or failing
    handed_off: int = 0  # of those, blocks written to a stand-in key on another node
    redirects: int = 0  # MOVED / ASK replies (slots moved: the topology was reread)
    blocks_read: int = 0
    blocks_written: int = 0
    open_until: float = float("-inf")  # breaker open (node skipped) while clock() < open_until

    def snapshot(self) -> dict[str, int]:
        out = asdict(self)
        out["up"] = int(self.up)
        del out["open_until"]
        return out


@dataclass
class RedisStats(TierStats):
    topology_refreshes: int = 0
    nodes: dict[str, NodeHealth] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # dataclasses.replace(stats) is how a snapshot is taken (TieredStore.stats): the copy gets
        # nodes of its own (one atomic list() of the live dict, each NodeHealth copied)
        self.nodes = {name: replace(h) for name, h in list(self.nodes.items())}

    def snapshot(self) -> dict[str, Any]:
        nodes = list(self.nodes.items())  # one atomic copy: the I/O threads may add a node
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["nodes"] = {name: h.snapshot() for name, h in sorted(nodes)}
        out["nodes_up"] = sum(h.up for _, h in nodes)
        out["nodes_down"] = len(nodes) - out["nodes_up"]
        return out
