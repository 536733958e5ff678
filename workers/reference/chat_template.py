"""Chat templates for the reference engine's /v1/chat/completions: where a model's template comes from, and rendering.

    load_chat_template(model_path) -> ChatTemplate | None
    render_chat(template, messages, add_generation_prompt=True, **kwargs) -> str
    reference_chat_frame(model_path, task) -> (head, tail)   a probe.task prompt's frame (its adapter's prompt_encoding)
    frame_tokens(model_path, task) -> int                    its size in the engine's tokens (plan-time check)

Where the template comes from, as SGLang takes it from the tokenizer (`TemplateManager.load_chat_template`,
sglang/srt/parser/template_manager.py:165-208):

- a GGUF file (or a known GGUF model's name): its `tokenizer.chat_template` metadata (SmolLM2 carries ChatML);
- a Hugging Face checkpoint directory: `chat_template.jinja`, else `chat_template` in `tokenizer_config.json`;
- a built-in byte-tokenizer config (`tiny`, `tiny-draft`): `BYTE_CHAT_TEMPLATE`, defined here (no file has one).

Rendering follows transformers' `apply_chat_template` (which SGLang calls, serving_chat.py:2259-2330): a sandboxed
Jinja environment with trim_blocks and lstrip_blocks, `raise_exception`, `strftime_now` and a `tojson` that does
not escape HTML; `bos_token` / `eos_token` are passed in. The rendered text is then encoded by the engine's own
tokenizer (no BOS is added), so a GGUF template's `<|im_start|>` / `<|im_end|>` become their single special ids.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from specsweep_common.problem import read_file

from specsweep_common.chat_frame import split_frame, task_messages

# ChatML spelled in plain bytes: the byte tokenizer has no special tokens to mark turns, so each marker is its
# bytes. The model (random `tiny` weights) was never trained on it: it only gives chat requests a well-defined prompt.
BYTE_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class ChatTemplateError(ValueError):
    """The template cannot render these messages (its own `raise_exception`, or a Jinja error): HTTP 400."""


@dataclass(frozen=True)
class ChatTemplate:
    source: str  # the Jinja text
    bos_token: str = ""
    eos_token: str = ""


@functools.cache
def load_chat_template(model_path: str) -> ChatTemplate | None:
    """The model's chat template, or None when it has none (then chat requests are a 400, as in SGLang)."""
    from .config import BUILTIN_CONFIGS
    from .gguf_checkpoint import resolve_gguf

    if model_path in BUILTIN_CONFIGS:
        return ChatTemplate(BYTE_CHAT_TEMPLATE)
    gguf_path = resolve_gguf(model_path)
    if gguf_path is not None:
        return _from_gguf(gguf_path)
    return _from_hf_dir(Path(model_path))


def _from_gguf(path: Path) -> ChatTemplate | None:
    from gguf import GGUFReader

    fields = GGUFReader(str(path)).fields
    if "tokenizer.chat_template" not in fields:
        return None
    tokens = fields["tokenizer.ggml.tokens"].contents()

    def token(key: str) -> str:
        return tokens[fields[key].contents()] if key in fields else ""

    return ChatTemplate(fields["tokenizer.chat_template"].contents(), token("tokenizer.ggml.bos_token_id"),
                        token("tokenizer.ggml.eos_token_id"))


def _from_hf_dir(directory: Path) -> ChatTemplate | None:
    config_path = directory / "tokenizer_config.json"
    config = json.loads(read_file("model.path", str(directory), str(config_path))) if config_path.is_file() else {}
    source = config.get("chat_template")
    if isinstance(source, list):  # several named templates: the default one
        source = next((t["template"] for t in source if t.get("name") == "default"), None)
    jinja_file = directory / "chat_template.jinja"
    if jinja_file.is_file():
        source = read_file("model.path", str(directory), str(jinja_file)).decode()
    if not source:
        return None

    def token(key: str) -> str:
        value = config.get(key) or ""
        return value.get("content", "") if isinstance(value, dict) else value

    return ChatTemplate(source, token("bos_token"), token("eos_token"))


@functools.cache
def _compile(source: str):
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


def render_chat(template: ChatTemplate, messages: list[dict], add_generation_prompt: bool = True, **kwargs) -> str:
    """The prompt text for `messages` ([{"role", "content": str}, ...]); extra `kwargs` (a request's
    `chat_template_kwargs`) are template variables. A template error is a ChatTemplateError."""
    import jinja2

    variables = {"bos_token": template.bos_token, "eos_token": template.eos_token, **kwargs}
    try:
        return _compile(template.source).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                                **variables)
    except jinja2.exceptions.TemplateError as exc:
        raise ChatTemplateError(f"the chat template cannot render these messages: {exc}") from exc


# ---------------------------------------------------------------- probe.task: the probe text inside a chat turn


def reference_chat_frame(model_path: str | None, task: str) -> tuple[str, str]:
    """The frame of the template this engine serves /v1/chat/completions with (a byte model's: its ChatML)."""
    template = load_chat_template(model_path) if model_path else ChatTemplate(BYTE_CHAT_TEMPLATE)
    if template is None:
        raise ValueError(f"probe.task={task!r} needs a chat template, and the model {model_path} has none")
    return split_frame(render_chat(template, task_messages(task)))


@functools.cache
def frame_tokens(model_path: str | None, task: str) -> int:
    """Tokens the frame takes in the engine's own tokenizer: context_len must leave room for the probe text."""
    from .tokenizer import ByteTokenizer, load_tokenizer

    tokenizer = load_tokenizer(model_path) if model_path else ByteTokenizer()
    return sum(len(tokenizer.encode(part)) for part in reference_chat_frame(model_path, task))
