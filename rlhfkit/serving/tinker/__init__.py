"""Thinking Machines' Tinker API served by rlhfkit: the official `tinker` SDK, pointed at this
server with `TINKER_BASE_URL`, trains and samples from models on the machine that runs it.

`wire` reads and writes the SDK's protobuf messages, `losses` maps the SDK's built-in loss
names to rlhfkit's core losses, `host` holds the models (one shared base with a LoRA adapter
per training client, or full copies), their optimizers and checkpoints, `sampling` its sampling
of several clients' requests in one engine call, `scoring` the prompt and top-k logprobs a sample
request asks for, `images` the image chunks of a vision-language model's inputs, and `app` is
the HTTP server (routes, API key, size limits, futures).
"""
