package housekeeping

import (
	"strings"
	"testing"
)

// linuxOnly lists the packages that only ever run on Linux, and why. Every
// other package of the module, tests included, must vet for darwin:
// clients import the API's types and errors, and developers run the unit
// tests on their laptops. Linux-only code elsewhere goes in _linux.go files,
// with an _other.go stub only where a portable package needs one.
var linuxOnly = map[string]string{
	"cmd/emberbox":       "the server links the QEMU driver",
	"cmd/emberbox-agent": "the guest agent: PID 1 of a Linux VM",
	"internal/agent":     "the guest agent's core: fsuid threads, SO_ORIGINAL_DST, sysinfo, sethostname",
	"internal/vmm/qemu":  "the QEMU driver: pidfds and /proc",
}

// TestVetDarwin runs `go vet` for darwin on Apple silicon on every package
// not in linuxOnly, and on the SDK's module.
func TestVetDarwin(t *testing.T) {
	_, mod := moduleRoot(t)
	pkgs := goList(t, nil, "-f", "{{.ImportPath}}", "./...")
	for rel := range linuxOnly {
		found := false
		for _, p := range pkgs {
			found = found || p == mod+"/"+rel
		}
		if !found {
			t.Errorf("linuxOnly names %s, which is not a package of the module", rel)
		}
	}
	for _, p := range pkgs {
		rel := strings.TrimPrefix(strings.TrimPrefix(p, mod), "/")
		if _, ok := linuxOnly[rel]; ok || rel == "" {
			continue
		}
		t.Run(strings.ReplaceAll(rel, "/", "_"), func(t *testing.T) {
			t.Parallel()
			out, err := goCmd(t, []string{"GOOS=darwin", "GOARCH=arm64"}, "vet", p).CombinedOutput()
			if err != nil {
				t.Errorf("GOOS=darwin go vet %s: %v\n%s", rel, err, out)
			}
		})
	}
	// The SDK, its own module, is vetted from its directory.
	t.Run(strings.ReplaceAll(sdkModule, "/", "_"), func(t *testing.T) {
		t.Parallel()
		out, err := goCmdIn(t, sdkModule, []string{"GOOS=darwin", "GOARCH=arm64"}, "vet", "./...").CombinedOutput()
		if err != nil {
			t.Errorf("GOOS=darwin go vet ./... in %s: %v\n%s", sdkModule, err, out)
		}
	})
}
