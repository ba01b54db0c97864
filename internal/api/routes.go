package api

import (
	"net/http"
	"sort"
	"strings"
)

// route is one operation of the API. The table in routeTable drives the mux,
// the OpenAPI document and the tests, so they cannot drift apart.
type route struct {
	Method string
	// Path as the OpenAPI document names it; a last segment "{id}:verb" is
	// a colon verb, which the mux cannot match by itself.
	Path    string
	OpID    string
	Summary string
	Public  bool // served without an API key
	// Guest: the route calls into the sandbox's guest, so a sandbox in any
	// state but running gets its state's refusal (sandbox.States).
	Guest   bool
	Query   []param // query parameters, for the document
	Body    any     // JSON request body type (a struct value), for the document
	RawBody bool    // the body is raw bytes (file content)
	MaxBody int64   // the largest body accepted; 0: maxBody
	// StreamBody: the handler reads the body itself, of any size; there
	// is no idempotency for it.
	StreamBody bool
	Answers    []string // content types of a 200 answer; default application/json
	// MethodPattern registers the route's path with the mux for its
	// method only, where two paths overlap (PUT /v1/images/context/{digest}
	// and GET /v1/images/{id}/logs); its path must have no other route.
	MethodPattern bool
	handle        handlerFunc
}

// param is a query parameter.
type param struct {
	Name     string
	Type     string // "string", "integer" or "boolean"
	Repeat   bool
	Required bool
	Doc      string
}

