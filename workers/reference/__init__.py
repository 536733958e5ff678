"""The reference engine: a small PyTorch speculative-decoding server with SGLang's CLI flags and HTTP API.

Batch 1 (one request at a time), CPU by default. See docs/engine.md.
"""
