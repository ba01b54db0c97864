"""Scripted smolagents models: fixed tool calls or code, no LLM."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from smolagents import ChatMessage, Model
from smolagents.models import ChatMessageToolCall, ChatMessageToolCallFunction, MessageRole


def call(name: str, **arguments: Any) -> ChatMessageToolCall:
    return ChatMessageToolCall(id="", type="function",
                               function=ChatMessageToolCallFunction(name=name, arguments=arguments))


def last_observation(messages: list[Any]) -> str:
    """The text of the newest tool-response / observation message."""
    for m in reversed(messages):
        role = getattr(m, "role", None)
        if str(getattr(role, "value", role)) in ("tool-response", "user"):
            content = m.content
            if isinstance(content, list):
                return "".join(c.get("text", "") for c in content if isinstance(c, dict))
            return str(content or "")
    return ""


Step = ChatMessageToolCall | str | Callable[[list[Any]], "ChatMessageToolCall | str"]


class ScriptedModel(Model):
    """Returns the scripted steps in order. A step is a tool call (ToolCallingAgent),
    a string of assistant text (CodeAgent), or a function of the messages that returns one."""

    def __init__(self, script: list[Step]):
        super().__init__(model_id="scripted")
        self.script = list(script)
        self.seen: list[list[Any]] = []

    def generate(self, messages, stop_sequences=None, response_format=None, tools_to_call_from=None, **kwargs):
        self.seen.append(list(messages))
        if not self.script:
            return ChatMessage(role=MessageRole.ASSISTANT, content="done")
        step = self.script.pop(0)
        if callable(step) and not isinstance(step, ChatMessageToolCall):
            step = step(messages)
        if isinstance(step, str):
            return ChatMessage(role=MessageRole.ASSISTANT, content=step)
        step.id = f"call_{len(self.seen)}"
        return ChatMessage(role=MessageRole.ASSISTANT, content=None, tool_calls=[step])
