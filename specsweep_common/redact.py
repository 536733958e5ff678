"""Secrets never leave the driver in the clear: MLflow params, run names, tags, artifacts and log lines see `***`.

What is a secret:
- every value under `engine.env` (an environment variable of the engine process);
- the value of a sensitive flag in an argv (`engine.extra_args`, `drafter.extra_args`): a flag with a name part
  `api-key`/`apikey`, `secret`, `password`/`passwd`, `credential(s)`, or ending in the word `token`/`auth`
  (`--api-key K`, `--hf-token=T`; not `--max-total-tokens`, `--tokenizer-path` or `engine.stub.token_s`);
- the password of a URI (`https://user:PASS@host`) and the value of a sensitive query parameter (`?token=T`,
  `&api_key=K`, `&sig=S`), anywhere in a string (tracking.uri included);
- in any text, the value of `key=VALUE` whose dotted config key is one of the above (`engine.env.HF_TOKEN=T` in a
  run name, an override list, a log line), whatever its length.

This module alone decides what is secret; it is applied where text leaves the process or enters the store, not
while planning (the plan keeps the real values, and the engine gets them):
- the store: `orchestrator.results.tracking.Tracker` (every name, param, tag and artifact it writes; the one module
  that writes plan data to MLflow, tests/orchestrator/test_secrets.py checks that no other does);
- the terminal: `RedactingStream` on the command line's stdout and stderr (`orchestrator/__main__.py`);
- an engine's argv in its log (`workers/engine_process.py`), and a refusal's text (`specsweep_common.problem.Problem`).
The one exception is a run's name (`orchestrator.config.plan.build_name`), a label that other processes (the Ray
actors) log: it is built from redacted overrides. Redaction is structural where the structure is known
(`redact_config`, `redact_param`, `redact_override`, `redact_argv`) and by value everywhere else: `secret_values`
collects the literal secrets of the servers a plan starts, and `scrub` replaces them in any text (engine log
tails, failure messages). `run_hash` is computed from the real values (a sha256; it stores no value).
"""

from __future__ import annotations

import functools
import re
from typing import Any, Iterable, Mapping, Sequence

MASK = "***"
ENV_PREFIX = "engine.env"
MIN_SCRUB_LEN = 8  # shorter values ("1", "true", a short path) are only redacted where the structure marks them

# A name is sensitive when one of its words (split on - _ .) is one of these, or its last word is "token"
# (HF_TOKEN, --hf-token, --token; not --max-total-tokens, engine.stub.token_s, --tokenizer-path).
_ANYWHERE = re.compile(r"(?:^|[-_.])(?:api[-_.]?key|apikey|secret|password|passwd|credentials?|private[-_.]key|"
                       r"access[-_.]key)(?:$|[-_.])", re.IGNORECASE)
_LAST_WORD = re.compile(r"(?:^|[-_.])(?:token|auth)$", re.IGNORECASE)
# --flag VALUE / --flag=VALUE / "--flag", "VALUE" (a flattened JSON list) / [--flag,VALUE] (a Hydra override)
_FLAG_VALUE = re.compile(r"""(--[\w-]+)(["']?(?:=|[\s,]+)["']?)(?!--)([^"',\]\s]+)""")
_URI_PASSWORD = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@'\"]*:)([^@\s/'\"]+)(@)")
# key=VALUE where the key is a dotted config key (an override, a run name's part, a log line): the key decides
_CONFIG_KEY_VALUE = re.compile(r"""(?<![\w.-])([+~]?[A-Za-z_][\w.]*)=(["']?)([^\s\]'"&;#]+)""")  # a sweep's a,b too
_QUERY_SECRET = re.compile(r"([?&][^=&\s]*?(?:token|key|secret|password|passwd|credential|sig|signature)[^=&\s]*=)"
                           r"([^&\s#'\"]+)", re.IGNORECASE)


def is_sensitive_name(name: str) -> bool:
    """`--api-key`, `hf_token`, `db.password` -> True; `--max-total-tokens`, `--tokenizer-path` -> False."""
    name = name.lstrip("-+~")
    return bool(_ANYWHERE.search(name) or _LAST_WORD.search(name))


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """Sensitive flag values, URI passwords, sensitive query values and every literal of `secrets` -> ***."""
    text = _URI_PASSWORD.sub(lambda m: m.group(1) + MASK + m.group(3), text)
    text = _QUERY_SECRET.sub(lambda m: m.group(1) + MASK, text)
    text = _FLAG_VALUE.sub(lambda m: m.group(1) + m.group(2) + MASK if is_sensitive_name(m.group(1)) else m.group(0),
                           text)
    text = _CONFIG_KEY_VALUE.sub(lambda m: f"{m.group(1)}={m.group(2)}{MASK}" if is_secret_path(m.group(1).lstrip("+~"))
                                 else m.group(0), text)
    return scrub(text, secrets)


