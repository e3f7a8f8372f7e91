"""Live weight-sync paths: sender and receiver adapters, byte buckets, chunked broadcast and sparse deltas.

Below the rank floor: senders and receivers get the RankContext as an argument and never import convcheck.rank.
"""
