"""The SGLang engine, all its pieces together (one folder behind the `workers.adapter.EngineAdapter` interface):

    adapter.py          SGLangAdapter: the EngineAdapter for EngineKind.SGLANG (argv, env, observer, plan-time rules)
    rules.py            what SGLang refuses or silently overrides, checked at plan time; its context accounting
    startup_rules.py    what its parser lets through but its start-up refuses (fa3 arch, torch_native verify, weights)
    argv.py             the one argv builder (`build_sglang_argv`), env, and the server args /server_info reports
    observe.py          what is read around each run: /server_info tags, accept-length cross-check, plugin counters
    cpu.py              engine=sglang_cpu: SGLang's CPU backend in its own interpreter (this host's ISA, the interpreter)
    backports.py        fixes SGLang released after 0.5.18, applied to an installed 0.5.18 (make setup-sglang)
    plugin_counter_deltas.py
                        the specsweep_verify plugin's dispatch counters read from /metrics, their deltas per run
    launch.py           `python -m workers.sglang.launch`: sglang.launch_server with the kernel plugin registered
    argcheck.py         `python -m workers.sglang.argcheck`: SGLang's own parser over our argv (tests, preflight)

Kept empty so that `python -m workers.sglang.launch` imports nothing it does not need.
"""
