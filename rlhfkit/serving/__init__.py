"""Servers that expose rlhfkit's training to other clients' loops (see `serving.tinker`)."""
