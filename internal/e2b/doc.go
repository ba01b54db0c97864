// Package e2b serves E2B's protocol beside the Runtime API, so that E2B's SDKs
// (and smolagents' executor_type="e2b") work against Emberbox with E2B_API_URL
// and E2B_SANDBOX_URL pointing at it.
//
// It has two halves on the one listener. The control plane (/sandboxes,
// /v2/sandboxes, …) answers in E2B's shapes and error shape, with Emberbox keys
// in X-API-KEY; an E2B sandbox is an Emberbox sandbox, made and kept by the
// same manager. Sandbox traffic, every request naming a sandbox in the
// E2b-Sandbox-Id and E2b-Sandbox-Port headers (or, with a domain, in a
// {port}-{id}.{domain} host name), is authenticated by the sandbox's access
// token and handed to envd (port 49983), the code interpreter (port 49999) or
// proxied to the guest's own port, all over the host↔guest stream.
//
// # Routing
//
// The Handler is the server's front (it wraps the console and the Runtime API).
// Sandbox traffic is authenticated by the sandbox's token (`Tokens`: an HMAC
// under `<data>/e2b.key` over purpose, sandbox, owner and a tag of the
// generation of the owner's secret the caller used, so the owner comes from the
// token and nothing is stored; `Keys.Generations`, the store's
// `KeyGenerations`, names the secrets that authenticate now, so revocation,
// expiry and a rotation's end of grace end the token), resolved with the
// manager's `Guest`, put in the request context (`sandbox.WithRouted`) and
// handed to envd (49983), the code interpreter (49999) or a reverse proxy to
// the guest's port over `Guest.DialPort`. The control-plane paths are served in
// E2B's `{code, message}` error shape (`control.go`; creates with an
// `Idempotency-Key` run once, `idempotency.go`); everything else goes on to the
// Runtime API. Both halves go through the API's rate buckets
// (`api.RateLimiter`, shared with `api.Config.Limiter`): failed keys and tokens
// per address, checked before a credential is looked at, and each key's
// requests in its read or write bucket. A request proxied to a guest's port
// goes through `api.StripCredentials`. docs/e2b.md lists every route.
//
// # Control plane and sandbox traffic
//
// One listener serves both APIs. `e2b.Handler` looks at each request first:
// sandbox traffic is told by its header or host name, E2B's control plane by
// paths that are not the Runtime API's (`/v1/…`), and everything else passes to
// the console and the Runtime API untouched. The server speaks HTTP/1.1 and
// HTTP/2 without TLS (prior knowledge), for gRPC and Connect clients.
//
// An E2B create is `Manager.Create` with the default shape, labels from the
// metadata plus `e2b.template`, `onLeaseEnd` delete (pause with `autoPause`),
// then `WaitFor(running)`: E2B's create answers a running sandbox. The answer
// carries `envdAccessToken` and `trafficAccessToken`, both derived by
// `e2b.Tokens`; the SDKs send them back on every in-sandbox request, where they
// name the owner, so the router calls `Manager.Guest(owner, id)` (which also
// wakes an auto-waking paused sandbox and counts as activity) without a key,
// once the owner's key still has the secret the token was issued under. A
// sandbox E2B's protocol created is routed with `Routed.Home` `/home/user`:
// envd's `layoutExec` and `inHome` give its user's commands `HOME` and `PWD`
// `/home/user` (started, without a cwd, in the account's home, the link's
// target) and put relative paths and cwds under it (E2B's layout; `/home/user`
// is the agent's link to `/workspace`). envd and the interpreter read the guest
// from the request context (`sandbox.RoutedFrom`); they never authenticate or
// look up anything themselves. Pause, connect and resume map to `Pause`, `Wake`
// and `WaitFor`; `set_timeout` to `Update{TimeoutSeconds}` (from now, shorter
// or longer); refresh to `Extend`. E2B's states are derived (`e2bState`);
// stopped and deleted sandboxes are not found, as E2B has no such states.
package e2b
