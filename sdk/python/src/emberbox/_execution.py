"""The code interpreter's results, and the I/O-free half of `run_code`, shared by the
sync and asyncio interpreters (_async_interpreter.py and the _interpreter.py generated
from it).

Wire contract (Runtime's interpreter API, as the withruntime 0.35.0 SDK calls it):

    POST …/interpreter:run   {code, language?, context?, timeoutMs?, interruptOnDisconnect?, stream?}
        answers the execution (JSON), or with `stream: true` NDJSON lines keyed by `k`:
        {"k":"stdout"|"stderr","text"}, {"k":"result","main","data","refs"},
        {"k":"error","name","value","traceback"}, {"k":"execution","execution"} (last),
        {"k":"failure","code","message","status"?,"hint"?,"requestId"?}
    execution: {status, stdout, stderr, results: [{main, data, refs}], error: {name, value,
        traceback} | null, executionCount}; status "timeout" and "lost" (the context died)
        are the ones a client acts on
    GET  …/interpreter/contexts/{ctx}/results/{name}   the bytes of a result too large to
        travel inline; a `refs` entry names it by its path in the sandbox,
        /workspace/.runtime/interpreter/{ctx}/out/{name}
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ._common import seg
from ._errors import APIConnectionError, error_from_payload

__all__ = ["Execution", "ExecutionError", "Logs", "Result", "Context", "MIME_FIELDS"]

#: The standard MIME types, by the accessor that reads each (as E2B's Result names them).
MIME_FIELDS: dict[str, str] = {
    "text/plain": "text", "text/html": "html", "text/markdown": "markdown", "image/svg+xml": "svg",
    "image/png": "png", "image/jpeg": "jpeg", "application/pdf": "pdf", "text/latex": "latex",
    "application/json": "json", "application/javascript": "javascript",
}
TABLE_MIME = "application/vnd.runtime.table+json"
_TEXT_MIME = re.compile(r"^text/|json|javascript|svg|latex")
_JSON_MIME = re.compile(r"^application/(.+\+)?json$")
_RESULT_PATH = re.compile(r"^/workspace/\.runtime/interpreter/([a-z0-9][a-z0-9-]*)/out/([A-Za-z0-9][A-Za-z0-9_.-]*)$")
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


def _str_or_none(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else str(value)


@dataclass
class Result:
    """One rich result of a cell: a MIME bundle (`data`, as Jupyter's display messages
    name it) and whether it is the cell's own value (`is_main_result`) rather than a
    `display()`. Images (`png`, `jpeg`, `pdf`) are base64 text; `json` is the decoded
    value. Results too large to travel inline were fetched by `run_code` (`refs` keeps
    their paths in the sandbox)."""

    data: dict[str, Any] = field(default_factory=dict)
    is_main_result: bool = False
    refs: dict[str, Any] = field(default_factory=dict)

    def _get(self, mime: str) -> Any:
        return self.data.get(mime)

    @property
    def text(self) -> str | None:
        return _str_or_none(self._get("text/plain"))

    @property
    def html(self) -> str | None:
        return _str_or_none(self._get("text/html"))

    @property
    def markdown(self) -> str | None:
        return _str_or_none(self._get("text/markdown"))

    @property
    def svg(self) -> str | None:
        return _str_or_none(self._get("image/svg+xml"))

    @property
    def png(self) -> str | None:
        """The PNG image, base64-encoded."""
        return _str_or_none(self._get("image/png"))

    @property
    def jpeg(self) -> str | None:
        """The JPEG image, base64-encoded."""
        return _str_or_none(self._get("image/jpeg"))

    @property
    def pdf(self) -> str | None:
        """The PDF document, base64-encoded."""
        return _str_or_none(self._get("application/pdf"))

    @property
    def latex(self) -> str | None:
        return _str_or_none(self._get("text/latex"))

    @property
    def json(self) -> Any:
        return self._get("application/json")

    @property
    def javascript(self) -> str | None:
        return _str_or_none(self._get("application/javascript"))

    @property
    def table(self) -> Any:
        """A DataFrame as `application/vnd.runtime.table+json`, when the server sends one."""
        return self._get(TABLE_MIME)

    @property
    def extra(self) -> dict[str, Any]:
        """The MIME types that have no accessor of their own."""
        return {k: v for k, v in self.data.items() if k not in MIME_FIELDS}

    def formats(self) -> list[str]:
        """The accessor names that have a value, then the other MIME types."""
        found = [name for mime, name in MIME_FIELDS.items() if self.data.get(mime) is not None]
        return found + list(self.extra)

    def __getitem__(self, item: str) -> Any:
        return getattr(self, item)

    def __repr__(self) -> str:
        main = ", main" if self.is_main_result else ""
        return f"Result({self.text!r}{main})" if self.text is not None else f"Result(formats={self.formats()}{main})"


@dataclass
class ExecutionError:
    """An exception the cell raised: its class name, its message and its traceback (ANSI
    colour codes, as IPython writes them, are left in; `plain_traceback` drops them)."""

    name: str
    value: str
    traceback: str

    @property
    def plain_traceback(self) -> str:
        return _ANSI.sub("", self.traceback)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ExecutionError:
        tb = d.get("traceback")
        if isinstance(tb, list):  # Jupyter's own shape: one string per frame
            tb = "\n".join(str(x) for x in tb)
        return cls(name=str(d.get("name") or ""), value=str(d.get("value") or ""), traceback=str(tb or ""))


@dataclass
class Logs:
    """What the cell printed, as lines (each keeps its newline)."""

    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)


@dataclass
class Execution:
    """What one `run_code` did. An exception in the code is `error`, not raised;
    `status` is the server's word for the run (`timeout`: the cell ran out of time and
    was interrupted; `lost`: its context stopped under it)."""

    results: list[Result] = field(default_factory=list)
    logs: Logs = field(default_factory=Logs)
    error: ExecutionError | None = None
    execution_count: int | None = None
    status: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def text(self) -> str | None:
        """The text of the cell's own value (its main result), if it has one."""
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None

    @property
    def main_result(self) -> Result | None:
        return next((r for r in self.results if r.is_main_result), None)

    @property
    def stdout(self) -> str:
        return "".join(self.logs.stdout)

    @property
    def stderr(self) -> str:
        return "".join(self.logs.stderr)

    @property
    def timed_out(self) -> bool:
        return self.status == "timeout"


