"""Tool calling on /v1/chat/completions, as OpenAI's API has it: the request's ``tools``
rendered by the model's chat template, the model's calls kept to each tool's parameters
(generation/grammar.py ``Grammars.tool_calls``: Hermes' ``<tool_call>`` format, which Qwen2,
Qwen2.5 and SmolLM3 write), and read back out of its text as ``tool_calls``.
"""

from __future__ import annotations

import json
import uuid

from ..generation.grammar import TOOL_CLOSE, TOOL_OPEN


def choice_of(body) -> str | None:
    """What the request lets the model do with its tools: None (no tools, or
    ``tool_choice: "none"``: text only), "auto" (the default with tools), "required" (one
    call or more), or the name of the one function to call."""
    choice = body.tool_choice
    if not body.tools or choice == "none":
        return None
    if choice is None:
        return "auto"
    return choice if isinstance(choice, str) else choice.function.name


def turns(messages) -> list[dict]:
    """The conversation as a template reads it (Hugging Face's form): an assistant's calls
    with their arguments as objects, not JSON text."""
    out = []
    for m in messages:
        turn = m.model_dump(exclude_none=True)
        if m.role == "assistant":
            turn["content"] = m.content or ""
            if m.tool_calls:
                turn["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                    "name": c.function.name, "arguments": _parsed(c.function.arguments)}}
                    for c in m.tool_calls]
        out.append(turn)
    return out


def _parsed(arguments: str):
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments  # as written: the template shows it so


def marked_text(tokenizer, ids: list[int]) -> str:
    """The text of ``ids`` with the call markers in it, where the tokenizer counts them
    among the special tokens that decoding leaves out."""
    hf = getattr(tokenizer, "hf", None)
    if hf is None:
        return tokenizer.decode(ids)
    return hf.decode(ids, skip_special_tokens=False)


def split(text: str) -> tuple[str | None, list[dict]]:
    """The model's text cut into what it says (None where nothing) and the calls it made,
    as OpenAI's ``tool_calls`` (each an id, the function's name and its arguments as JSON
    text). A call whose JSON does not read stays in the text."""
    calls, said, at = [], [], 0
    decoder = json.JSONDecoder()
    while (start := text.find(TOOL_OPEN, at)) >= 0:
        try:
            body = start + len(TOOL_OPEN)
            call, end = decoder.raw_decode(text, body + len(text[body:]) -
                                           len(text[body:].lstrip()))
            close = text.index(TOOL_CLOSE, end)
        except ValueError:
            break
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            break
        said.append(text[at:start])
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": call["name"],
                                   "arguments": json.dumps(call.get("arguments", {}))}})
        at = close + len(TOOL_CLOSE)
    said.append(text[at:])
    content = "".join(said).strip()
    return content or None, calls
