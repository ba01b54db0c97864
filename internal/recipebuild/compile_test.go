package recipebuild

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/catalog"
	"github.com/emberbox/emberbox/internal/errdefs"
)

func TestCompileRecipe(t *testing.T) {
	r := &catalog.Recipe{
		Apt: []string{"jq"}, Pip: []string{"tabulate==0.9.0"}, Npm: []string{"left-pad@1.3.0"}, Go: []string{"example.com/x@v1.0.0"},
		Files:    []catalog.File{{Path: "/opt/app/run.sh", Content: "echo hi", Mode: "0755"}, {Path: "/workspace/data.txt", Content: "aGk=", Encoding: "base64"}},
		Commands: []string{"echo one", "echo two"},
		Env:      map[string]string{"APP": "1"},
		Workdir:  "/opt/app",
	}
	p, err := compileRecipe(r)
	if err != nil {
		t.Fatal(err)
	}
	st := p.stages[0]
	var texts []string
	for _, s := range st.steps {
		texts = append(texts, strings.Fields(s.text)[0])
	}
	if want := []string{"APT", "PIP", "NPM", "GO", "FILES", "WORKDIR", "RUN", "RUN"}; !slices.Equal(texts, want) {
		t.Fatalf("steps %q, want %q", texts, want)
	}
	pip := st.steps[1].run
	if pip.user != "root" || pip.argv[len(pip.argv)-1] != "tabulate==0.9.0" || pip.env["APP"] != "1" {
		t.Errorf("pip step %+v", pip)
	}
	if run := st.steps[6].run; run.cwd != "/opt/app" || !slices.Equal(run.argv, []string{"/bin/sh", "-c", "echo one"}) {
		t.Errorf("run step %+v", run)
	}

	for name, bad := range map[string]*catalog.Recipe{
		"option as package":  {Apt: []string{"-oFoo=bar"}},
		"pip shell":          {Pip: []string{"x; rm -rf /"}},
		"relative file":      {Files: []catalog.File{{Path: "etc/x"}}},
		"root file":          {Files: []catalog.File{{Path: "/"}}},
		"bad mode":           {Files: []catalog.File{{Path: "/x", Mode: "rwx"}}},
		"bad base64":         {Files: []catalog.File{{Path: "/x", Content: "!!", Encoding: "base64"}}},
		"empty command":      {Commands: []string{""}},
		"env with =":         {Env: map[string]string{"A=B": "c"}},
		"relative workdir":   {Workdir: "app"},
		"unknown encoding":   {Files: []catalog.File{{Path: "/x", Encoding: "utf-16"}}},
		"too many packages":  {Pip: make([]string, maxPackages+1)},
		"newline in package": {Npm: []string{"a\nb"}},
	} {
		if _, err := compileRecipe(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: %v, want invalid argument", name, err)
		}
	}
}

