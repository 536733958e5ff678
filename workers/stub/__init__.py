"""The stub (simulation) engine: scheduling tests and benchmarks, never results.

    adapter.py   StubAdapter: the EngineAdapter for EngineKind.STUB
    rules.py     its plan-time rules (timing through engine.stub.*, not engine.extra_args)
    server.py    `python -m workers.stub.server`: the seam's HTTP API with timed dummy tokens
"""
