"""Example environments; each file is also a valid `--agent.func_path` (or `builtin:NAME`)."""