func TestCompileDockerfile(t *testing.T) {
	df := `# syntax=docker/dockerfile:1
ARG BASE=default
ARG VERSION=1
FROM $BASE AS builder
ARG VERSION
ENV OUT=/out
WORKDIR /src
COPY app/ ./
RUN echo "$VERSION" > $OUT.txt && make
FROM builder AS unused
RUN echo never
FROM ${BASE}
ARG VERSION
LABEL org.example.v=${VERSION}
USER user
COPY --from=builder --chown=user /src/bin /usr/local/bin/app
EXPOSE 8080
CMD ["app", "--port", "8080"]
HEALTHCHECK CMD curl -f http://localhost:8080/
`
	p, notices, err := compileDockerfile(df, map[string]string{"VERSION": "7"}, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(p.stages) != 2 {
		t.Fatalf("%d stages, want 2 (the unused one dropped)", len(p.stages))
	}
	b, final := p.stages[0], p.stages[1]
	if b.base != "default" || b.name != "builder" || final.base != "default" {
		t.Errorf("bases %q %q", b.base, final.base)
	}
	run := b.steps[2].run
	if run.env["VERSION"] != "7" || run.env["OUT"] != "/out" || run.cwd != "/src" || b.steps[2].line != 9 {
		t.Errorf("RUN %+v line %d", run, b.steps[2].line)
	}
	if cp := b.steps[1].copy; cp.dest != "/src/" || cp.fromStage != -1 {
		t.Errorf("COPY %+v", cp)
	}
	if len(b.exports) != 1 || b.exports[0].srcs[0] != "/src/bin" || b.exports[0].chown != "user" {
		t.Errorf("exports %+v", b.exports)
	}
	if final.labels["org.example.v"] != "7" || final.user != "user" {
		t.Errorf("final %+v", final)
	}
	if final.start == nil || final.start.Command != "app --port 8080" || final.start.ReadyCommand != "curl -f http://localhost:8080/" {
		t.Errorf("start %+v", final.start)
	}
	if len(notices) != 1 || !strings.Contains(notices[0], "line 17: EXPOSE ignored") {
		t.Errorf("notices %q", notices)
	}

	// The target picks a stage.
	p, _, err = compileDockerfile(df, nil, "builder")
	if err != nil || len(p.stages) != 1 || p.stages[0].steps[2].run.env["VERSION"] != "1" {
		t.Fatalf("target builder: %v", err)
	}
	if _, _, err := compileDockerfile(df, nil, "nope"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("unknown target: %v", err)
	}

	for _, c := range []struct{ df, want string }{
		{"FROM default\nONBUILD RUN x\n", "line 2: ONBUILD"},
		{"FROM default\nRUN true\nSHELL [\"/bin/bash\", \"-c\"]\n", "line 3: SHELL"},
		{"FROM default\nRUN --mount=type=cache,target=/x true\n", "line 2: RUN --mount"},
		{"FROM default\nRUN --network=none true\n", "line 2: RUN --network"},
		{"FROM default\nADD https://example.com/x /x\n", "line 2: ADD https://example.com/x: ADD of a URL"},
		{"FROM default\nADD app.tar.gz /x\n", "line 2: ADD app.tar.gz: ADD of an archive"},
		{"FROM scratch\n", "line 1: FROM scratch"},
		{"FROM default\nCOPY --from=nope /a /b\n", "line 2: COPY --from=nope"},
		{"FROM default\nCOPY <<EOF /x\nhi\nEOF\n", "line 2: COPY with a heredoc"},
		{"FROM --platform=linux/arm64 default\n", "line 1: FROM --platform"},
		{"RUN true\n", "no build stage"},
		{"", "empty"},
	} {
		_, _, err := compileDockerfile(c.df, nil, "")
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want invalid argument with %q", c.df, err, c.want)
		}
	}
}