@dataclass
class Context:
    """An interpreter context: one kernel with its own state, directory and environment."""

    id: str
    language: str = "python"
    cwd: str | None = None
    info: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Any, fallback_id: str = "") -> Context:
        d = d if isinstance(d, dict) else {}
        return cls(id=str(d.get("id") or fallback_id), language=str(d.get("language") or "python"),
                   cwd=d.get("cwd"), info=dict(d))


def context_id(context: Context | str) -> str:
    return context.id if isinstance(context, Context) else str(context)


def lines(text: str) -> list[str]:
    """Splits output into lines that keep their newline (a last partial line too)."""
    return re.findall(r"[^\n]*\n|[^\n]+$", text or "")


def run_body(code: str, *, language: str | None, context: Context | str | None, timeout: float | None,
             stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code}
    if language is not None:
        body["language"] = language
    if context is not None:
        body["context"] = context_id(context)
    if timeout is not None:
        body["timeoutMs"] = 0 if timeout == 0 else max(1, int(round(float(timeout) * 1000)))
    if stream:
        body["stream"] = True
    return body


UNLIMITED_READ_S = 86400.0


def http_timeout(timeout: float | None) -> float:
    """The read timeout of a run: the cell's limit (60 s by the server's default) and a
    minute more; a day for an unlimited cell (`timeout=0`)."""
    if timeout == 0:
        return UNLIMITED_READ_S
    return (60.0 if timeout is None else float(timeout)) + 60.0


def ref_path(ref: Any) -> str:
    """The sandbox path a `refs` entry names (a path, or an object with `path`)."""
    if isinstance(ref, dict):
        ref = ref.get("path")
    if not isinstance(ref, str):
        raise ValueError(f"not an interpreter result reference: {ref!r}")
    return ref


def result_route(base: str, ref: Any) -> str:
    """The route that serves a result too large to travel inline."""
    m = _RESULT_PATH.match(ref_path(ref))
    if not m:
        raise ValueError(f"not an interpreter result path: {ref_path(ref)!r}")
    return f"{base}/contexts/{seg(m.group(1))}/results/{seg(m.group(2))}"


def inline_value(mime: str, content: bytes) -> Any:
    """A fetched result as it would have travelled inline: JSON decoded, text as text,
    anything else (images, PDF) base64."""
    import base64

    if _JSON_MIME.match(mime):
        try:
            return json.loads(content)
        except ValueError:
            return content.decode("utf-8", errors="replace")
    if _TEXT_MIME.search(mime):
        return content.decode("utf-8", errors="replace")
    return base64.b64encode(content).decode("ascii")