func (s *server) routeTable() []route {
	q := func(name, typ, doc string) param { return param{Name: name, Type: typ, Doc: doc} }
	pathParam := param{Name: "path", Type: "string", Required: true, Doc: "absolute, or relative to /workspace"}
	h := s.areas()
	return []route{
		{Method: "GET", Path: "/healthz", OpID: "health", Summary: "Liveness and version", Public: true, handle: s.health},
		{Method: "GET", Path: "/v1/openapi.json", OpID: "openapi", Summary: "This document", Public: true, handle: s.serveOpenAPI},

		{Method: "POST", Path: "/v1/sandboxes", OpID: "createSandbox", Summary: "Create a sandbox (Prefer: wait=N waits for running)",
			Body: createRequest{}, handle: h.sandboxes.create},
		{Method: "GET", Path: "/v1/sandboxes", OpID: "listSandboxes", Summary: "List sandboxes",
			Query: []param{
				{Name: "state", Type: "string", Repeat: true, Doc: "starting|running|pausing|paused|resuming|stopping|stopped|deleted"},
				q("name", "string", "exact name"),
				{Name: "label", Type: "string", Repeat: true, Doc: "key:value; all must match"},
				q("includeStopped", "boolean", "list stopped sandboxes too"),
				q("limit", "integer", "1..100, default 50"),
				q("cursor", "string", "nextCursor of the previous page"),
				q("owner", "string", `admin keys only: another key's id, or "all"`),
			}, handle: h.sandboxes.list},
		{Method: "GET", Path: "/metrics", OpID: "metrics", Summary: "Prometheus metrics (admin keys)", Answers: []string{"text/plain"},
			handle: s.serveMetrics},
		{Method: "GET", Path: "/v1/me", OpID: "me", Summary: "Who this key is", handle: h.usage.me},
		{Method: "GET", Path: "/v1/limits", OpID: "limits", Summary: "The quotas this key is held to, what it holds, and its charges of the last 24 hours",
			handle: h.usage.getLimits},
		{Method: "GET", Path: "/v1/usage", OpID: "usage", Summary: "Usage and charges from..to (default this month), by sandbox, key or day",
			Query: []param{q("from", "string", "RFC 3339 UTC; default the start of this month"), q("to", "string", "RFC 3339 UTC; default now"),
				q("groupBy", "string", "sandbox (default), key or day"), q("owner", "string", `admin keys only: another key's id, or "all"`)},
			handle: h.usage.get},
		{Method: "GET", Path: "/v1/usage/export", OpID: "exportUsage", Summary: "Settled usage rows (one per resource and hour) as CSV pages",
			Query: []param{{Name: "since", Type: "string", Required: true, Doc: "RFC 3339 UTC"}, {Name: "until", Type: "string", Required: true, Doc: "RFC 3339 UTC"},
				q("cursor", "string", "nextCursor of the previous page"), q("limit", "integer", "rows per page, 1..10000, default 1000"),
				q("owner", "string", `admin keys only: another key's id, or "all"`)},
			handle: h.usage.export},
		{Method: "GET", Path: "/v1/usage/compare", OpID: "compareUsage", Summary: "Usage of the last days priced here and at another provider's published rates",
			Query: []param{{Name: "provider", Type: "string", Required: true, Doc: "e2b, modal, blaxel, blaxel-no-standby, daytona, vercel or fly"},
				q("days", "integer", "1..90, default 30")},
			handle: h.usage.compare},
		{Method: "GET", Path: "/v1/sandboxes/{id}/usage", OpID: "sandboxUsage", Summary: "What a sandbox has used and cost so far",
			handle: h.usage.sandboxUsage},
		{Method: "GET", Path: "/v1/sandboxes/{id}/metrics", OpID: "sandboxMetrics", Summary: "CPU and memory of its VM as the host measured them",
			Query: []param{q("range", "string", "15m, 1h (default), 6h, 24h, 7d or 30d")}, handle: h.usage.sandboxMetrics},
		{Method: "GET", Path: "/v1/nodes", OpID: "listNodes", Summary: "The nodes of the cluster, their state and what they hold (admin keys)",
			handle: h.nodes.list},
		{Method: "POST", Path: "/v1/nodes/{id}:drain", OpID: "drainNode",
			Summary: "Drain a node: no new sandboxes are placed on it and its paused sandboxes move to other nodes (admin keys)",
			Body:    struct{}{}, handle: h.nodes.drain},
		{Method: "POST", Path: "/v1/nodes/{id}:undrain", OpID: "undrainNode", Summary: "End a node's drain (admin keys)",
			Body: struct{}{}, handle: h.nodes.undrain},
		{Method: "GET", Path: "/v1/keys", OpID: "listKeys", Summary: "API keys: every key for an admin key, the caller's own for a tenant key",
			handle: s.listKeys},
		{Method: "GET", Path: "/v1/sandboxes/{id}", OpID: "getSandbox", Summary: "Read a sandbox, optionally waiting for a state",
			Query:  []param{q("waitFor", "string", "a state to wait for"), q("timeoutSeconds", "integer", "wait limit, at most 120, default 60")},
			handle: h.sandboxes.get},
		{Method: "DELETE", Path: "/v1/sandboxes/{id}", OpID: "deleteSandbox", Summary: "Delete a sandbox and its disk", handle: h.sandboxes.delete},
		{Method: "POST", Path: "/v1/sandboxes/{id}:stop", OpID: "stopSandbox", Summary: "Stop a sandbox (Prefer: wait=N waits for stopped)",
			Body: struct{}{}, handle: h.sandboxes.stop},
		{Method: "POST", Path: "/v1/sandboxes/{id}:pause", OpID: "pauseSandbox",
			Summary: "Pause: memory and disk saved, no CPU or memory held (Prefer: wait=N waits for paused)",
			Body:    struct{}{}, handle: h.sandboxes.pause},
		{Method: "POST", Path: "/v1/sandboxes/{id}:wake", OpID: "wakeSandbox",
			Summary: "Wake a paused sandbox with a new lease (Prefer: wait=N waits for running); running: 409 not_paused",
			Body:    wakeRequest{}, handle: h.sandboxes.wake},
		{Method: "POST", Path: "/v1/sandboxes/{id}:restart", OpID: "restartSandbox",
			Summary: "Boot a stopped sandbox again from its kept disk (Prefer: wait=N waits for running)",
			Body:    struct{}{}, handle: h.sandboxes.restart},
		{Method: "POST", Path: "/v1/sandboxes/{id}:switch-image", OpID: "switchSandboxImage",
			Summary: "Move it to another image, keeping id, /workspace, volumes, env, name and previews; answers once it runs there (a failure: 409 switch_undone)",
			Body:    switchImageRequest{}, handle: h.sandboxes.switchImage},
		{Method: "POST", Path: "/v1/sandboxes/{id}:update", OpID: "updateSandbox",
			Summary: "Change name, labels, env, autoWake, idlePauseSeconds, persistent, timeoutSeconds, onTimeout",
			Body:    updateRequest{}, handle: h.sandboxes.update},
		{Method: "POST", Path: "/v1/sandboxes/{id}:snapshot", OpID: "snapshotSandbox",
			Summary: "Snapshot it (mode memory or disk); answers once the capture is over",
			Body:    snapshotRequest{}, handle: h.snapshots.capture},
		{Method: "POST", Path: "/v1/sandboxes/{id}:fork", OpID: "forkSandbox",
			Summary: "count copies of it as it is, answered as {sandboxes} once they run",
			Body:    forkRequest{}, handle: h.snapshots.fork},
		{Method: "POST", Path: "/v1/sandboxes/{id}/checkpoints", OpID: "createCheckpoint",
			Summary: "Checkpoint it (memory, processes, disk) as one of its own; answers once the capture is over",
			Body:    checkpointRequest{}, handle: h.checkpoints.create},
		{Method: "GET", Path: "/v1/sandboxes/{id}/checkpoints", OpID: "listCheckpoints",
			Summary: "Its checkpoints, oldest first, as {checkpoints}", handle: h.checkpoints.list},
		{Method: "GET", Path: "/v1/sandboxes/{id}/checkpoints/{cid}", OpID: "getCheckpoint",
			Summary: "Read one of its checkpoints", handle: h.checkpoints.get},
		{Method: "DELETE", Path: "/v1/sandboxes/{id}/checkpoints/{cid}", OpID: "deleteCheckpoint",
			Summary: "Delete one of its checkpoints; its files stay while a branch made from it exists", handle: h.checkpoints.delete},
		{Method: "POST", Path: "/v1/sandboxes/{id}/checkpoints/{cid}:restore", OpID: "restoreCheckpoint",
			Summary: "Bring it back to the checkpoint (keep:true checkpoints the present first); answers once it runs again",
			Body:    restoreRequest{}, handle: h.checkpoints.restore},
		{Method: "POST", Path: "/v1/sandboxes/{id}/checkpoints/{cid}:branch", OpID: "branchCheckpoint",
			Summary: "count new sandboxes from the checkpoint, answered as {sandboxes} once they run",
			Body:    branchRequest{}, handle: h.checkpoints.branch},
		{Method: "POST", Path: "/v1/sandboxes/{id}:extend", OpID: "extendSandbox", Summary: "Move the lease to now+seconds",
			Body: extendRequest{}, handle: h.sandboxes.extend},
		{Method: "POST", Path: "/v1/sandboxes/{id}:exec", OpID: "exec", Guest: true, Summary: "Run a command; stream:true answers NDJSON",
			Body: execRequest{}, Answers: []string{"application/json", "application/x-ndjson"}, handle: h.processes.exec},

		{Method: "POST", Path: "/v1/images", OpID: "createImage",
			Summary: "Queue a build of an image (recipe, dockerfile with a context, or image reference); answers at once, state queued",
			Body:    imageCreateRequest{}, MaxBody: maxImageBody, handle: h.images.create},
		{Method: "GET", Path: "/v1/images", OpID: "listImages", Summary: "This key's images and the public ones, newest first",
			Query: []param{q("state", "string", "queued|building|ready|failed|deleted"), q("name", "string", "exact name"),
				q("limit", "integer", "1..100, default 50"), q("cursor", "string", "nextCursor of the previous page")},
			handle: h.images.list},
		{Method: "GET", Path: "/v1/images/resolve", OpID: "resolveImage", Summary: "An image by name, name:tag or name@version",
			Query:  []param{{Name: "ref", Type: "string", Required: true, Doc: "name (its latest tag), name:tag or name@version"}},
			handle: h.images.resolve},
		{Method: "GET", Path: "/v1/images/{id}", OpID: "getImage", Summary: "Read an image", handle: h.images.get},
		{Method: "GET", Path: "/v1/images/{id}/logs", OpID: "imageLogs",
			Summary: "Its build log after a seq; follow=true streams NDJSON lines, then done with the image",
			Query:   []param{q("after", "integer", "the last seq read, default 0"), q("follow", "boolean", "stream until the build ends")},
			Answers: []string{"application/json", "application/x-ndjson"}, MethodPattern: true, handle: h.images.logs},
		{Method: "POST", Path: "/v1/images/{id}:tag", OpID: "tagImage", Summary: "Point a tag of its name at this version",
			Body: tagRequest{}, handle: h.images.tag},
		{Method: "POST", Path: "/v1/images/{id}:untag", OpID: "untagImage", Summary: "Remove a tag from it",
			Body: tagRequest{}, handle: h.images.untag},
		{Method: "POST", Path: "/v1/images/{id}:delete", OpID: "deleteImage",
			Summary: "Delete this version and its tags; refused (409 image_in_use) while a sandbox or snapshot uses it",
			Body:    struct{}{}, handle: h.images.delete},
		{Method: "POST", Path: "/v1/images/context/missing", OpID: "missingContextChunks",
			Summary: "Which of these context chunks (sha256 hex) the server does not have", Body: missingRequest{}, MethodPattern: true,
			handle: h.images.missingChunks},
		{Method: "PUT", Path: "/v1/images/context/{digest}", OpID: "putContextChunk",
			Summary: "Upload a context chunk (at most 1 MiB) named by its sha256", RawBody: true, MethodPattern: true, handle: h.images.putChunk},

		{Method: "GET", Path: "/v1/snapshots", OpID: "listSnapshots", Summary: "Snapshots of this key, newest first",
			Query: []param{q("sandboxId", "string", "the sandbox they were taken of"), q("name", "string", "exact name"),
				q("state", "string", "capturing|ready|failed"), q("limit", "integer", "1..100, default 50"),
				q("cursor", "string", "nextCursor of the previous page")}, handle: h.snapshots.list},
		{Method: "GET", Path: "/v1/snapshots/{id}", OpID: "getSnapshot", Summary: "Read a snapshot", handle: h.snapshots.get},

		{Method: "POST", Path: "/v1/volumes", OpID: "createVolume", Summary: "Create a volume: a disk of its own (ext4) that outlives sandboxes; fromBackup restores a backup",
			Body: createVolumeRequest{}, handle: h.volumes.create},
		{Method: "GET", Path: "/v1/volumes", OpID: "listVolumes", Summary: "Volumes of this key, newest first",
			Query: []param{q("state", "string", "ready|attached|deleted"), q("name", "string", "exact name"),
				q("limit", "integer", "1..100, default 50"), q("cursor", "string", "nextCursor of the previous page")},
			handle: h.volumes.list},
		{Method: "GET", Path: "/v1/volumes/{id}", OpID: "getVolume", Summary: "Read a volume", handle: h.volumes.get},
		{Method: "POST", Path: "/v1/volumes/{id}:resize", OpID: "resizeVolume", Summary: "Grow a detached volume (its filesystem grows at the next attach)",
			Body: resizeVolumeRequest{}, handle: h.volumes.resize},
		{Method: "POST", Path: "/v1/volumes/{id}:attach", OpID: "attachVolume",
			Summary: "Mount it in a running sandbox at path; one sandbox holds a volume at a time (else 409 volume_attached)",
			Body:    attachVolumeRequest{}, handle: h.volumes.attach},
		{Method: "POST", Path: "/v1/volumes/{id}:delete", OpID: "deleteVolume", Summary: "Delete a volume no sandbox holds, and its bytes",
			Body: struct{}{}, handle: h.volumes.delete},
		{Method: "GET", Path: "/v1/volumes/{id}/attachments/{aid}", OpID: "getVolumeAttachment", Summary: "Read an attachment",
			handle: h.volumes.getAttachment},
		{Method: "POST", Path: "/v1/volumes/{id}/attachments/{aid}:detach", OpID: "detachVolume",
			Summary: "Sync, unmount and disconnect it (a mount in use: 409 volume_busy)",
			Body:    struct{}{}, handle: h.volumes.detach},
		{Method: "POST", Path: "/v1/volumes/{id}:backup", OpID: "backupVolume",
			Summary: "Copy it now (copy-on-write clone or sparse copy; an attached one frozen in its guest for the copy); answers the ready backup",
			Body:    backupVolumeRequest{}, handle: h.volumes.backup},
		{Method: "GET", Path: "/v1/volume-backups", OpID: "listVolumeBackups", Summary: "Backups of this key, newest first",
			Query: []param{q("volumeId", "string", "the volume they are of"), q("state", "string", "creating|ready|failed|deleted"),
				q("limit", "integer", "1..100, default 50"), q("cursor", "string", "nextCursor of the previous page")},
			handle: h.volumes.listBackups},
		{Method: "GET", Path: "/v1/volume-backups/{id}", OpID: "getVolumeBackup", Summary: "Read a backup", handle: h.volumes.getBackup},
		{Method: "POST", Path: "/v1/volume-backups/{id}:delete", OpID: "deleteVolumeBackup", Summary: "Delete a backup and its copy",
			Body: struct{}{}, handle: h.volumes.deleteBackup},
		{Method: "PUT", Path: "/v1/egress-secrets/{name}", OpID: "setEgressSecret",
			Summary: "Store or replace a secret sandboxes use without seeing: they get env=placeholder, and the egress gate puts the value in credential headers of HTTPS requests to hosts that rules allow",
			Body:    setSecretRequest{}, handle: h.secrets.set},
		{Method: "GET", Path: "/v1/egress-secrets", OpID: "listEgressSecrets", Summary: "This key's secrets by name, as {secrets, next}: never values",
			Query: []param{q("limit", "integer", "1..100, default 100"), q("after", "string", "the name the page starts after")}, handle: h.secrets.list},
		{Method: "PUT", Path: "/v1/egress-secrets/{name}/sandboxes", OpID: "scopeEgressSecret",
			Summary: "Which sandboxes get it: labels selectors and ids; {} is every sandbox of the key", Body: scopeJSON{}, handle: h.secrets.scope},
		{Method: "PUT", Path: "/v1/egress-secrets/{name}/rules", OpID: "narrowEgressSecret",
			Summary: "Narrow its hosts or rules without the value (widening: set it again)", Body: narrowRequest{}, handle: h.secrets.narrow},
		{Method: "DELETE", Path: "/v1/egress-secrets/{name}", OpID: "deleteEgressSecret",
			Summary: "Erase it: its placeholder stops working at once", handle: h.secrets.delete},
		{Method: "GET", Path: "/v1/egress-ca", OpID: "listEgressCAs",
			Summary: "The CAs guests trust for egress secrets' hosts, oldest first, with how many running guests are known to trust each (admin keys)",
			handle:  h.secrets.listCAs},
		{Method: "POST", Path: "/v1/egress-ca:rotate", OpID: "rotateEgressCA",
			Summary: "Make a new egress CA: running guests are sent it before the answer, gates sign with it for each guest known to trust it, and the old ones stay trusted for keepPreviousSeconds (default a day; 0 retires them now) (admin keys)",
			Body:    rotateCARequest{}, handle: h.secrets.rotateCA},
		{Method: "POST", Path: "/v1/webhooks", OpID: "createWebhook",
			Summary: "Send this key's events to url, each a POST signed with Runtime-Signature; answers the webhook with its secret, shown this once",
			Body:    createWebhookRequest{}, handle: h.webhooks.create},
		{Method: "GET", Path: "/v1/webhooks", OpID: "listWebhooks", Summary: "Webhooks of this key, oldest first", handle: h.webhooks.list},
		{Method: "GET", Path: "/v1/webhooks/{id}", OpID: "getWebhook", Summary: "Read a webhook (without its secret)", handle: h.webhooks.get},
		{Method: "POST", Path: "/v1/webhooks/{id}:update", OpID: "updateWebhook", Summary: "Change its url, events, description or enabled",
			Body: updateWebhookRequest{}, handle: h.webhooks.update},
		{Method: "POST", Path: "/v1/webhooks/{id}:rotate-secret", OpID: "rotateWebhookSecret",
			Summary: "A new secret, answered once; the old one signs beside it for keepPreviousSeconds (default a day, at most a week)",
			Body:    rotateSecretRequest{}, handle: h.webhooks.rotate},
		{Method: "POST", Path: "/v1/webhooks/{id}:delete", OpID: "deleteWebhook", Summary: "Delete it and its deliveries",
			Body: struct{}{}, handle: h.webhooks.delete},
		{Method: "POST", Path: "/v1/webhooks/{id}:test", OpID: "testWebhook",
			Summary: "Send a signed webhook.test now, once; answers the delivery with how the receiver answered",
			Body:    struct{}{}, handle: h.webhooks.test},
		{Method: "GET", Path: "/v1/webhooks/{id}/deliveries", OpID: "listWebhookDeliveries", Summary: "Its deliveries, newest first",
			Query: []param{q("state", "string", "pending|delivered|failed"), q("limit", "integer", "1..100, default 50"),
				q("cursor", "string", "nextCursor of the previous page")}, handle: h.webhooks.deliveries},
		{Method: "POST", Path: "/v1/webhook-deliveries/{id}:retry", OpID: "retryWebhookDelivery",
			Summary: "Send a delivery again, once, now; answers it as it then is", Body: struct{}{}, handle: h.webhooks.retry},
		{Method: "GET", Path: "/v1/events", OpID: "listAccountEvents",
			Summary: "This key's events (sandboxes, snapshots, images), newest first, kept 14 days",
			Query: []param{q("resourceId", "string", "the sandbox, snapshot or image"), q("type", "string", "an event type, or a family such as sandbox.*"),
				q("limit", "integer", "1..100, default 50"), q("cursor", "string", "nextCursor of the previous page")},
			handle: h.webhooks.events},
		{Method: "POST", Path: "/v1/snapshots/{id}:update", OpID: "updateSnapshot", Summary: "Replace its name or labels (ifLabels fences)",
			Body: snapshotUpdateRequest{}, handle: h.snapshots.update},
		{Method: "POST", Path: "/v1/snapshots/{id}:delete", OpID: "deleteSnapshot",
			Summary: "Delete it; its files stay while a sandbox made from it exists", Body: struct{}{}, handle: h.snapshots.delete},
		{Method: "POST", Path: "/v1/snapshots/{id}:extend", OpID: "extendSnapshot", Summary: "Keep it retentionDays (1..365) from now",
			Body: snapshotExtendRequest{}, handle: h.snapshots.extend},

		{Method: "GET", Path: "/v1/sandboxes/{id}/events", OpID: "listEvents",
			Summary: "What happened to the sandbox (created, ready, stopped, egress_refused, ...), oldest first",
			Query: []param{q("limit", "integer", "the newest N events, 1..1000, default 100; a page is at most 1 MiB"),
				q("cursor", "string", "nextCursor of the previous page: the events before it")}, handle: h.sandboxes.listEvents},
		{Method: "GET", Path: "/v1/sandboxes/{id}/network", OpID: "getNetwork", Summary: "The sandbox's egress policy, its version and whether the host enforces it",
			handle: h.network.get},
		{Method: "PUT", Path: "/v1/sandboxes/{id}/network", OpID: "setNetwork",
			Summary: "Replace the egress policy; applies at once, cutting open connections it refuses",
			Body:    networkRequest{}, handle: h.network.put},

		{Method: "POST", Path: "/v1/sandboxes/{id}/processes", OpID: "spawnProcess", Guest: true, Summary: "Start a background process",
			Body: spawnRequest{}, handle: h.processes.spawn},
		{Method: "GET", Path: "/v1/sandboxes/{id}/processes", OpID: "listProcesses", Guest: true, Summary: "List processes", handle: h.processes.list},
		{Method: "GET", Path: "/v1/sandboxes/{id}/processes/{pid}", OpID: "getProcess", Guest: true, Summary: "Read a process", handle: h.processes.get},
		{Method: "GET", Path: "/v1/sandboxes/{id}/processes/{pid}/output", OpID: "processOutput", Guest: true, Summary: "A process's output events",
			Query: []param{q("cursor", "integer", "byte offset to start from"), q("waitMs", "integer", "wait this long for output, at most 60000"),
				q("follow", "boolean", "stream until the process ends")},
			Answers: []string{"application/x-ndjson"}, handle: h.processes.output},
		{Method: "POST", Path: "/v1/sandboxes/{id}/processes/{pid}:signal", OpID: "signalProcess", Guest: true, Summary: "Send a signal to a process",
			Body: signalRequest{}, handle: h.processes.signal},
		{Method: "POST", Path: "/v1/sandboxes/{id}/processes/{pid}:write", OpID: "writeProcess", Guest: true,
			Summary: "Input for a process spawned with stdinMode pipe or a pty, at offset (bytes already accepted); answers the offset reached",
			Body:    writeRequest{}, MaxBody: maxWriteBody, handle: h.processes.write},
		{Method: "POST", Path: "/v1/sandboxes/{id}/processes/{pid}:resize", OpID: "resizeProcess", Guest: true,
			Summary: "Set the window size of a pty process", Body: ptyJSON{}, handle: h.processes.resize},
		{Method: "GET", Path: "/v1/sandboxes/{id}/terminal", OpID: "terminal", Guest: true,
			Summary: "A terminal over a WebSocket: binary frames carry its bytes; text frames are JSON (resize in; ready, exit out)",
			Query: []param{q("cols", "integer", "default 80"), q("rows", "integer", "default 24"),
				q("command", "string", "default bash -l"), q("cwd", "string", "default /workspace"),
				q("user", "string", "sandbox (default) or root"), q("processId", "string", "reattach to this running terminal")},
			handle: h.sockets.terminal},

		{Method: "GET", Path: "/v1/sandboxes/{id}/files/content", OpID: "readFile", Guest: true, Summary: "Read a file's bytes",
			Query: []param{pathParam}, Answers: []string{"application/octet-stream"}, handle: h.files.read},
		{Method: "PUT", Path: "/v1/sandboxes/{id}/files/content", OpID: "writeFile", Guest: true, Summary: "Write a file (at most 1 MiB)",
			Query: []param{pathParam, q("mode", "string", "octal permissions, default 644")}, RawBody: true, handle: h.files.write},
		{Method: "GET", Path: "/v1/sandboxes/{id}/files/list", OpID: "listFiles", Guest: true, Summary: "List a directory",
			Query: []param{pathParam, q("depth", "integer", "levels below path, default 1"), q("hidden", "boolean", "include dotfiles"),
				q("limit", "integer", "at most this many entries"),
				q("glob", "string", `entries under path matching this pattern ("**" spans directories); depth is then ignored`)},
			handle: h.files.list},
		{Method: "GET", Path: "/v1/sandboxes/{id}/files/stat", OpID: "statFile", Guest: true, Summary: "A file's entry, or {exists:false}",
			Query: []param{pathParam}, handle: h.files.stat},
		{Method: "POST", Path: "/v1/sandboxes/{id}/files:mkdir", OpID: "mkdir", Guest: true, Summary: "Make a directory",
			Body: mkdirRequest{}, handle: h.files.mkdir},
		{Method: "POST", Path: "/v1/sandboxes/{id}/files:remove", OpID: "removeFile", Guest: true, Summary: "Remove a file or directory",
			Body: removeRequest{}, handle: h.files.remove},
		{Method: "POST", Path: "/v1/sandboxes/{id}/files:chmod", OpID: "chmodFile", Guest: true, Summary: "Change a file's permission bits",
			Body: chmodRequest{}, handle: h.files.chmod},

		{Method: "POST", Path: "/v1/sandboxes/{id}/files:rename", OpID: "renameFile", Guest: true,
			Summary: "Move a file or directory within one file system (overwrite replaces; else 409 file_exists)",
			Body:    renameRequest{}, handle: h.files.rename},
		{Method: "GET", Path: "/v1/sandboxes/{id}/files/archive", OpID: "downloadArchive", Guest: true,
			Summary: "A directory as a tar (gzip, the default) streamed from the guest; symlinks and modes kept",
			Query: []param{pathParam, q("gzip", "boolean", "gzip the tar (default true)"), q("user", "string", "sandbox (default) or root"),
				{Name: "exclude", Type: "string", Repeat: true, Doc: "a path relative to path, left out with what is below it"}},
			Answers: []string{"application/gzip", "application/x-tar"}, handle: h.files.downloadArchive},
		{Method: "PUT", Path: "/v1/sandboxes/{id}/files/archive", OpID: "uploadArchive", Guest: true,
			Summary: "Unpack a tar or tar.gz (at most 1 MiB) into a directory, merging; entries leaving it are refused",
			Query:   []param{pathParam, q("user", "string", "sandbox (default) or root")}, RawBody: true, handle: h.files.uploadArchive},

		{Method: "POST", Path: "/v1/sandboxes/{id}/files/archive/uploads", OpID: "beginArchiveUpload", Guest: true,
			Summary: "Begin a chunked upload of a tar or tar.gz (over 1 MiB, at most 4 GiB) to unpack into path",
			Body:    beginArchiveUploadRequest{}, handle: h.uploads.beginArchiveUpload},
		{Method: "PUT", Path: "/v1/sandboxes/{id}/files/archive/uploads/{uploadId}", OpID: "putArchiveChunk",
			Summary: "Send the next chunk (1 byte to chunkBytes) at offset, the bytes received so far; the last one again is a retry",
			Query:   []param{{Name: "offset", Type: "integer", Required: true, Doc: "the bytes received so far"}},
			RawBody: true, handle: h.uploads.putArchiveChunk},
		{Method: "POST", Path: "/v1/sandboxes/{id}/files/archive/uploads/{uploadId}:commit", OpID: "commitArchiveUpload",
			Summary: "Unpack what arrived into path, merging; answers {path, entries, bytes}",
			Body:    struct{}{}, handle: h.uploads.commitArchiveUpload},
		{Method: "POST", Path: "/v1/sandboxes/{id}/files/archive/uploads/{uploadId}:abort", OpID: "abortArchiveUpload",
			Summary: "Drop an archive upload and what arrived", Body: struct{}{}, handle: h.uploads.abortArchiveUpload},

		{Method: "POST", Path: "/v1/sandboxes/{id}/files:link", OpID: "makeFileLink",
			Summary: "A signed URL anyone may GET (a file, or with archive a directory as .tar.gz) or PUT (a file) without a key, until expiresInSeconds (default 3600, at most 7 days)",
			Body:    linkRequest{}, handle: h.links.make},
		{Method: "POST", Path: "/v1/sandboxes/{id}/files:revoke-links", OpID: "revokeFileLinks",
			Summary: "End every file link made for the sandbox", Body: struct{}{}, handle: h.links.revoke},
		{Method: "GET", Path: "/v1/links/{token}", OpID: "linkDownload", Public: true,
			Summary: "Download through a signed GET link (one Range supported); 403 link_invalid, link_expired or link_revoked",
			Answers: []string{"application/octet-stream", "application/gzip"}, handle: h.links.download},
		{Method: "PUT", Path: "/v1/links/{token}", OpID: "linkUpload", Public: true, RawBody: true, StreamBody: true,
			Summary: "Write the file of a signed PUT link with the body (Content-Length required, at most the link's maxBytes)",
			handle:  h.links.upload},

		{Method: "POST", Path: "/v1/sandboxes/{id}/files/watches", OpID: "startWatch", Guest: true,
			Summary: "Watch a directory (recursive: and every one below it, new ones too) for create, write, remove, rename and chmod; ends at timeoutMs (default 1 h, 0: until stopped) or when the sandbox stops",
			Body:    watchRequest{}, handle: h.watches.start},
		{Method: "GET", Path: "/v1/sandboxes/{id}/files/watches", OpID: "listWatches", Guest: true,
			Summary: "The sandbox's watches", handle: h.watches.list},
		{Method: "GET", Path: "/v1/sandboxes/{id}/files/watches/{watchId}/events", OpID: "watchEvents", Guest: true,
			Summary: "Events from cursor; follow streams NDJSON lines (events, notices, then end, paused, failure or continue)",
			Query: []param{q("cursor", "integer", "the event number to read from (nextCursor, or a line's cursor)"),
				q("waitMs", "integer", "without follow, wait this long for an event, at most 30000"),
				q("follow", "boolean", "stream for up to 110 s")},
			Answers: []string{"application/json", "application/x-ndjson"}, handle: h.watches.watchEvents},
		{Method: "DELETE", Path: "/v1/sandboxes/{id}/files/watches/{watchId}", OpID: "stopWatch", Guest: true,
			Summary: "Stop a watch", handle: h.watches.stop},

		{Method: "POST", Path: "/v1/sandboxes/{id}/uploads", OpID: "beginUpload", Guest: true,
			Summary: "Begin a chunked upload of a file under /workspace (for files over 1 MiB)",
			Body:    beginUploadRequest{}, handle: h.uploads.begin},
		{Method: "PUT", Path: "/v1/sandboxes/{id}/uploads/{uploadId}", OpID: "putUploadChunk",
			Summary: "Send one chunk (chunkBytes, or the rest at the end) at offset, in any order",
			Query:   []param{{Name: "offset", Type: "integer", Required: true, Doc: "a multiple of chunkBytes below the size"}},
			RawBody: true, handle: h.uploads.putChunk},
		{Method: "POST", Path: "/v1/sandboxes/{id}/uploads/{uploadId}:commit", OpID: "commitUpload",
			Summary: "Check the chunks and the sha256, then write the file; answers its entry",
			Body:    struct{}{}, handle: h.uploads.commit},
		{Method: "GET", Path: "/v1/sandboxes/{id}/tunnel", OpID: "tunnel", Guest: true,
			Summary: "WebSocket carrying connections to the sandbox's loopback ports (withruntime forward_port)", handle: h.sockets.tunnel},
		{Method: "POST", Path: "/v1/sandboxes/{id}/previews", OpID: "createPreview",
			Summary: "Share a port at a preview URL, or change its visibility, lifetime or embed origins",
			Body:    previewRequest{}, handle: h.previews.create},
		{Method: "GET", Path: "/v1/sandboxes/{id}/previews", OpID: "listPreviews", Summary: "Shared ports, each private one with a fresh token",
			handle: h.previews.list},
		{Method: "GET", Path: "/v1/sandboxes/{id}/previews/{port}", OpID: "getPreview", Summary: "A shared port, with a fresh token",
			Query:  []param{q("ttlSeconds", "integer", "the token's lifetime, 60..604800"), q("expiresAt", "string", "RFC 3339: the token ends by then")},
			handle: h.previews.get},
		{Method: "DELETE", Path: "/v1/sandboxes/{id}/previews/{port}", OpID: "deletePreview", Summary: "Stop sharing a port; its open connections are closed",
			handle: h.previews.delete},
		{Method: "POST", Path: "/v1/sandboxes/{id}/previews/{port}:rotate", OpID: "rotatePreview",
			Summary: "Refuse every token of the preview issued so far and answer a new one", Body: struct{}{}, handle: h.previews.rotate},
		{Method: "POST", Path: "/v1/sandboxes/{id}/interpreter:run", OpID: "interpreterRun", Guest: true,
			Summary: "Run Python in a stateful IPython kernel (the context's, default \"python\"); results are MIME bundles; stream:true answers NDJSON",
			Body:    runRequest{}, MaxBody: maxRunBody, Answers: []string{"application/json", "application/x-ndjson"}, handle: h.interpreter.run},
		{Method: "POST", Path: "/v1/sandboxes/{id}/browser:start", OpID: "startBrowser", Guest: true,
			Summary: "Start Chromium in the sandbox (or answer the one running) and its private CDP WebSocket, cdpUrl",
			Body:    browserRequest{}, handle: h.browser.start},
		{Method: "GET", Path: "/v1/sandboxes/{id}/browser", OpID: "getBrowser", Guest: true,
			Summary: "Whether the sandbox's browser runs, with a fresh cdpUrl when it does", handle: h.browser.get},
		{Method: "POST", Path: "/v1/sandboxes/{id}/browser:stop", OpID: "stopBrowser", Guest: true,
			Summary: "End the sandbox's browser; its cdpUrls stop working", Body: struct{}{}, handle: h.browser.stop},
		{Method: "POST", Path: "/v1/sandboxes/{id}/desktop:start", OpID: "startDesktop", Guest: true,
			Summary: "Start the sandbox's desktop, an X display with a window manager (or answer the one running)",
			Body:    desktopRequest{}, handle: h.desktop.start},
		{Method: "GET", Path: "/v1/sandboxes/{id}/desktop", OpID: "getDesktop", Guest: true,
			Summary: "Whether the sandbox's desktop runs, and its size", handle: h.desktop.get},
		{Method: "POST", Path: "/v1/sandboxes/{id}/desktop:stop", OpID: "stopDesktop", Guest: true,
			Summary: "End the desktop and the browser window on it", Body: struct{}{}, handle: h.desktop.stop},
		{Method: "POST", Path: "/v1/sandboxes/{id}/desktop:act", OpID: "desktopAct", Guest: true,
			Summary: "Move, click, drag, scroll, type or press keys on the desktop; read the cursor or the windows; focus one; open a URL; launch a program",
			Body:    actRequest{}, handle: h.desktop.act},
		{Method: "GET", Path: "/v1/sandboxes/{id}/desktop/screenshot", OpID: "desktopScreenshot", Guest: true,
			Summary: "The desktop's screen, PNG or JPEG (?format=jpeg&quality=1..100)",
			Answers: []string{"image/png", "image/jpeg"}, handle: h.desktop.screenshot},
		{Method: "POST", Path: "/v1/sandboxes/{id}/desktop/recordings", OpID: "startRecording", Guest: true,
			Summary: "Record the desktop to MP4 (one at a time; fps, maxSeconds, maxMiB, crf); refused without room on the sandbox's disk",
			Body:    recordingRequest{}, handle: h.desktop.startRecording},
		{Method: "GET", Path: "/v1/sandboxes/{id}/desktop/recordings", OpID: "listRecordings", Guest: true,
			Summary: "The desktop's recordings, newest first", handle: h.desktop.listRecordings},
		{Method: "GET", Path: "/v1/sandboxes/{id}/desktop/recordings/{rec}", OpID: "getRecording", Guest: true,
			Summary: "A recording", handle: h.desktop.getRecording},
		{Method: "POST", Path: "/v1/sandboxes/{id}/desktop/recordings/{rec}:stop", OpID: "stopRecording", Guest: true,
			Summary: "Stop a recording; answers once its file is complete", Body: struct{}{}, handle: h.desktop.stopRecording},
		{Method: "GET", Path: "/v1/sandboxes/{id}/desktop/recordings/{rec}/video", OpID: "recordingVideo", Guest: true,
			Summary: "A finished recording's MP4", Answers: []string{"video/mp4"}, handle: h.desktop.recordingVideo},
		{Method: "GET", Path: "/v1/mcp/catalog", OpID: "mcpCatalog",
			Summary: "The MCP servers a sandbox can run: each one's package, the egress it needs and the secrets it reads", handle: h.mcp.catalog},
		{Method: "POST", Path: "/v1/sandboxes/{id}/mcp", OpID: "startMcp", Guest: true,
			Summary: "Install and run catalog MCP servers behind the sandbox's gateway (streamable HTTP, at servers[].url with headers); replace runs only these, public gives URLs guarded by the gateway's key",
			Body:    mcpRequest{}, handle: h.mcp.start},
		{Method: "GET", Path: "/v1/sandboxes/{id}/mcp", OpID: "getMcp", Guest: true,
			Summary: "Each MCP server's status (installing, running, failed with its log), with fresh URLs and headers", handle: h.mcp.get},
		{Method: "DELETE", Path: "/v1/sandboxes/{id}/mcp", OpID: "stopMcp", Guest: true,
			Summary: "Stop the gateway and its servers; their URLs stop working", handle: h.mcp.stop},
		{Method: "DELETE", Path: "/v1/sandboxes/{id}/desktop/recordings/{rec}", OpID: "deleteRecording", Guest: true,
			Summary: "Delete a recording (stopping it if it records)", handle: h.desktop.deleteRecording},
		{Method: "GET", Path: "/v1/sandboxes/{id}/interpreter/contexts", OpID: "listInterpreterContexts", Guest: true,
			Summary: "The sandbox's interpreter contexts", handle: h.interpreter.listContexts},
		{Method: "POST", Path: "/v1/sandboxes/{id}/interpreter/contexts", OpID: "createInterpreterContext", Guest: true,
			Summary: "Start an interpreter context (python) with its own state, cwd and env",
			Body:    contextRequest{}, handle: h.interpreter.createContext},
		{Method: "POST", Path: "/v1/sandboxes/{id}/interpreter/contexts/{ctx}:restart", OpID: "restartInterpreterContext", Guest: true,
			Summary: "Start the context's kernel again with empty state", Body: struct{}{}, handle: h.interpreter.restartContext},
		{Method: "POST", Path: "/v1/sandboxes/{id}/interpreter/contexts/{ctx}:interrupt", OpID: "interruptInterpreterContext", Guest: true,
			Summary: "Interrupt the running cell, as Ctrl-C would; the state stays", Body: struct{}{}, handle: h.interpreter.interruptContext},
		{Method: "DELETE", Path: "/v1/sandboxes/{id}/interpreter/contexts/{ctx}", OpID: "deleteInterpreterContext", Guest: true,
			Summary: "End a context and its kernel", handle: h.interpreter.deleteContext},
		{Method: "GET", Path: "/v1/sandboxes/{id}/interpreter/contexts/{ctx}/results/{name}", OpID: "interpreterResult", Guest: true,
			Summary: "A result too large to go inline (none: this server sends every result inline)",
			Answers: []string{"application/octet-stream"}, handle: h.interpreter.result},
		{Method: "POST", Path: "/v1/sandboxes/{id}/uploads/{uploadId}:abort", OpID: "abortUpload",
			Summary: "Drop an upload and its chunks", Body: struct{}{}, handle: h.uploads.abort},
	}
}

