package api

import (
	"net/http"
	"strings"
)

// Routes of the Runtime API that withruntime 0.35.0 calls and this server
// does not have answer 501 with a code ending in _unavailable: the SDK
// never retries those, and a caller can tell "not built here" from "no
// such sandbox" (404). Only the names the SDK uses are listed, so a
// mistyped path is still route_not_found.

// unavailableTop are the first segments after /v1/ of whole products.
var unavailableTop = map[string]bool{
	"account": true, "agents": true, "apps": true, "audit": true, "billing": true, "builds": true,
	"ci": true, "containers": true, "domains": true,
	"feedback": true, "functions": true, "ips": true, "job-imports": true, "job-runs": true, "jobs": true,
	"networks": true, "otel-exports": true, "plans": true,
	"ports": true, "referrals": true, "repositories": true, "reservations": true, "secrets": true,
	"sso": true, "support": true, "switching": true, "usage": true,
}

// unavailableSandboxSub are the segments after /v1/sandboxes/{id}/ (with
// any :verb stripped) of features of a sandbox, and their codes.
var unavailableSandboxSub = map[string]string{
	"mounts":   "mounts_unavailable",
	"sessions": "sessions_unavailable", "tailscale": "tailscale_unavailable",
}

// unavailableVerbs are the colon verbs of /v1/sandboxes/{id}.
var unavailableVerbs = map[string]string{
	"resize": "resize_unavailable", "retention": "retention_unavailable",
}

// unavailableCode returns the code of a path the SDK calls that this
// server does not serve, or "".
func unavailableCode(path string) string {
	rest, ok := strings.CutPrefix(path, "/v1/")
	if !ok {
		return ""
	}
	first, tail, _ := strings.Cut(rest, "/")
	if id, ok := strings.CutSuffix(tail, ":backup-policy"); first == "volumes" && ok && id != "" && !strings.ContainsAny(id, "/:") {
		// Volumes are served (volumes.go) but for their backup schedules.
		return "volume_backup_policy_unavailable"
	}
	if first == "images" {
		if reg, _, _ := strings.Cut(tail, ":"); reg == "registries" {
			return "image_registries_unavailable"
		}
		return ""
	}
	if first != "sandboxes" {
		name, _, _ := strings.Cut(first, ":")
		if unavailableTop[name] {
			return strings.ReplaceAll(name, "-", "_") + "_unavailable"
		}
		return ""
	}
	id, sub, hasSub := strings.Cut(tail, "/")
	if !hasSub {
		if i := strings.LastIndexByte(id, ':'); i > 0 {
			return unavailableVerbs[id[i+1:]]
		}
		return ""
	}
	seg, rest, _ := strings.Cut(sub, "/")
	if pid, tail, _ := strings.Cut(rest, "/"); seg == "processes" && pid != "" && tail == "files" {
		// Processes are served; the files a traced one touched are not
		// recorded (traceFiles is accepted and ignored).
		return "process_files_unavailable"
	}
	seg, _, _ = strings.Cut(seg, ":")
	return unavailableSandboxSub[seg]
}

// notServed answers a request no route serves: 501 for what the SDK
// knows and this server has not built, else route_not_found.
func notServed(r *http.Request) *apiError {
	if code := unavailableCode(r.URL.Path); code != "" {
		return newError(http.StatusNotImplemented, code, "This server does not offer "+r.Method+" "+r.URL.Path+".").
			withHint("Emberbox serves sandboxes, their commands, files, processes, terminals, code interpreter, browser and desktop, network, pause, wake, snapshots and checkpoints, images and switching them, volumes and their backups, tunnel and previews; GET /v1/openapi.json lists every route.")
	}
	return routeNotFound(r)
}
