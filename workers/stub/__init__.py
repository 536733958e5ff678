"""The stub (simulation) engine: scheduling tests and benchmarks, never results.

    adapter.py   StubAdapter: the EngineAdapter for EngineKind.STUB
    server.py    `python -m workers.stub.server`: the seam's HTTP API with timed dummy tokens
"""