// group serves every route that shares one mux pattern: the routes of
// /v1/sandboxes/{id} and of /v1/sandboxes/{id}:verb are one group, told
// apart by the verb after the last ':' of the wildcard.
type group struct {
	s    *server
	wild string                       // the wildcard that may carry a verb, or ""
	ops  map[string]map[string]*route // verb → method → route
}

// splitVerb returns the mux pattern path of a route path, the wildcard
// that may carry a verb, and the verb.
func splitVerb(path string) (muxPath, wild, verb string) {
	i := strings.LastIndexByte(path, '/')
	prefix, last := path[:i+1], path[i+1:]
	if !strings.HasPrefix(last, "{") {
		return path, "", ""
	}
	end := strings.IndexByte(last, '}')
	wild = last[1:end]
	if rest := last[end+1:]; strings.HasPrefix(rest, ":") {
		verb = rest[1:]
	}
	return prefix + "{" + wild + "}", wild, verb
}

func (s *server) buildMux() *http.ServeMux {
	groups := map[string]*group{}
	var order []string
	for i := range s.routes {
		rt := &s.routes[i]
		muxPath, wild, verb := splitVerb(rt.Path)
		g := groups[muxPath]
		if g == nil {
			g = &group{s: s, wild: wild, ops: map[string]map[string]*route{}}
			groups[muxPath] = g
			order = append(order, muxPath)
		}
		if g.ops[verb] == nil {
			g.ops[verb] = map[string]*route{}
		}
		g.ops[verb][rt.Method] = rt
	}
	mux := http.NewServeMux()
	for _, p := range order {
		pattern := p
		for _, methods := range groups[p].ops {
			for m, rt := range methods {
				if rt.MethodPattern {
					pattern = m + " " + p
				}
			}
		}
		mux.Handle(pattern, groups[p])
	}
	// Previews are served on hosts of their own, never the API's: an
	// address of the old form is pointed there.
	mux.HandleFunc(previewPrefix, func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, r, newError(http.StatusMisdirectedRequest, "preview_moved", "Previews are not served on the API's host.").
			withHint("A preview has a host of its own, "+s.previewDomain.form()+"; GET /v1/sandboxes/{id}/previews gives its url."))
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, r, notServed(r))
	})
	return mux
}