// contextArchive packs entries (name → content; a name ending in / is a
// directory; "->" in the content makes a symlink) as a gzipped tar.
func contextArchive(t *testing.T, dir string, entries [][2]string) string {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, e := range entries {
		h := &tar.Header{Name: e[0], Mode: 0o644, Typeflag: tar.TypeReg, Size: int64(len(e[1]))}
		switch {
		case strings.HasSuffix(e[0], "/"):
			h.Typeflag, h.Size, h.Mode = tar.TypeDir, 0, 0o755
		case strings.HasPrefix(e[1], "->"):
			h.Typeflag, h.Size, h.Linkname = tar.TypeSymlink, 0, e[1][2:]
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(e[1]))
		}
	}
	tw.Close()
	zw.Close()
	p := filepath.Join(dir, "context.tar.gz")
	if err := os.WriteFile(p, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func opEntries(t *testing.T, ops []copyOp) map[string]string {
	t.Helper()
	got := map[string]string{}
	for _, op := range ops {
		f, err := os.Open(op.tar)
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(f)
		for {
			h, err := tr.Next()
			if err != nil {
				break
			}
			var b bytes.Buffer
			b.ReadFrom(tr)
			got[op.dir+" "+h.Name] = b.String()
		}
		f.Close()
	}
	return got
}

func TestContextCopies(t *testing.T) {
	dir := t.TempDir()
	file := contextArchive(t, dir, [][2]string{{"./app/", ""}, {"./app/main.py", "print(1)"}, {"app/lib/x.py", "x"},
		{"README.md", "readme"}, {"notes.md", "notes"}, {"link", "->/etc/passwd"}})
	for _, c := range []struct {
		srcs []string
		dest string
		want []string
	}{
		{[]string{"app"}, "/srv/", []string{"/srv main.py", "/srv lib/x.py"}},
		{[]string{"README.md"}, "/srv/readme.txt", []string{"/srv readme.txt"}},
		{[]string{"README.md"}, "/srv/", []string{"/srv README.md"}},
		{[]string{"*.md"}, "/docs/", []string{"/docs README.md", "/docs notes.md"}},
		{[]string{"../app/main.py"}, "/x", []string{"/ x"}},
		{[]string{"link"}, "/x/", []string{"/x link"}},
	} {
		ops, err := contextOps(file, dir, &copySpec{fromStage: -1, srcs: c.srcs, dest: c.dest})
		if err != nil {
			t.Fatalf("%q: %v", c.srcs, err)
		}
		got := opEntries(t, ops)
		for _, w := range c.want {
			if _, ok := got[w]; !ok {
				t.Errorf("COPY %q %s: entries %q lack %q", c.srcs, c.dest, keys(got), w)
			}
		}
	}
	if _, err := contextOps(file, dir, &copySpec{srcs: []string{"missing"}, dest: "/x"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("missing source: %v", err)
	}

	// Hostile archives are refused, whatever is copied.
	for name, entries := range map[string][][2]string{
		"dot-dot":  {{"../evil", "x"}},
		"absolute": {{"/etc/evil", "x"}},
		"deep":     {{"a/../../evil", "x"}},
	} {
		d := t.TempDir()
		f := contextArchive(t, d, entries)
		if _, err := contextOps(f, d, &copySpec{srcs: []string{"."}, dest: "/x/"}); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: %v, want invalid argument", name, err)
		}
	}
	os.WriteFile(filepath.Join(dir, "junk.tar.gz"), []byte("not gzip"), 0o600)
	if _, err := contextOps(filepath.Join(dir, "junk.tar.gz"), dir, &copySpec{srcs: []string{"."}, dest: "/x/"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("junk: %v", err)
	}
}

func keys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }

// A step's key changes with anything it copies, and with everything before
// it; the same inputs give the same key.
func TestKeys(t *testing.T) {
	dir := t.TempDir()
	keyOf := func(content string) string {
		d := filepath.Join(dir, content)
		os.Mkdir(d, 0o700)
		f := contextArchive(t, d, [][2]string{{"a.txt", content}})
		s := &step{text: "COPY a.txt /a.txt", copy: &copySpec{srcs: []string{"a.txt"}, dest: "/a.txt"}}
		ops, err := contextOps(f, d, s.copy)
		if err != nil {
			t.Fatal(err)
		}
		s.copy.ops = ops
		return s.key(baseKey("sha256:base"))
	}
	if keyOf("one") != keyOf("one") {
		t.Error("the same copy gives two keys")
	}
	if keyOf("one") == keyOf("two") {
		t.Error("a copy of other content gives the same key")
	}
	// Times do not count: the same files uploaded again hit the cache.
	touched := func(mtime int64) string {
		d := t.TempDir()
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		tw := tar.NewWriter(zw)
		tw.WriteHeader(&tar.Header{Name: "a.txt", Mode: 0o644, Size: 3, ModTime: time.Unix(mtime, 0), Typeflag: tar.TypeReg})
		tw.Write([]byte("one"))
		tw.Close()
		zw.Close()
		f := filepath.Join(d, "context.tar.gz")
		os.WriteFile(f, buf.Bytes(), 0o600)
		ops, err := contextOps(f, d, &copySpec{srcs: []string{"a.txt"}, dest: "/a.txt"})
		if err != nil {
			t.Fatal(err)
		}
		return ops[0].digest
	}
	if touched(1) != touched(1700000000) {
		t.Error("a file's time changes its copy's digest")
	}
	run := func(env string) *step {
		return &step{text: "RUN x", run: &runSpec{argv: []string{"sh", "-c", "x"}, env: map[string]string{"V": env}}}
	}
	if run("1").key("a") == run("2").key("a") || run("1").key("a") == run("1").key("b") || run("1").key("a") != run("1").key("a") {
		t.Error("run keys do not follow their environment and their predecessor")
	}
	p1, _ := compileRecipe(&catalog.Recipe{Files: []catalog.File{{Path: "/x", Content: "1"}}})
	p2, _ := compileRecipe(&catalog.Recipe{Files: []catalog.File{{Path: "/x", Content: "2"}}})
	for _, p := range []*plan{p1, p2} {
		ops, err := fileOps(dir, p.stages[0].steps[0].copy)
		if err != nil {
			t.Fatal(err)
		}
		p.stages[0].steps[0].copy.ops = ops
	}
	if p1.stages[0].steps[0].key("k") == p2.stages[0].steps[0].key("k") {
		t.Error("recipe files of other content give the same key")
	}
}

func TestAsUser(t *testing.T) {
	argv := []string{"sh", "-c", "id"}
	for _, c := range []struct {
		user, execUser string
		prefix         []string
	}{
		{"", "root", nil},
		{"root", "root", nil},
		{"0:0", "root", nil},
		{"user", "user", nil},
		{"1000", "user", nil},
		{"www-data", "root", []string{"runuser", "-u", "www-data", "--"}},
		{"app:staff", "root", []string{"runuser", "-u", "app", "-g", "staff", "--"}},
		{"33", "root", []string{"setpriv", "--reuid", "33", "--regid", "33", "--clear-groups", "--"}},
	} {
		got, u := asUser(c.user, argv)
		if u != c.execUser || !slices.Equal(got, append(slices.Clone(c.prefix), argv...)) {
			t.Errorf("USER %q: %q as %q", c.user, got, u)
		}
	}
}
