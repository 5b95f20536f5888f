"""Ray rollout workers, the engine pool over them, the trainer actor and the async pipeline."""
