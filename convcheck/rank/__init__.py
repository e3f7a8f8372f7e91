"""One rank's world: process groups, the bridge, the loaded sharded model, and the context oracles receive."""

from convcheck.rank.bringup import RankSpec, bring_up, quiet
from convcheck.rank.context import RankContext

__all__ = ["RankContext", "RankSpec", "bring_up", "quiet"]
