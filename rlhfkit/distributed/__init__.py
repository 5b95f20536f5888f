"""Ray rollout workers, the engine pool, the async rollout source, FSDP2, rank reductions, sharded checkpoints.
May import core, trainers, rollout, models and data (docs/architecture.md)."""
