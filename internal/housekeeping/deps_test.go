package housekeeping

import (
	"strings"
	"testing"
)

// linuxAgent is the environment the guest agent is built for; the server
// runs on Linux too, so the fences are checked as built there.
var linuxAgent = []string{"GOOS=linux", "CGO_ENABLED=0"}

// TestDependencyFence checks that packages do not import what their place
// in the design forbids.
func TestDependencyFence(t *testing.T) {
	_, mod := moduleRoot(t)
	for _, f := range []struct {
		from, to string
		direct   bool // only a direct import breaks the fence
		why      string
	}{
		{"cmd/emberbox-agent", "internal/store", false, "the guest keeps no host state"},
		{"cmd/emberbox-agent", "modernc.org/sqlite", false, "the guest keeps no host state"},
		{"cmd/emberbox-agent", "database/sql", false, "the guest keeps no host state"},
		{"cmd/emberbox-agent", "internal/api", false, "the guest does not serve the public API"},
		{"internal/api", "internal/store", false, "the API reaches state only through the manager"},
		{"internal/api", "internal/agentproto", true, "guest wire types stay below the manager; the API has its own"},
		{"sdk/go", "internal", false, "the Go SDK is imported by other modules' programs, which cannot import internal packages"},
	} {
		from, to := mod+"/"+f.from, f.to
		if to == "internal" || strings.HasPrefix(to, "internal/") {
			to = mod + "/" + to
		}
		// The SDK is its own module: its dependencies are as its module
		// resolves them, seen from its directory.
		in := ""
		if within(f.from, sdkModule) {
			in = sdkModule
		}
		name := f.from + " does not import " + f.to
		t.Run(strings.ReplaceAll(name, "/", "_"), func(t *testing.T) {
			var pkgs []string
			if f.direct {
				pkgs = goListIn(t, in, linuxAgent, "-f", `{{join .Imports "\n"}}`, from)
			} else {
				pkgs = goListIn(t, in, linuxAgent, "-deps", "-f", "{{.ImportPath}}", from)
			}
			for _, p := range pkgs {
				if within(p, to) {
					how := "links"
					if f.direct {
						how = "imports"
					}
					t.Errorf("%s %s %s: %s", f.from, how, p, f.why)
				}
			}
		})
	}
}

// TestVmmtestOnlyInTests checks that no package's own code, as opposed to
// its tests, links internal/vmm/vmmtest: its fake driver runs guest agents
// inside the process.
func TestVmmtestOnlyInTests(t *testing.T) {
	_, mod := moduleRoot(t)
	vmmtest := mod + "/internal/vmm/vmmtest"
	for _, line := range goList(t, linuxAgent, "-f", "{{.ImportPath}}{{range .Deps}} {{.}}{{end}}", "./...") {
		pkg, deps, _ := strings.Cut(line, " ")
		if pkg == vmmtest {
			continue
		}
		for _, d := range strings.Fields(deps) {
			if d == vmmtest {
				t.Errorf("%s links %s, which only tests may import", pkg, vmmtest)
			}
		}
	}
}
