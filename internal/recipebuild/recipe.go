package recipebuild

import (
	"encoding/base64"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/emberbox/emberbox/internal/catalog"
	"github.com/emberbox/emberbox/internal/errdefs"
)

// defaultPath is the PATH of a step whose image sets none (as Docker's).
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Package names and specs go to the tools as arguments, never through a
// shell; these keep out options ("-…") and anything unprintable.
var (
	aptName = regexp.MustCompile(`^[a-z0-9][a-z0-9+.:~=-]*$`)
	pkgSpec = regexp.MustCompile(`^[A-Za-z0-9@_][A-Za-z0-9@_./:=<>!~^*+,\[\]-]*$`)
)

func invalid(format string, args ...any) error {
	return errdefs.New(errdefs.ErrInvalidArgument, "invalid_request", format, args...)
}

// compileRecipe turns a recipe into a one-stage plan: apt, pip, npm and go
// installs, then the files, then the commands, each a step, all as root.
func compileRecipe(r *catalog.Recipe) (*plan, error) {
	st := &stage{base: r.Base, baseStage: -1, env: map[string]string{}, labels: map[string]string{}}
	for k, v := range r.Env {
		if err := checkEnv(k, v); err != nil {
			return nil, invalid("recipe env: %v", err)
		}
		st.env[k] = v
	}
	for _, in := range packageInstallers {
		list := in.list(r)
		if len(list) == 0 {
			continue
		}
		if err := checkPackages(in.what, list, in.name); err != nil {
			return nil, err
		}
		st.steps = append(st.steps, &step{text: strings.ToUpper(in.what) + " " + strings.Join(list, " "),
			run: &runSpec{argv: slices.Concat(in.argv, list), env: recipeRunEnv(st), cwd: "/", user: "root"}})
	}
	if len(r.Files) > 0 {
		s, err := recipeFiles(r.Files)
		if err != nil {
			return nil, err
		}
		st.steps = append(st.steps, s)
	}
	if r.Workdir != "" {
		p, err := guestPath(r.Workdir)
		if err != nil {
			return nil, invalid("recipe workdir: %v", err)
		}
		st.workdir = p
		st.steps = append(st.steps, &step{text: "WORKDIR " + p, mkdir: p})
	}
	if len(r.Commands) > maxSteps {
		return nil, invalid("recipe commands: more than %d", maxSteps)
	}
	for i, c := range r.Commands {
		if c == "" || len(c) > 64<<10 || strings.IndexByte(c, 0) >= 0 {
			return nil, invalid("recipe commands[%d]: empty, over 64 KiB or with a NUL", i)
		}
		st.steps = append(st.steps, &step{text: "RUN " + c,
			run: &runSpec{argv: []string{"/bin/sh", "-c", c}, env: recipeRunEnv(st), cwd: orRoot(st.workdir), user: "root"}})
	}
	return &plan{stages: []*stage{st}}, nil
}

// packageInstallers are a recipe's package lists, installed in this order,
// each by one command with the packages appended to argv.
var packageInstallers = []struct {
	what string // the recipe's field; upper-cased, the step's name
	list func(*catalog.Recipe) []string
	name *regexp.Regexp // what a package in the list must look like
	argv []string
}{
	{"apt", func(r *catalog.Recipe) []string { return r.Apt }, aptName, []string{"/bin/sh", "-c",
		`apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" && rm -rf /var/lib/apt/lists/*`, "apt"}},
	{"pip", func(r *catalog.Recipe) []string { return r.Pip }, pkgSpec,
		[]string{"python3", "-m", "pip", "install", "--no-cache-dir", "--break-system-packages", "--"}},
	{"npm", func(r *catalog.Recipe) []string { return r.Npm }, pkgSpec, []string{"npm", "install", "--global", "--"}},
	{"go", func(r *catalog.Recipe) []string { return r.Go }, pkgSpec, []string{"/usr/bin/env", "GOBIN=/usr/local/bin", "GOPATH=/root/go", "GOCACHE=/root/.cache/go-build",
		"go", "install", "--"}},
}

