package api

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/emberbox/emberbox/internal/egress"
)

func TestCreateNetwork(t *testing.T) {
	e := newEnv(t)
	w := e.do("POST", "/v1/sandboxes", `{"network":{"allow":["pypi.org","*.pythonhosted.org","http://x"],"deny":["10.0.0.0/8","a..b"],"connect":["db:5432"],"zed":1}}`)
	if w.Code != 400 {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	var paths []string
	for _, is := range issuesOf(t, w) {
		paths = append(paths, is.Path)
	}
	if diff := cmp.Diff([]string{"network.zed"}, paths); diff != "" {
		t.Errorf("unknown field: issue paths (-want +got):\n%s", diff)
	}
	w = e.do("POST", "/v1/sandboxes", `{"network":{"allow":["pypi.org","*.pythonhosted.org","http://x"],"deny":["10.0.0.0/8","a..b"],"connect":["db:5432"]}}`)
	paths = nil
	for _, is := range issuesOf(t, w) {
		paths = append(paths, is.Path)
	}
	if diff := cmp.Diff([]string{"network.allow[2]", "network.connect", "network.deny[1]"}, paths); w.Code != 400 || diff != "" {
		t.Errorf("status %d, issue paths (-want +got):\n%s", w.Code, diff)
	}
	if e.m.creates != 0 {
		t.Errorf("manager called %d times", e.m.creates)
	}

	w = e.do("POST", "/v1/sandboxes", `{"network":{"allow":["pypi.org","*.pythonhosted.org"]}}`)
	if w.Code != 200 {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	want := &egress.Policy{Internet: true, Allow: []string{"pypi.org", "*.pythonhosted.org"}}
	if diff := cmp.Diff(want, e.m.lastSpec.Network); diff != "" {
		t.Errorf("spec.Network (-want +got):\n%s", diff)
	}
	w = e.do("POST", "/v1/sandboxes", `{"network":{"internet":false}}`)
	if w.Code != 200 || e.m.lastSpec.Network == nil || e.m.lastSpec.Network.Internet {
		t.Errorf("internet:false: status %d, spec %+v", w.Code, e.m.lastSpec.Network)
	}
	w = e.do("POST", "/v1/sandboxes", `{}`)
	if w.Code != 200 || e.m.lastSpec.Network != nil {
		t.Errorf("no network: status %d, spec %+v (want nil: the operator's default)", w.Code, e.m.lastSpec.Network)
	}
}

func TestNetworkRoutesWithoutEnforcement(t *testing.T) {
	e := newEnv(t)
	w := e.do("PUT", "/v1/sandboxes/sbx_x/network", `{"internet":true,"allow":["*"]}`)
	if w.Code != 400 {
		t.Errorf("invalid PUT: status %d: %s", w.Code, w.Body)
	}
	w = e.do("GET", "/v1/sandboxes/sbx_x/network", "")
	if w.Code != 503 || errorOf(t, w).Code != "network_unavailable" {
		t.Errorf("GET with a manager that does not enforce: %d %s", w.Code, w.Body)
	}
}
