"""Chat prompts: a conversation rendered with the checkpoint's own chat template (Jinja, as
Hugging Face renders it: sandboxed, ``trim_blocks`` and ``lstrip_blocks``). A model trained
with vaswani has no template, and the chat route says so."""

from __future__ import annotations


class TemplateError(ValueError):
    """The template could not render this conversation."""


def render(template: str, messages: list[dict], *, bos_token: str, eos_token: str) -> str:
    from jinja2 import TemplateError as JinjaError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template).render(messages=messages, add_generation_prompt=True,
                                                bos_token=bos_token, eos_token=eos_token)
    except JinjaError as e:
        raise TemplateError(f"the chat template failed: {e}") from None
