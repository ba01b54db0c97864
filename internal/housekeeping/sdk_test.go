package housekeeping

import (
	"strings"
	"testing"
)

// sdkRequires lists the modules the Go SDK may require, and why: a Go
// program that requires the SDK takes these, and nothing of the server's.
var sdkRequires = map[string]string{
	"github.com/coder/websocket": "Terminal: an interactive terminal over a WebSocket",
}

// serverOnly names modules of the server that the SDK must never pull in,
// so that a mistake in sdkRequires still fails.
var serverOnly = []string{
	"modernc.org/sqlite",
	"github.com/jackc/pgx",
	"github.com/prometheus",
	"github.com/spf13/cobra",
	"k8s.io",
	"github.com/moby/buildkit",
	"github.com/google/go-containerregistry",
}

// TestSDKModule checks that the Go SDK's module, as its go.mod resolves it
// in sdk/go, requires only what the client needs: a Go program requires the
// SDK without the server's dependencies.
func TestSDKModule(t *testing.T) {
	mods := goListIn(t, sdkModule, nil, "-m", "-f", "{{.Path}}", "all")
	if len(mods) == 0 || mods[0] != "github.com/emberbox/emberbox/"+sdkModule {
		t.Fatalf("go list -m all in %s: %q, want the SDK's module first", sdkModule, mods)
	}
	for _, m := range mods[1:] {
		for _, s := range serverOnly {
			if within(m, s) {
				t.Errorf("the SDK's module requires %s, a dependency of the server's", m)
			}
		}
		if _, ok := sdkRequires[m]; !ok {
			t.Errorf("the SDK's module requires %s, which sdkRequires does not allow: a Go program requiring the SDK would take it", m)
		}
	}
	for want := range sdkRequires {
		found := false
		for _, m := range mods {
			found = found || m == want
		}
		if !found {
			t.Logf("sdkRequires allows %s, which the SDK no longer requires", want)
		}
	}
	if t.Failed() {
		t.Logf("the SDK's modules: %s", strings.Join(mods, " "))
	}
}
