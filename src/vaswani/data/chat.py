"""Conversations: chat-formatted JSONL read with errors that name the file and line, rendered
with a checkpoint's own chat template (Jinja, as Hugging Face renders it: sandboxed,
``trim_blocks`` and ``lstrip_blocks``), and cut into the pieces a model is trained on.

A line is one conversation, either ``{"messages": [{"role": ..., "content": ...}, ...]}``
(roles ``system``, ``user``, ``assistant``) or ``{"prompt": ..., "response": ...}`` (a user's
turn and the assistant's answer).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path

from .files import ReadReport, expand, read_lines

ROLES = ("system", "user", "assistant")


class TemplateError(ValueError):
    """The template could not render this conversation."""


def render(template: str, messages: list[dict], *, bos_token: str, eos_token: str,
           add_generation_prompt: bool = True, tools: list[dict] | None = None) -> str:
    """``messages`` as the template writes them; ``add_generation_prompt``: followed by the
    start of the assistant's next turn (a prompt to answer). ``tools``: the functions the
    model may call (OpenAI's ``tools``, as Hugging Face's templates take them)."""
    from jinja2 import TemplateError as JinjaError

    try:
        return _compiled(template).render(messages=messages,
                                          add_generation_prompt=add_generation_prompt,
                                          bos_token=bos_token, eos_token=eos_token,
                                          **({"tools": tools} if tools else {}))
    except JinjaError as e:
        raise TemplateError(f"the chat template failed: {e}") from None


def takes_tools(template: str) -> bool:
    """Whether the template writes the tools a model may call (it reads ``tools``)."""
    from jinja2 import meta
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    try:
        parsed = ImmutableSandboxedEnvironment().parse(template)
    except Exception:  # a template that does not parse takes nothing (render says why)
        return False
    return "tools" in meta.find_undeclared_variables(parsed)


@functools.lru_cache(maxsize=8)
def _compiled(template: str):
    """A template compiled once (compiling costs far more than rendering a conversation)."""
    from jinja2 import TemplateError as JinjaError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template)
    except JinjaError as e:
        raise TemplateError(f"the chat template failed: {e}") from None


def segments(template: str, messages: list[dict], *, bos_token: str, eos_token: str
             ) -> list[tuple[str, bool]]:
    """The rendered conversation in pieces, each marked True where it is an assistant's turn
    (what an instruction-tuned model is trained to write: the answer and the template's end
    of turn), False for the rest (the system prompt, the user's turns, the template's
    headers). Each answer is where rendering the conversation through it extends rendering
    the conversation before it with the generation prompt."""
    def text(upto: int, prompt: bool) -> str:
        return render(template, messages[:upto], bos_token=bos_token, eos_token=eos_token,
                      add_generation_prompt=prompt)

    pieces, done = [], ""
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before, through = text(i, True), text(i + 1, False)
        if not (before.startswith(done) and through.startswith(before)):
            raise TemplateError("the chat template does not write a conversation as the start "
                                "of its continuation, so the assistant's turns cannot be found "
                                "in it")
        pieces += [(before[len(done):], False), (through[len(before):], True)]
        done = through
    whole = text(len(messages), False)
    if whole.startswith(done) and len(whole) > len(done):
        pieces.append((whole[len(done):], False))
    return [(piece, answer) for piece, answer in pieces if piece]


def iter_conversations(paths: list[str], report: ReadReport) -> Iterator[list[dict]]:
    """Each line's conversation as a list of ``{"role", "content"}`` messages; a bad line is
    an error naming ``file:line`` (or skipped and counted, within ``[data] max_skip``)."""
    for path in expand(paths):
        for line_no, text in read_lines(path, report):
            if not text.strip():
                report.blank_lines += 1
                continue
            messages = _conversation(path, line_no, text, report)
            if messages is not None:
                yield messages


def _conversation(path: Path, line_no: int, text: str, report: ReadReport
                  ) -> list[dict] | None:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        return report.bad_line(path, line_no, f"invalid JSON ({e.msg} at column {e.colno})")
    if isinstance(obj, dict) and "prompt" in obj and "response" in obj:
        obj = {"messages": [{"role": "user", "content": obj["prompt"]},
                            {"role": "assistant", "content": obj["response"]}]}
    messages = obj.get("messages") if isinstance(obj, dict) else None
    if not isinstance(messages, list) or not messages:
        return report.bad_line(path, line_no, 'expected {"messages": [{"role": ..., '
                               '"content": ...}, ...]} or {"prompt": ..., "response": ...}')
    out = []
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        content = m.get("content") if isinstance(m, dict) else None
        if role not in ROLES:
            return report.bad_line(path, line_no, f"message {i}: role {role!r} must be one "
                                   f"of {', '.join(ROLES)}")
        if not isinstance(content, str) or not content.strip():
            return report.bad_line(path, line_no, f"message {i} ({role}): content must be "
                                   "a non-empty string")
        out.append({"role": role, "content": content})
    if not any(m["role"] == "assistant" for m in out):
        return report.bad_line(path, line_no, "no assistant message: nothing to learn from")
    return out
