"""The bad-input battery's inputs (tools/bench_badinput.py), by class: each leaf's declared domain, the config's
cross-field rules, files and paths.

Each `Case` is one command line, run in a fresh temp dir; `runs=True` marks an input a user would expect to run
(the controls). Faults, secrets and the reference engine's HTTP add theirs to `FAULT_CASES` below.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SGLANG = ("engine=sglang", "model=qwen3-8b", "attention=triton")
SCHED = ("--schedule-dir", "sched", "list")
SCHED_CHECK = ("--schedule-dir", "sched", "check")  # `list` composes no grid: a grid point's value is `check`'s
SMOKE_SCHEDULE = "cron: '0 2 * * *'\noverrides: ['+sweep=smoke']\n"


@dataclass(frozen=True)
class Case:
    label: str  # what the user got wrong
    args: tuple[str, ...]
    module: str = "orchestrator"
    files: dict[str, str] = field(default_factory=dict)  # written into the case's working dir first
    listen: bool = False  # a TCP listener that never answers; "{port}" in args is its port
    closed_port: bool = False  # "{port}" is a port nothing listens on
    serve404: bool = False  # "{port}" is a web server answering 404 to everything
    runs: bool = False  # a user would expect it to run (exit 0)


BASE_CASES = (
    Case("value out of range (single run)", ("page_size=0",)),
    Case("value out of range in 8 grid points", ("+sweep=smoke", "page_size=0,16")),
    Case("typo'd key", ("+sweep=smoke", "contxt_len=2048")),
    Case("typo'd engine.stub key", ("engine=stub", "engine.stub.tokn_s=0.01")),
    Case("typo'd key with `+`, another engine selected", ("+engine.sglang.mem_frac=0.5",)),
    Case("unknown config group option", ("+sweep=smoke", "attention=bogus")),
    Case("drafter the engine lacks", ("drafter=eagle3",)),
    Case("draft model path missing", ("drafter=draft_model",)),
    Case("draft model with another vocabulary", ("drafter=draft_model", "drafter.draft_model_path=tiny-draft")),
    Case("log pattern without a named group", ("+sweep=smoke", r"metrics.log_patterns=['commit=\d+']")),
    Case("probe file missing", ("probe=file", "probe.path=missing.txt")),
    Case("probe file empty", ("probe=file", "probe.path=empty.txt"), files={"empty.txt": ""}),
    Case("probe JSONL without text", ("probe=file", "probe.path=p.jsonl"), files={"p.jsonl": '{"prompt": "x"}\n'}),
    Case("single run above the model's context", ("context_len=65536",)),
    Case("sweep with every point above the context", ("+sweep=smoke", "context_len=40000,50000")),
    Case("tp_size=16 on this machine (cluster=local)", (*SGLANG, "tp_size=16")),
    Case("reference engine on cuda, cluster=local", ("engine.device=cuda",)),
    Case("multi-node server, cluster=local", ("engine=stub", "tp_size=2", "nnodes=2")),
    Case("dry run, tp_size=16 > cluster=ray's gpus_per_node", ("+sweep=smoke", *SGLANG, "cluster=ray", "tp_size=16",
                                                              "hydra.launcher.dry_run=true")),
    Case("tracking server refusing connections", ("tracking=server", "tracking.uri=http://127.0.0.1:{port}"),
         closed_port=True),
    Case("tracking server that never answers", ("tracking=server", "tracking.uri=http://127.0.0.1:{port}"),
         listen=True),
    Case("tracking host that does not resolve", ("tracking=server", "tracking.uri=http://mlflow.invalid:5000")),
    Case("tracking=server without tracking.uri", ("tracking=server",)),
    Case("SQLite store in a missing folder", ("tracking.uri=sqlite:///no/such/dir/mlflow.db",)),
    Case("schedule with page_size=0", SCHED_CHECK, module="orchestrator.schedule",
         files={"sched/nightly.yaml": "cron: '0 2 * * *'\noverrides: ['+sweep=smoke', 'page_size=0']\n"}),
    Case("(control) single-run dry run", ("hydra.launcher.dry_run=true",), runs=True),
)

# every leaf has a declared domain (orchestrator/config/domains.py)
DOMAIN_CASES = tuple(Case(f"domain: {o}", (*pre, o)) for pre, o in (
    ((), "engine.startup_timeout_s=-5"), ((), "engine.request_timeout_s=0"), ((), "engine.request_timeout_s=nan"),
    (("engine=stub",), "engine.stub.token_s=inf"), ((), "cluster.num_cpus=0"), ((), "cluster.cpus_per_server=-1"),
    ((), "cluster.num_gpus=-1"), ((), "cluster.max_retries=-1"), (("engine=stub",), "cluster.max_concurrent_servers=0"),
    ((), "report.novel_gap=nan"), ((), f"seed={2 ** 64}"), ((), "page_size=100000000"),
    (("engine=stub",), "probe.concurrency=5000"), ((), "model.dtype=float8")))
NAME_CASES = (
    Case("name: sweep_name with a path", ("sweep_name=../../x",)),
    Case("name: empty experiment name", ("tracking.experiment_name=''",)),
)
FLAG_CASES = (
    Case("owned flag: engine.extra_args=[--host,0.0.0.0]", ("engine.extra_args=[--host,0.0.0.0]",)),
    Case("owned flag: --context-length via extra_args", ("engine=stub", "engine.extra_args=[--context-length,99999]")),
    Case("owned flag: drafter.extra_args sets --speculative-num-steps",
         ("drafter=ngram", "drafter.extra_args=[--speculative-num-steps,9]")),
    Case("unknown reference-engine flag", ("engine.extra_args=[--no-such-flag,1]",)),
)
RESOURCE_CASES = (
    Case("store: a text file posing as SQLite", ("tracking.uri=sqlite:///fake.db",),
         files={"fake.db": "not a database\n" * 50}),
    Case("store: a directory as the SQLite file", ("tracking.uri=sqlite:///store.db",), files={"store.db/x": ""}),
    Case("store: unknown scheme", ("tracking.uri=gopher://h/x",)),
    Case("store: MLflow's deprecated file store", ("tracking.uri=file:./mlruns",)),
    Case("store: a web server answering 404", ("tracking=server", "tracking.uri=http://127.0.0.1:{port}"),
         serve404=True),
    Case("cluster.address nothing answers", ("cluster=ray", "cluster.address=127.0.0.1:{port}"), closed_port=True),
    Case("probe file larger than any context needs", ("probe=file", "probe.path=big.txt"),
         files={"big.txt": "word " * 300_000}),
    Case("probe path is a folder", ("probe=file", "probe.path=d"), files={"d/x": ""}),
)
SCHEDULE_CASES = (
    Case("schedule: a cron that never fires (31 Feb)", SCHED, module="orchestrator.schedule",
         files={"sched/feb.yaml": "cron: '0 0 31 2 *'\noverrides: ['+sweep=smoke']\n"}),
    Case("schedule: NaN misfire_grace", SCHED, module="orchestrator.schedule",
         files={"sched/n.yaml": SMOKE_SCHEDULE + "misfire_grace: .nan\n"}),
    Case("schedule: name with a path", SCHED, module="orchestrator.schedule",
         files={"sched/n.yaml": SMOKE_SCHEDULE + "name: ../x\n"}),
    Case("schedule: .yml file with page_size=0", SCHED_CHECK, module="orchestrator.schedule",
         files={"sched/n.yml": "cron: '0 2 * * *'\noverrides: ['+sweep=smoke', 'page_size=0']\n"}),
    Case("schedule: folder does not exist", ("--schedule-dir", "nope", "list"), module="orchestrator.schedule"),
    Case("(control) schedule list", SCHED, module="orchestrator.schedule", files={"sched/ok.yaml": SMOKE_SCHEDULE},
         runs=True),
)
GRID_CASES = (
    Case("(control) duplicate points run once, with a warning",
         ("+sweep=smoke", "page_size=16,16", "hydra.launcher.dry_run=true"), runs=True),
    Case("grid: one config group given two values", ("model=tiny", "model=smollm2-135m")),
    Case("grid: a group as a choice and as +group", ("model=tiny", "+model=smollm2-135m")),
    Case("grid: +group for a group config.yaml selects", ("+model=tiny",)),
    Case("grid: a sweep axis given twice", ("+sweep=smoke", "drafter=ngram", "drafter=oracle")),
    Case("grid: a plain key given two values", ("+sweep=smoke", "seed=1,2", "seed=3")),
    Case("(control) an 8,000-point grid validates and plans (dry run, plan lines not logged)",
         ("+sweep=smoke", "engine=stub", "context_len=range(256,2816,256)", "seed=range(0,200)",
          "probe=predictable,novel", "drafter=ngram,oracle", "hydra.launcher.dry_run=true", "hydra/job_logging=disabled"),
         runs=True),  # logging off: its 8,000 plan lines would fill the pipe the battery reads at the end
    Case("(control) schedule list of a 2,000-point grid composes no grid", SCHED, module="orchestrator.schedule",
         files={"sched/big.yaml": "cron: '0 2 * * *'\noverrides: ['+sweep=smoke', 'seed=range(0,250)']\n"},
         runs=True),
)
MODEL_CASES = (
    Case("model fact overridden: max_context_len=16384 on the 8k SmolLM2", ("model.max_context_len=16384",)),
    Case("context past what the model was trained for", ("context_len=16000",)),
    Case("model path: a truncated GGUF", ("model.path=cut.gguf",), files={"cut.gguf": "GGUF\x03\x00"}),
    Case("model path: a folder of garbage", ("model.path=junk",), files={"junk/w.bin": "garbage"}),
)
# faults, secrets, the reference engine's HTTP: their cases go here.
FAULT_CASES: tuple[Case, ...] = ()

CASES = (BASE_CASES + DOMAIN_CASES + NAME_CASES + FLAG_CASES + RESOURCE_CASES + SCHEDULE_CASES + GRID_CASES
         + MODEL_CASES + FAULT_CASES)



