"""One rank's world: process groups, the bridge, the loaded sharded model, and the context oracles receive."""
