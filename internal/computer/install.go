package computer

import (
	"context"
	"fmt"
	"path"
	"strings"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
)

// The layer's programs run through the agent (agent.LayerExec); the paths
// are guestinit.AgentPath and agent.LayerDir.
const (
	agentPath = "/run/emberbox/emberbox-agent"
	layerDir  = "/run/emberbox/layer"
)

// launcher is how a browser is started: the argv before its flags, and
// the account it is spawned as.
type launcher struct {
	argv []string
	user string
}

// findScript prints "layer" when the computer-use layer has a browser,
// else the path of the first browser on PATH.
const findScript = `[ -x ` + layerDir + `/usr/bin/chromium ] && [ -x ` + agentPath + ` ] && { echo layer; exit 0; }
for b in chromium chromium-browser google-chrome-stable google-chrome; do
	p=$(command -v "$b") && { printf '%s\n' "$p"; exit 0; }
done
exit 1`

// installMarker starts the install script: what tells an install in a
// process list.
const installMarker = "# Emberbox browser install"

// installScript installs a Chromium with the image's package manager.
// Ubuntu's chromium-browser package is only a way to a snap, which a
// sandbox cannot run: it fails there, and says so.
const installScript = installMarker + `
set -eu
if command -v apt-get >/dev/null 2>&1; then
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q
	apt-get install -y -q --no-install-recommends chromium fonts-liberation
elif command -v apk >/dev/null 2>&1; then
	apk add --no-cache chromium font-liberation
elif command -v dnf >/dev/null 2>&1; then
	dnf install -y chromium liberation-fonts
else
	echo "no package manager this server knows (apt-get, apk, dnf) to install Chromium with" >&2
	exit 3
fi
`

// binary finds the browser of g, or starts or reports its install.
func (s *Service) binary(ctx context.Context, g Guest, procs []guest.ProcessInfo) (launcher, error) {
	res, err := g.Exec(ctx, guest.ExecRequest{Argv: []string{"/bin/sh", "-c", findScript}, MaxOutput: 4096,
		TimeoutMs: 30_000}, nil)
	if err != nil {
		return launcher{}, fmt.Errorf("looking for the browser: %w", err)
	}
	if res.ExitCode != nil && *res.ExitCode == 0 {
		p := strings.TrimSpace(string(res.Stdout))
		if p == "layer" {
			return launcher{argv: []string{agentPath, "layer-exec", "user", "chromium"}, user: "root"}, nil
		}
		if path.IsAbs(p) && !strings.ContainsAny(p, "\n\x00") && len(p) < 256 && path.Clean(p) == p {
			return launcher{argv: []string{p}}, nil
		}
		return launcher{}, errdefs.New(errdefs.ErrInternal, "browser_failed", "the sandbox named its browser %q, not a path", clip(printable(p), 100))
	}
	return launcher{}, s.install(ctx, g, procs)
}

// install reports an install under way or failed a moment ago, or
// starts one; it always answers an error a caller retries or reads.
func (s *Service) install(ctx context.Context, g Guest, procs []guest.ProcessInfo) error {
	var last *guest.ProcessInfo
	for i := range procs {
		p := &procs[i]
		if !isInstall(*p) {
			continue
		}
		if running(*p) {
			return installing()
		}
		if last == nil || p.StartedAt.After(last.StartedAt) {
			last = p
		}
	}
	if last != nil && last.EndedAt != nil && s.now().Sub(*last.EndedAt) < failedInstallHeld {
		return errdefs.New(errdefs.ErrConflict, "browser_install_failed",
			"installing Chromium in the sandbox failed (%s)", tail(ctx, g, last.ID)).
			WithHint("the default image has Chromium; a custom image needs one on PATH (chromium, chromium-browser or google-chrome), or egress to its package mirrors. A start a minute later tries again.")
	}
	info, err := g.Spawn(ctx, guest.ExecRequest{Argv: []string{"/bin/sh", "-c", installScript}, User: "root",
		Cwd: "/", Detach: true})
	if err != nil {
		return fmt.Errorf("starting the browser's install: %w", err)
	}
	s.log.Info("installing a browser in a sandbox of a custom image", "process", info.ID)
	return installing()
}

// isInstall reports whether p is an install this package started.
func isInstall(p guest.ProcessInfo) bool {
	return len(p.Argv) == 3 && p.Argv[0] == "/bin/sh" && p.Argv[1] == "-c" && strings.HasPrefix(p.Argv[2], installMarker)
}

func installing() error {
	e := errdefs.New(errdefs.ErrUnavailable, "browser_installing",
		"Chromium is being installed in the sandbox (its image has none); this takes a minute or more").
		WithHint("try again after retryAfterMs; the SDK's browser.start() waits by itself")
	e.RetryAfter = installRetryAfter
	return e
}
