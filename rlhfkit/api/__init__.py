"""The public Python API."""
