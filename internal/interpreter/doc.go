// Package interpreter runs code in stateful IPython kernels inside a sandbox,
// one kernel per context, and speaks it as Runtime's interpreter routes
// (through the api package) and as E2B's code-interpreter API (E2BHandler).
//
// A context is a bridge process in the guest (bridge.py, embedded here and
// started with `python3 -u -c` through the guest's process API, as the sandbox
// user) that starts an ipykernel with jupyter_client and drives it for the host
// over a loopback TCP connection reached with Guest.DialPort: JSON lines of
// requests in, of events out. Everything the bridge sends is bounded here as a
// hostile guest's output. A context lives as long as its bridge process: a
// paused and woken sandbox keeps it (the host connects again), a stopped or
// restarted one does not, and the context is then forgotten.
//
// Files: `Service` (`service.go`: contexts per sandbox, their starts,
// reconnects and sweeps; `contexts.go`: `Create`, `List`, `Get`, `Restart`,
// `Interrupt`, `Delete`; `run.go`: `Run`), `bridge.go` (the host's end of a
// guest bridge), `bridge.py` (embedded; the guest side), `e2b.go`
// (`E2BHandler`, E2B's code-interpreter API for port 49999).
//
// Stateful Python, as notebooks run it: a context is one IPython kernel
// (Debian's `ipykernel` and `jupyter_client`, in the default image with
// `matplotlib` and `pandas`), and state persists across runs of a context.
//
//   - Bridge: a context is started by `Guest.Spawn` of `python3 -u -c
//     <bridge.py>` as the sandbox user, with the context's cwd and env (the
//     script travels with the server, so it always matches it, and stays out of
//     the image). Its stdin carries a random token; it listens on
//     127.0.0.1:any, prints `{"port","cwd"}` (read with `ProcessOutput`), and
//     takes a connection (`Guest.DialPort`) whose first line is the token as
//     the host's, replacing the one before. It makes the user site directory
//     first (so `!pip install` then `import` works in the same kernel), sets
//     `MPLBACKEND` to matplotlib-inline (figures come back as `image/png`
//     display data), and starts the kernel with `KernelManager` (its own
//     session, so an interrupt is SIGINT to its process group, `!` commands
//     included, sent again each second until the cell reports an error or ends,
//     since one that lands before the cell runs is lost; `%colors nocolor`, so
//     tracebacks are plain text). JSON lines: requests `execute{id,code,env}`
//     (env set around the cell and restored), `interrupt`, `restart{id}`,
//     `shutdown`; events `ready` (on each connection, once the kernel is up),
//     `fatal`, and with the request's id `stdout`, `stderr`, `count`,
//     `result{main,data}` (`execute_result` is main, `display_data` not; the
//     MIME bundle as the kernel sent it), `error{name,value,traceback}`,
//     `end{status}`, `restarted`; events are dropped while no host is
//     connected. A kernel that dies during a cell is started again (status
//     `lost`). `shutdown` kills the kernel's process group and exits; a killed
//     bridge's kernel exits by itself (ipykernel watches its parent).
//   - Host (`Service`): contexts keyed by sandbox id, at most 16 per sandbox;
//     ids `[a-z0-9][a-z0-9-]{0,62}`; the default context `python` is started on
//     first use, concurrent first uses share one start (≤ 90 s to the port
//     line, ≤ 5 min to a ready kernel under TCG). One cell at a time per
//     context (a second run waits). A timeout or a gone client (unless
//     `interruptOnDisconnect:false`) sends `interrupt`; a cell still running 15
//     s later has its bridge killed (status `lost`). A context is its bridge
//     process (id, start time, port, token), not its connection: a sandbox
//     paused and woken keeps its processes but not its connections, so a run or
//     a listing finds the connection cut and connects again, and the kernel's
//     state is still there (a run under way when the connection ends is `lost`;
//     events of earlier requests are told by their id and dropped). A context
//     whose process is gone (the sandbox stopped or restarted: the process id
//     is checked with its start time and argv) is forgotten, not an error:
//     listing omits it, a run in it is 404 `context_not_found`, the default one
//     starts again. Contexts detached for 7 days are forgotten too. The Service
//     is memory only: the first time it starts a bridge in a sandbox it kills
//     the bridges running there (left by an earlier server process), so a
//     server restart ends contexts. A fork's copy or a checkpoint's branch
//     is told to it by the manager (`Adopt`, through `sandbox.Config.Copied`):
//     it takes its source's contexts, whose bridges its memory holds, and
//     ends none of them as strays. Bounds: an event line ≤ 16 MiB + 64 KiB (a
//     longer one cuts the connection: the run is `lost`), at most 3 lines read
//     ahead of the consumer, ≤ 32 MiB of output kept per execution and 1 GiB by
//     all executions under way together (the rest dropped, `truncated`; the
//     bridge stops sending at 32 MiB too), ≤ 32 MIME types per result, code ≤ 1
//     MiB, env ≤ 128 names and 64 KiB.
//   - Runtime routes (`api/interpreter.go`, all `Guest`; 501
//     `interpreter_unavailable` on a server built without a Service): `POST
//     /v1/sandboxes/{id}/interpreter:run {code, language?, context?, timeoutMs?
//     (default 60000, 0 none), stream?, interruptOnDisconnect?}` → `{status:
//     ok|error|timeout|interrupted|lost, context, stdout, stderr, results:
//     [{main, data: {mime: value}, refs: {}}], error: {name, value,
//     traceback}|null, executionCount, durationMs, truncated}`; with `stream`
//     NDJSON lines `{"k":"stdout"|"stderr","text"}`, `{"k":"result",main,data,
//     refs}`, `{"k":"error",name,value,traceback}`, then `{"k":"execution",
//     execution}` (or `{"k":"failure",code,status,message,hint,requestId}`).
//     `GET|POST …/interpreter/contexts` (`{data:[…]}`; create `{id?, language?,
//     cwd?, env?}`), `POST …/contexts/{ctx}:restart`, `:interrupt`
//     (`{interrupted}`), `DELETE …/contexts/{ctx}` (`{deleted}`); a context is
//     `{id, language, cwd, envNames, createdAt, running}`. Every result is
//     inline, so `GET …/contexts/{ctx}/results/{name}` is always 404
//     `result_not_found`. Languages other than python: 400
//     `language_unsupported`.
//   - E2B (`E2BHandler`, for the router of port 49999; it reads
//     `sandbox.RoutedFrom`): `POST /execute {code, context_id, language,
//     env_vars}` streams e2b_code_interpreter's NDJSON: `{"type":"stdout"|
//     "stderr","text","timestamp"}` (Unix ns), `{"type":"result", text, html,
//     markdown, svg, png, jpeg, pdf, latex, json, javascript, data,
//     is_main_result, extra}` (other MIME types in `extra`; a `text/plain` in
//     single quotes loses them, as E2B's server does), `{"type":"error",
//     name,value,traceback}`, `{"type":"number_of_executions",
//     execution_count}`, last `{"type":"end_of_execution"}`; a client that goes
//     away interrupts the cell. `POST /contexts {language?, cwd?}`, `GET
//     /contexts` (a list), `DELETE /contexts/{id}` (204), `POST
//     /contexts/{id}/restart` (204), `GET /health`. Errors are plain text with
//     E2B's statuses (404 unknown context, 400 bad request).
package interpreter