// recipeRunEnv is the environment of a recipe's command: the recipe's env
// over a default PATH, as it stands when the step is compiled.
func recipeRunEnv(st *stage) map[string]string {
	env := map[string]string{"PATH": defaultPath}
	for k, v := range st.env {
		env[k] = v
	}
	return env
}

// checkPackages refuses a list that is too long or names something that
// is not a package.
func checkPackages(what string, list []string, re *regexp.Regexp) error {
	if len(list) > maxPackages {
		return invalid("recipe %s: more than %d packages", what, maxPackages)
	}
	for _, p := range list {
		if len(p) > 256 || !re.MatchString(p) {
			return invalid("recipe %s: %.100q is not a package name or specification", what, p)
		}
	}
	return nil
}

// recipeFiles is the step that writes a recipe's files, with their paths
// made guest paths; the caller's list stays as it was.
func recipeFiles(in []catalog.File) (*step, error) {
	if len(in) > maxRecipeFiles {
		return nil, invalid("recipe files: more than %d", maxRecipeFiles)
	}
	var total int
	files := slices.Clone(in)
	names := make([]string, 0, len(files))
	for i, f := range files {
		p, err := guestPath(f.Path)
		if err != nil {
			return nil, invalid("recipe files[%d]: %v", i, err)
		}
		if _, err := fileMode(f.Mode); err != nil {
			return nil, invalid("recipe files[%d] %s: %v", i, p, err)
		}
		b, err := fileContent(f)
		if err != nil {
			return nil, invalid("recipe files[%d] %s: %v", i, p, err)
		}
		if total += len(b); total > maxRecipeBytes {
			return nil, invalid("recipe files: more than %d bytes together", maxRecipeBytes)
		}
		files[i].Path = p
		names = append(names, p)
	}
	return &step{text: "FILES " + strings.Join(names, " "), copy: &copySpec{fromStage: -1, files: files}}, nil
}

func orRoot(dir string) string {
	if dir == "" {
		return "/"
	}
	return dir
}

// guestPath checks an absolute path in the image.
func guestPath(p string) (string, error) {
	if p == "" || len(p) > 4096 || strings.IndexByte(p, 0) >= 0 || !strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("path %.100q is not absolute", p)
	}
	c := path.Clean(p)
	if c == "/" {
		return "", fmt.Errorf("path %q names the root", p)
	}
	return c, nil
}

func fileMode(s string) (uint32, error) {
	if s == "" {
		return 0o644, nil
	}
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil || m > 0o7777 {
		return 0, fmt.Errorf("mode %.20q is not octal permission bits", s)
	}
	return uint32(m), nil
}

func fileContent(f catalog.File) ([]byte, error) {
	switch f.Encoding {
	case "", "utf-8", "utf8":
		return []byte(f.Content), nil
	case "base64":
		b, err := base64.StdEncoding.DecodeString(f.Content)
		if err != nil {
			return nil, fmt.Errorf("content is not base64: %v", err)
		}
		return b, nil
	}
	return nil, fmt.Errorf("encoding %.20q is not utf-8 or base64", f.Encoding)
}

func checkEnv(k, v string) error {
	if k == "" || len(k) > 256 || strings.ContainsAny(k, "=\x00") {
		return fmt.Errorf("name %.100q is empty, too long or has = or NUL", k)
	}
	if len(v) > 32<<10 || strings.IndexByte(v, 0) >= 0 {
		return fmt.Errorf("%s: value over 32 KiB or with a NUL", k)
	}
	return nil
}

// ownedByUser: recipe files under the sandbox user's directories belong to
// it, as the files it writes there do; the rest belong to root.
func ownedByUser(p string) bool {
	for _, d := range []string{"/workspace", "/home/user"} {
		if p == d || strings.HasPrefix(p, d+"/") {
			return true
		}
	}
	return false
}
