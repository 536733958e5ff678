"""probe.task: the probe's text inside one user turn of a model's chat template.

Shared by every engine's prompt encoding (workers/<engine>/adapter.py `prompt_encoding`) and the reference engine's
plan-time room check (workers/reference/chat_template.py `frame_tokens`): the template is rendered once around a
placeholder, and the two sides of it are the frame the probe text is cut to fit between.

    task_messages(task) -> [message]     one user turn: the probe text (FILLER), a blank line, the task
    split_frame(rendered) -> (before, after)   the rendered turn around the probe text

Standard library only.
"""

from __future__ import annotations

FILLER = "\x00specsweep-probe-text\x00"  # where the probe's text goes in the rendered user turn


def task_messages(task: str) -> list[dict]:
    """One user turn: the probe text (FILLER), a blank line, the task."""
    return [{"role": "user", "content": f"{FILLER}\n\n{task}"}]


def split_frame(rendered: str) -> tuple[str, str]:
    """The rendered chat turn around the probe text: (before, after)."""
    head, sep, tail = rendered.partition(FILLER)
    if not sep:
        raise ValueError("the chat template dropped the user message's text")
    return head, tail
