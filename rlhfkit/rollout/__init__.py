"""The GenerationEngine protocol, SamplingParams, the HF engine and the vLLM engine.
May import core, models and data (docs/architecture.md)."""
