"""The rollout engine as a receiver: a real vLLM in a process and environment of its own (`host`, run by the
engine's interpreter), driven from rank 0 (`client`) over pipes, weights crossing in shared-memory buckets
(`buckets`). Nothing here is imported at package import: the launcher stays free of torch."""
