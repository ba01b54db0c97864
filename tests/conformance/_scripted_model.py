"""A scripted smolagents Model: returns fixed tool calls in order (see
docs/notes/smolagents.md, "Scripted models"). No network, no LLM."""
from __future__ import annotations

from typing import Any

from smolagents import ChatMessage, Model
from smolagents.models import ChatMessageToolCall, ChatMessageToolCallFunction, MessageRole


def call(name: str, arguments: dict[str, Any]) -> ChatMessageToolCall:
    return ChatMessageToolCall(id="", type="function",
                               function=ChatMessageToolCallFunction(name=name, arguments=arguments))


class ScriptedModel(Model):
    def __init__(self, script: list[ChatMessageToolCall]):
        super().__init__(model_id="scripted")
        self.script = list(script)
        self.calls = 0
        self.seen: list[list[Any]] = []

    def generate(self, messages, stop_sequences=None, response_format=None, tools_to_call_from=None, **kwargs):
        self.seen.append(list(messages))
        self.calls += 1
        if not self.script:  # planning / provide_final_answer paths: plain text
            return ChatMessage(role=MessageRole.ASSISTANT, content="done")
        step = self.script.pop(0)
        step.id = f"call_{self.calls}"
        return ChatMessage(role=MessageRole.ASSISTANT, content=None, tool_calls=[step])
