package envd

import (
	"maps"
	"path"

	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// E2B's layout: for a sandbox the router routed with a Home (E2B's
// /home/user), the sandbox user's commands start there with $HOME set to
// it, and its relative paths are under it, as with E2B's own envd. root
// (and any other account) keeps the guest's own home.

// homeFor returns the home user has in the routed layout, or "".
func homeFor(rt sandbox.Routed, user string) string {
	if user == "" || user == "user" {
		return rt.Home
	}
	return ""
}

// inHome makes a relative path (or "", the home itself) absolute under the
// layout's home; other paths, and any path without a layout, pass.
func inHome(rt sandbox.Routed, user, p string) string {
	if h := homeFor(rt, user); h != "" && !path.IsAbs(p) {
		return path.Join(h, p)
	}
	return p
}

// layoutExec gives a command the layout's $HOME and $PWD, and a relative
// cwd under the home; what the caller set wins. Without a cwd the command
// starts in the account's own home, the directory the layout's home links
// to, so a guest booted before the link existed still runs it; a shell
// then names it by $PWD, the layout's path, when the link is there.
func layoutExec(rt sandbox.Routed, er *guest.ExecRequest) {
	h := homeFor(rt, er.User)
	if h == "" {
		return
	}
	pwd := h
	if er.Cwd != "" {
		er.Cwd = inHome(rt, er.User, er.Cwd)
		pwd = er.Cwd
	}
	env := map[string]string{"HOME": h, "PWD": pwd}
	maps.Copy(env, er.Env)
	er.Env = env
}