func routeNotFound(r *http.Request) *apiError {
	return newError(http.StatusNotFound, "route_not_found", "No route "+r.Method+" "+r.URL.Path+".").
		withHint("GET /v1/openapi.json lists every route this server has.")
}

// ServeHTTP picks the route of the request's verb and method, answering
// route_not_found or method_not_allowed in the error shape.
func (g *group) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	verb := ""
	if g.wild != "" {
		v := r.PathValue(g.wild)
		if i := strings.LastIndexByte(v, ':'); i >= 0 {
			v, verb = v[:i], v[i+1:]
		}
		if v == "" {
			g.s.writeError(w, r, routeNotFound(r))
			return
		}
		r.SetPathValue(g.wild, v)
	}
	methods := g.ops[verb]
	if methods == nil {
		g.s.writeError(w, r, notServed(r))
		return
	}
	rt := methods[r.Method]
	if rt == nil && r.Method == http.MethodHead {
		rt = methods[http.MethodGet]
	}
	if rt == nil && unavailableCode(r.URL.Path) != "" {
		g.s.writeError(w, r, notServed(r))
		return
	}
	if rt == nil {
		allow := make([]string, 0, len(methods))
		for m := range methods {
			allow = append(allow, m)
		}
		sort.Strings(allow)
		w.Header().Set("Allow", strings.Join(allow, ", "))
		g.s.writeError(w, r, newError(http.StatusMethodNotAllowed, "method_not_allowed",
			r.Method+" is not allowed here.").withHint("Use "+strings.Join(allow, " or ")+"."))
		return
	}
	setRoute(r, rt)
	g.s.serveRoute(w, r, rt)
}
