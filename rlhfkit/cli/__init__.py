"""The rlhfkit commands: parse flags, check inputs, call api.
May import every package; nothing imports cli (docs/architecture.md)."""
