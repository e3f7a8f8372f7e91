"""Multi-launch workflows built on the API (launcher side): the selftest, the gate runner, version folders."""
