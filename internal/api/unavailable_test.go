package api

import (
	"net/http"
	"strings"
	"testing"
)

// sdkUnavailable is what withruntime 0.35.0 calls that this server does not
// serve: each must answer 501 with a code ending in _unavailable (never
// retried by the SDK), in the one error shape.
var sdkUnavailable = []struct{ method, path string }{
	{"POST", "/v1/sandboxes/sbx_r/sessions"},
	{"POST", "/v1/sandboxes/sbx_r/mounts"},
	{"POST", "/v1/sandboxes/sbx_r/browser:start"},
	{"POST", "/v1/sandboxes/sbx_r/desktop:act"},
	{"GET", "/v1/sandboxes/sbx_r/mcp"},
	{"GET", "/v1/mcp/catalog"}, // no computer use configured
	{"POST", "/v1/sandboxes/sbx_r/tailscale"},
	{"POST", "/v1/sandboxes/sbx_r:resize"},
	{"POST", "/v1/sandboxes/sbx_r:retention"},
	{"GET", "/v1/images/registries"},
	{"POST", "/v1/images/registries"},
	{"POST", "/v1/images/registries:delete"},
	{"POST", "/v1/volumes/vol_1:backup-policy"},
	{"GET", "/v1/volumes"},        // no volume service configured
	{"GET", "/v1/volume-backups"}, // no volume service configured
	{"GET", "/v1/secrets"},
	{"GET", "/v1/egress-secrets"},
	{"POST", "/v1/apps"},
	{"GET", "/v1/jobs"},
	{"GET", "/v1/agents/sessions"},
	{"GET", "/v1/usage/requests"},
	{"GET", "/v1/switching"},
	{"POST", "/v1/webhooks/wh_1:test"},             // no webhook service configured
	{"POST", "/v1/webhook-deliveries/whd_1:retry"}, // no webhook service configured
	{"GET", "/v1/events"},                          // no webhook service configured
	{"POST", "/v1/job-imports"},
	{"GET", "/v1/sandboxes/sbx_r/processes/proc_1/files"},
}

func TestSDKRoutesNotBuiltAnswerUnavailable(t *testing.T) {
	e := newEnv(t)
	e.m.add("key_a", "sbx_r", "running", 0)
	for _, rt := range sdkUnavailable {
		w := e.do(rt.method, rt.path, "{}")
		if w.Code != http.StatusNotImplemented {
			t.Errorf("%s %s: status %d, want 501: %s", rt.method, rt.path, w.Code, w.Body)
			continue
		}
		got := errorOf(t, w)
		if !strings.HasSuffix(got.Code, "_unavailable") || got.Status != 501 || got.Message == "" {
			t.Errorf("%s %s: %+v, want a code ending in _unavailable", rt.method, rt.path, got)
		}
	}
	// What the SDK never calls is still not found.
	for _, p := range []string{"/v1/sandboxes/sbx_r/nonsense", "/v1/nonsense", "/v1/sandboxes/sbx_r:explode", "/v2/usage"} {
		w := e.do("GET", p, "")
		if w.Code != http.StatusNotFound || errorOf(t, w).Code != "route_not_found" {
			t.Errorf("GET %s: %d %s, want 404 route_not_found", p, w.Code, w.Body)
		}
	}
}

// TestSwitchImageRefusals: a switch of image checks its body, then the
// sandbox, then needs the image catalog, which a server without images
// (a cluster) answers as images do.
func TestSwitchImageRefusals(t *testing.T) {
	e := newEnv(t)
	e.m.add("key_a", "sbx_r", "running", 0)
	for _, tc := range []struct {
		path, body string
		status     int
		code       string
	}{
		{"/v1/sandboxes/sbx_r:switch-image", `{}`, 400, "invalid_request"},
		{"/v1/sandboxes/sbx_r:switch-image", `{"image": "  "}`, 400, "invalid_request"},
		{"/v1/sandboxes/sbx_r:switch-image", `{"image": "web", "keep": "everything"}`, 400, "invalid_request"},
		{"/v1/sandboxes/sbx_r:switch-image", `{"image": "web", "extra": 1}`, 400, "invalid_request"},
		{"/v1/sandboxes/sbx_none:switch-image", `{"image": "web", "keep": "workspace"}`, 404, "not_found"},
		{"/v1/sandboxes/sbx_r:switch-image", `{"image": "web", "keep": "workspace"}`, 501, "images_unavailable"},
	} {
		w := e.do("POST", tc.path, tc.body)
		got := errorOf(t, w)
		if w.Code != tc.status || got.Code != tc.code {
			t.Errorf("POST %s %s: %d %s, want %d %s", tc.path, tc.body, w.Code, w.Body, tc.status, tc.code)
		}
	}
}
