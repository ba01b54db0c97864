package recipebuild

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/emberbox/emberbox/internal/catalog"
)

// A plan is a compiled source: stages of steps, the last one the image.
// Compiling reads nothing but the source (and the context archive), so
// refusals come before any VM starts.
type plan struct {
	stages []*stage
}

// stage is one FROM (a recipe is one stage): a base and steps run in one
// build sandbox, then the image configuration it ends with.
type stage struct {
	name string
	line int // of its FROM; 0 for a recipe
	// base is an image reference ("" the default image), used when
	// baseStage < 0; else the stage starts from that earlier stage's end.
	base      string
	baseStage int
	steps     []*step

	// The configuration the stage ends with: the image's if it is last.
	env     map[string]string
	workdir string
	user    string
	labels  map[string]string
	start   *catalog.StartSpec
	// exports are what later stages copy from this one (COPY --from).
	exports []*copySpec
}

// step is one instruction that changes the disk: a command, files copied
// in, or a directory made (WORKDIR).
type step struct {
	text string // as the log shows it: "RUN pip install x"
	line int    // in the Dockerfile; 0 for a recipe

	run   *runSpec
	copy  *copySpec
	mkdir string // WORKDIR: make this directory
}

// runSpec is a command run as it would be in the image being built.
type runSpec struct {
	argv []string
	env  map[string]string
	cwd  string
	user string // "" or "root": root; else the USER of the stage
}

// copySpec is a COPY/ADD (or a recipe's files): sources from the build
// context, another stage, or inline files, into dest in the sandbox.
type copySpec struct {
	fromStage int // -1: the context (or files)
	srcs      []string
	dest      string // absolute, in the guest
	chown     string // user[:group]; "" root
	chmod     uint32 // 0: as the sources have it
	files     []catalog.File

	// ops are the archives to unpack, made before the step's key is
	// computed (materialize); their digests go into it.
	ops []copyOp
}

// copyOp is one archive unpacked into dir; names are its top entries.
type copyOp struct {
	dir    string
	tar    string // host path of an uncompressed tar
	size   int64
	digest string
	names  []string
}

// Bounds of a source.
const (
	maxDockerfile   = 1 << 20
	maxSteps        = 200
	maxStages       = 20
	maxPackages     = 500
	maxArgLen       = 4096
	maxRecipeFiles  = 1000
	maxRecipeBytes  = 64 << 20 // of a recipe's files together
	maxContextBytes = 4 << 30  // unpacked, of one context
	maxContextFiles = 200_000
	maxCopyBytes    = 4 << 30 // of one COPY --from
)

// key chains a step onto the key of the steps before it. Everything that
// changes what the step does is in it: its text, its environment,
// directory and user, and the digests of the files it copies.
func (s *step) key(prev string) string {
	h := sha256.New()
	w := func(parts ...string) {
		for _, p := range parts {
			fmt.Fprintf(h, "%d:%s;", len(p), p)
		}
	}
	w("emberbox-build-step/1", prev, s.text)
	if s.run != nil {
		w("run")
		w(s.run.argv...)
		for _, k := range slices.Sorted(maps.Keys(s.run.env)) {
			w(k, s.run.env[k])
		}
		w(s.run.cwd, s.run.user)
	}
	if s.copy != nil {
		w("copy", s.copy.chown, fmt.Sprint(s.copy.chmod))
		for _, op := range s.copy.ops {
			w(op.dir, op.digest)
		}
	}
	w("mkdir", s.mkdir)
	return hex.EncodeToString(h.Sum(nil))
}

// baseKey is the key of a stage's start from an image.
func baseKey(digest string) string {
	sum := sha256.Sum256([]byte("emberbox-build-base/1;" + digest))
	return hex.EncodeToString(sum[:])
}

// shellQuote quotes a word for sh.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+@%") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func shellJoin(words []string) string {
	q := make([]string, len(words))
	for i, w := range words {
		q[i] = shellQuote(w)
	}
	return strings.Join(q, " ")
}
