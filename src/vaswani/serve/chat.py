"""Chat prompts: a conversation rendered with the checkpoint's own chat template
(data/chat.py, which fine-tuning on conversations shares). A model trained with vaswani has
no template, and the chat route says so."""

from __future__ import annotations

from ..data.chat import TemplateError, render, takes_tools

__all__ = ["TemplateError", "render", "takes_tools"]
