package agent

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/emberbox/emberbox/internal/agentproto"
)

// account is a user commands and file operations run as.
type account struct {
	name     string
	uid, gid int
	groups   []uint32
	home     string
	shell    string
}

// names maps ids to names for file listings.
type names struct {
	users, groups map[int]string
}

// readAccounts parses /etc/passwd and /etc/group under root. It does not use
// os/user so that the static agent behaves the same everywhere.
func readAccounts(root string) (map[string]*account, names, error) {
	accts := map[string]*account{}
	n := names{users: map[int]string{}, groups: map[int]string{}}
	pw, err := os.Open(path.Join(root, "etc/passwd"))
	if err != nil {
		return nil, n, err
	}
	defer pw.Close()
	sc := bufio.NewScanner(pw)
	for sc.Scan() {
		f := strings.Split(sc.Text(), ":")
		if len(f) < 7 {
			continue
		}
		uid, err1 := strconv.Atoi(f[2])
		gid, err2 := strconv.Atoi(f[3])
		if err1 != nil || err2 != nil {
			continue
		}
		accts[f[0]] = &account{name: f[0], uid: uid, gid: gid, home: f[5], shell: f[6]}
		if _, dup := n.users[uid]; !dup {
			n.users[uid] = f[0]
		}
	}
	if gr, err := os.Open(path.Join(root, "etc/group")); err == nil {
		defer gr.Close()
		sc := bufio.NewScanner(gr)
		for sc.Scan() {
			f := strings.Split(sc.Text(), ":")
			if len(f) < 4 {
				continue
			}
			gid, err := strconv.Atoi(f[2])
			if err != nil {
				continue
			}
			if _, dup := n.groups[gid]; !dup {
				n.groups[gid] = f[0]
			}
			for _, m := range strings.Split(f[3], ",") {
				if a, ok := accts[m]; ok {
					a.groups = append(a.groups, uint32(gid))
				}
			}
		}
	}
	for _, a := range accts {
		a.groups = append(a.groups, uint32(a.gid))
		sort.Slice(a.groups, func(i, j int) bool { return a.groups[i] < a.groups[j] })
	}
	return accts, n, nil
}

// account returns the account for a request's user field.
func (a *Agent) account(name string) (*account, error) {
	if name == "" {
		return a.user, nil
	}
	if acct, ok := a.accounts[name]; ok {
		return acct, nil
	}
	return nil, invalid(fmt.Sprintf("unknown user %q", name))
}

// environ builds a command's environment: a login-like base, then the
// sandbox's env, then the request's.
func (a *Agent) environ(acct *account, extra map[string]string) []string {
	base := map[string]string{
		"HOME":    acct.home,
		"USER":    acct.name,
		"LOGNAME": acct.name,
		"SHELL":   "/bin/bash",
		"LANG":    "C.UTF-8",
		"TERM":    "xterm-256color",
		"PATH":    acct.home + "/.local/bin:/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin",
	}
	if acct.uid == 0 {
		base["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	a.mu.Lock()
	if a.relay {
		for k, v := range proxyEnv {
			base[k] = v
		}
		if a.caSet {
			base["NODE_EXTRA_CA_CERTS"] = extraCAFile
		}
	}
	for k, v := range a.secretEnv {
		base[k] = v
	}
	for k, v := range a.env {
		base[k] = v
	}
	a.mu.Unlock()
	for k, v := range extra {
		base[k] = v
	}
	env := make([]string, 0, len(base))
	for k, v := range base {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	return env
}

// resolvePath makes p absolute: relative paths are under home.
func resolvePath(home, p string) string {
	if p == "" {
		return home
	}
	if !path.IsAbs(p) {
		p = path.Join(home, p)
	}
	return path.Clean(p)
}

// maxPath bounds a request's path (Linux's PATH_MAX).
const maxPath = 4096

// checkPath refuses paths no file can have, with a coded error rather than
// whatever the system call would make of them.
func checkPath(p string) error {
	switch {
	case len(p) > maxPath:
		return invalid(fmt.Sprintf("path is longer than %d bytes", maxPath))
	case strings.IndexByte(p, 0) >= 0:
		return invalid("path contains NUL")
	}
	return nil
}

func invalid(msg string) *agentproto.Error {
	return &agentproto.Error{Code: agentproto.CodeInvalid, Message: msg}
}

func internal(err error) *agentproto.Error {
	return &agentproto.Error{Code: agentproto.CodeInternal, Message: err.Error()}
}

// e2bHome is the sandbox user's home in E2B's layout.
const e2bHome = "/home/user"

// linkHome makes E2B's home (under the agent's root) a link to the sandbox user's home
// when the image keeps that elsewhere (/workspace), so that code written
// for E2B and the Runtime API name one directory. An image that has
// something at /home/user keeps it.
func (a *Agent) linkHome() error {
	if a.user == nil || a.user.name != "user" || a.user.home == e2bHome {
		return nil
	}
	link := path.Join(a.root, e2bHome)
	if _, err := os.Lstat(link); !errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := os.MkdirAll(path.Dir(link), 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", path.Dir(link), err)
	}
	if err := os.Symlink(a.user.home, link); err != nil {
		return fmt.Errorf("linking %s to %s: %w", e2bHome, a.user.home, err)
	}
	return nil
}