def missing_refs(bundle: Mapping[str, Any]) -> dict[str, Any]:
    """The `refs` of a wire result whose MIME types are not inline too."""
    data = bundle.get("data") if isinstance(bundle.get("data"), dict) else {}
    refs = bundle.get("refs") if isinstance(bundle.get("refs"), dict) else {}
    return {mime: ref for mime, ref in refs.items() if mime not in data}


def result_from_json(bundle: Mapping[str, Any], fetched: Mapping[str, Any]) -> Result:
    """A wire result (`{main, data, refs}`), with the fetched values of its refs by MIME type."""
    data = dict(bundle.get("data") or {}) if isinstance(bundle.get("data"), dict) else {}
    for mime, value in fetched.items():
        data.setdefault(mime, value)
    refs = dict(bundle.get("refs") or {}) if isinstance(bundle.get("refs"), dict) else {}
    return Result(data=data, is_main_result=bool(bundle.get("main")), refs=refs)


def execution_from_json(answer: Any, results: list[Result]) -> Execution:
    a = answer if isinstance(answer, dict) else {}
    err = a.get("error")
    count = a.get("executionCount")
    return Execution(
        results=results,
        logs=Logs(stdout=lines(str(a.get("stdout") or "")), stderr=lines(str(a.get("stderr") or ""))),
        error=ExecutionError.from_json(err) if isinstance(err, dict) else None,
        execution_count=count if isinstance(count, int) and not isinstance(count, bool) else None,
        status=a.get("status") if isinstance(a.get("status"), str) else None,
        raw=dict(a),
    )


def wire_results(answer: Any) -> list[dict[str, Any]]:
    a = answer if isinstance(answer, dict) else {}
    return [r for r in (a.get("results") or []) if isinstance(r, dict)]


def parse_event(line: str | bytes) -> dict[str, Any] | None:
    """One line of a streamed run; None for a blank one."""
    if isinstance(line, bytes):
        line = line.decode("utf-8", errors="replace")
    line = line.strip()
    if not line:
        return None
    try:
        event = json.loads(line)
    except json.JSONDecodeError as e:
        raise APIConnectionError(f"bad line in the interpreter stream: {line[:200]!r}") from e
    if not isinstance(event, dict) or not isinstance(event.get("k"), str):
        raise APIConnectionError(f"interpreter stream line without a kind: {line[:200]!r}")
    return event


def failure(event: Mapping[str, Any]) -> Exception:
    """The typed error of a `failure` line."""
    return error_from_payload({"code": event.get("code") or "interpreter_failed", "status": event.get("status"),
                               "message": event.get("message") or "the interpreter failed",
                               "hint": event.get("hint"), "requestId": event.get("requestId")})


def stream_ended() -> Exception:
    return APIConnectionError("the interpreter stream ended without the execution")


TextCallback = Callable[[str], object]
ResultCallback = Callable[[Result], object]
ErrorCallback = Callable[[ExecutionError], object]


# --- env for one run -----------------------------------------------------------
#
# Runtime's run takes no environment, so `run_code(env=...)` sets the variables in the
# Python context's os.environ for the one run (as E2B's run_code does): a cell before
# sets them and remembers the old values, a cell after puts those back. Child
# processes of the cell (`!cmd`, subprocess) inherit them.

_ENV_SAVE = "__emberbox_saved_env"
ENV_CELL_TIMEOUT_S = 300.0  # generous: the first cell of a context waits for its kernel to start


def env_set_code(env: Mapping[str, str]) -> str:
    pairs = {str(k): str(v) for k, v in env.items()}
    return (f"def __emberbox_set_env(new):\n"
            f"    import os\n"
            f"    globals()[{_ENV_SAVE!r}] = {{k: os.environ.get(k) for k in new}}\n"
            f"    os.environ.update(new)\n"
            f"__emberbox_set_env({pairs!r})\n"
            f"del __emberbox_set_env")


def env_restore_code() -> str:
    return (f"def __emberbox_restore_env(saved):\n"
            f"    import os\n"
            f"    for k, v in saved.items():\n"
            f"        if v is None:\n"
            f"            os.environ.pop(k, None)\n"
            f"        else:\n"
            f"            os.environ[k] = v\n"
            f"__emberbox_restore_env(globals().pop({_ENV_SAVE!r}, {{}}))\n"
            f"del __emberbox_restore_env")


def env_language_ok(language: str | None, context: Context | str | None) -> bool:
    """env= is carried by Python code: refused up front for another language."""
    if isinstance(context, Context):
        return context.language == "python"
    return language in (None, "python")
