"""Picks the model for the examples: a real one when a token is configured, a
scripted one (fixed answers, no LLM) otherwise. Says which on stderr.

Real model: set HF_TOKEN (smolagents InferenceClientModel; EMBERBOX_EXAMPLE_MODEL
chooses the model id), or OPENAI_API_KEY (OpenAIServerModel, needs `pip install
openai`; OPENAI_BASE_URL and EMBERBOX_EXAMPLE_MODEL are honoured). Note that the
sandbox has no network yet; the model runs on this machine, not in the sandbox.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from smolagents import ChatMessage, Model
from smolagents.models import ChatMessageToolCall, ChatMessageToolCallFunction, MessageRole


def real_model() -> Model | None:
    model_id = os.environ.get("EMBERBOX_EXAMPLE_MODEL")
    if os.environ.get("OPENAI_API_KEY"):
        from smolagents import OpenAIServerModel

        mid = model_id or "gpt-4o-mini"
        print(f"[model] real: OpenAIServerModel({mid})", file=sys.stderr)
        return OpenAIServerModel(model_id=mid, api_base=os.environ.get("OPENAI_BASE_URL"),
                                 api_key=os.environ["OPENAI_API_KEY"])
    if os.environ.get("HF_TOKEN"):
        from smolagents import InferenceClientModel

        mid = model_id or "Qwen/Qwen2.5-Coder-32B-Instruct"
        print(f"[model] real: InferenceClientModel({mid})", file=sys.stderr)
        return InferenceClientModel(model_id=mid, token=os.environ["HF_TOKEN"])
    return None


def tool_call(name: str, **arguments: Any) -> ChatMessageToolCall:
    return ChatMessageToolCall(id="", type="function",
                               function=ChatMessageToolCallFunction(name=name, arguments=arguments))


def last_observation(messages: list[Any]) -> str:
    for m in reversed(messages):
        role = getattr(m.role, "value", m.role)
        if role in ("tool-response", "user"):
            c = m.content
            if isinstance(c, list):
                return "".join(x.get("text", "") for x in c if isinstance(x, dict))
            return str(c or "")
    return ""


class ScriptedModel(Model):
    """Plays back fixed steps: tool calls, assistant text (code), or functions of the messages."""

    def __init__(self, script: list[Any]) -> None:
        super().__init__(model_id="scripted")
        self.script = list(script)
        self.n = 0

    def generate(self, messages, stop_sequences=None, response_format=None, tools_to_call_from=None, **kwargs):
        self.n += 1
        if not self.script:
            return ChatMessage(role=MessageRole.ASSISTANT, content="done")
        step = self.script.pop(0)
        if callable(step) and not isinstance(step, ChatMessageToolCall):
            step = step(messages)
        if isinstance(step, str):
            return ChatMessage(role=MessageRole.ASSISTANT, content=step)
        step.id = f"call_{self.n}"
        return ChatMessage(role=MessageRole.ASSISTANT, content=None, tool_calls=[step])


def pick(script: list[Any | Callable[[list[Any]], Any]]) -> Model:
    model = real_model()
    if model is not None:
        return model
    print("[model] scripted: no HF_TOKEN or OPENAI_API_KEY set, so fixed steps play the model's part",
          file=sys.stderr)
    return ScriptedModel(script)
