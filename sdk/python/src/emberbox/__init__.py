"""Emberbox: a typed Python client for Emberbox sandboxes (Runtime Cloud v1 API).

    from emberbox import Sandbox

    with Sandbox.create(timeout_seconds=900, on_lease_end="stop") as sbx:
        print(sbx.exec("nproc && free -m").stdout)
        print(sbx.run_code("x = 21\nx * 2").text)   # stateful, like a notebook: '42'
        ckpt = sbx.checkpoint("x-is-21")                 # memory, processes and disk
        sbx.run_code("x = 0"); sbx.restore(ckpt)         # x is 21 again

Configuration comes from arguments or EMBERBOX_API_URL / EMBERBOX_API_KEY
(falling back to RUNTIME_API_URL / RUNTIME_API_KEY).
"""
from ._async_client import AsyncClient
from ._async_interpreter import AsyncInterpreter, AsyncInterpreterContexts
from ._async_sandbox import AsyncFiles, AsyncProcesses, AsyncSandbox
from ._client import Client
from ._errors import (
    APIConnectionError,
    APIError,
    AuthenticationError,
    CommandError,
    ConfigurationError,
    ConflictError,
    EmberboxError,
    FileNotFoundInSandboxError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    SandboxNotRunningError,
    SandboxStartError,
    ServiceUnavailableError,
)
from ._execution import Context, Execution, ExecutionError, Logs, Result
from ._interpreter import Interpreter, InterpreterContexts
from ._sandbox import Files, Processes, Sandbox
from ._types import Checkpoint, CommandResult, OutputEvent, ProcessInfo, ProcessOutput
from ._version import __version__

__all__ = [
    "__version__",
    "Sandbox",
    "AsyncSandbox",
    "Files",
    "AsyncFiles",
    "Processes",
    "AsyncProcesses",
    "Interpreter",
    "AsyncInterpreter",
    "InterpreterContexts",
    "AsyncInterpreterContexts",
    "Client",
    "AsyncClient",
    "CommandResult",
    "Checkpoint",
    "OutputEvent",
    "ProcessInfo",
    "ProcessOutput",
    "Execution",
    "Result",
    "ExecutionError",
    "Logs",
    "Context",
    "EmberboxError",
    "ConfigurationError",
    "APIConnectionError",
    "APIError",
    "AuthenticationError",
    "PermissionDeniedError",
    "NotFoundError",
    "FileNotFoundInSandboxError",
    "ConflictError",
    "SandboxNotRunningError",
    "InvalidRequestError",
    "RateLimitError",
    "ServiceUnavailableError",
    "SandboxStartError",
    "CommandError",
]