def scrub(text: str, secrets: Iterable[str]) -> str:
    for s in sorted(set(secrets), key=len, reverse=True):  # longest first: a secret containing another
        if len(s) >= MIN_SCRUB_LEN:
            text = text.replace(s, MASK)
    return text


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A copy of an argv with the value of every sensitive flag and every URI credential masked."""
    out: list[str] = []
    mask_next = False
    for a in argv:
        if mask_next and not a.startswith("--"):
            out.append(MASK)
            mask_next = False
            continue
        mask_next = False
        flag, eq, _ = a.partition("=")
        if a.startswith("--") and is_sensitive_name(flag):
            if eq:
                out.append(f"{flag}={MASK}")
            else:
                out.append(a)
                mask_next = True
            continue
        out.append(redact_text(a))
    return out


def argv_secrets(argv: Sequence[str]) -> list[str]:
    """The literal values `redact_argv` masks."""
    found = []
    for orig, red in zip(argv, redact_argv(argv)):
        if orig != red:
            found.append(orig.partition("=")[2] if orig.startswith("--") else orig)
    return [s for s in found if s]


def uri_secrets(text: str) -> list[str]:
    return [m.group(2) for m in _URI_PASSWORD.finditer(text)] + [m.group(2) for m in _QUERY_SECRET.finditer(text)]


def is_secret_path(path: str) -> bool:
    """A dotted config key whose value is a secret: under `engine.env`, or a sensitive last word."""
    return path == ENV_PREFIX or path.startswith(ENV_PREFIX + ".") or is_sensitive_name(path.rsplit(".", 1)[-1])


def redact_config(value: Any, path: str = "") -> Any:
    """A copy of a nested config (dicts, lists, scalars) with every secret masked; `path` is its dotted key."""
    if isinstance(value, Mapping):
        if path == ENV_PREFIX:
            return {k: MASK for k in value}
        return {k: redact_config(v, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
    if path and is_secret_path(path) and value not in (None, "", [], ()):
        return MASK
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, str) for v in value):
            return redact_argv(value)
        return [redact_config(v, path) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    return value


def redact_param(key: str, value: str, secrets: Iterable[str] = ()) -> str:
    """One flattened `(a.b.c, value)` pair's value: a secret key's -> ***, secrets inside a value (argv lists, URIs,
    overrides, the literal `secrets`) -> ***."""
    return MASK if is_secret_path(key) and value not in ("", "null", "{}") else redact_text(value, secrets)


def redact_params(params: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """Flattened `(a.b.c, value)` pairs, each through `redact_param`."""
    return tuple((k, _redact_param_cached(k, v)) for k, v in params)


@functools.lru_cache(maxsize=65536)  # a grid's points share most (key, value) pairs: each is redacted once
def _redact_param_cached(k: str, v: str) -> str:
    return redact_param(k, v)


def redact_override(override: str) -> str:
    """`engine.env.HF_TOKEN=x` -> `engine.env.HF_TOKEN=***`; `engine.extra_args=[--api-key,K]` -> `[--api-key,***]`."""
    key, eq, value = override.partition("=")
    if not eq:
        return override
    if is_secret_path(key.lstrip("+~")):
        return f"{key}={MASK}"
    return f"{key}={redact_text(value)}"


def secret_values(engines: Iterable[Any]) -> set[str]:
    """Literal secrets of `EngineSpec`/`DrafterSpec`-like objects: env values, sensitive argv values, URI passwords."""
    out: set[str] = set()
    for e in engines:
        out.update(v for _, v in getattr(e, "env", ()) if v)
        argv = tuple(getattr(e, "extra_args", ()))
        out.update(argv_secrets(argv))
        for a in argv:
            out.update(uri_secrets(a))
    return out


def plan_secrets(plan: Any) -> set[str]:
    """Every literal secret the servers of an `orchestrator.config.plan.Plan` are started with."""
    return secret_values(x for g in plan.groups for x in (g.server.engine, g.server.drafter))


def override_secrets(overrides: Iterable[str]) -> set[str]:
    """The literal secrets of command-line overrides: the value of a secret key (`engine.env.HF_TOKEN=T`) and the
    value of each sensitive flag in a list (`engine.extra_args=[--api-key,K]`), quotes stripped."""
    out: set[str] = set()
    for override in overrides:
        key, eq, value = override.partition("=")
        if not eq:
            continue
        if is_secret_path(key.lstrip("+~")):
            out.add(value.strip("'\""))
            continue
        if value.startswith("["):  # an argv list: [--api-key,K] or ['--api-key=K']
            out.update(argv_secrets([v.strip(" '\"") for v in value.strip("[]").split(",")]))
        out.update(uri_secrets(value))
    return {s for s in out if s}


class RedactingStream:
    """A text stream that writes through `redact_text(..., secrets)`: the process's one output boundary (stdout and
    stderr of the command line), so that Hydra's own "Error executing job with overrides" line, log lines, the
    progress display and exception messages never carry a secret given on the command line. Whole writes are
    redacted (a secret split across two writes is not seen: Python's logging and print write a line at once)."""

    def __init__(self, stream: Any, secrets: Iterable[str]):
        self._stream, self._secrets = stream, tuple(secrets)

    def write(self, text: str) -> int:
        self._stream.write(redact_text(text, self._secrets))
        return len(text)

    def __getattr__(self, name: str) -> Any:  # flush, fileno, isatty, encoding, ...
        return getattr(self._stream, name)
