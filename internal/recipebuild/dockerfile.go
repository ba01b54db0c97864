package recipebuild

import (
	"errors"
	"fmt"
	"maps"
	"path"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"

	"github.com/emberbox/emberbox/internal/catalog"
)

// dfNotice is a line for the build log: an instruction ignored.
type dfNotice = string

// compileDockerfile parses a Dockerfile with BuildKit's own parser and
// turns the stages the target needs into a plan. Supported: FROM (an
// image of ours, an OCI reference through the importer, or an earlier
// stage), RUN (shell and exec forms), COPY and ADD of local files (from
// the context or --from a stage), ENV, ARG, WORKDIR, USER, LABEL, CMD,
// ENTRYPOINT and HEALTHCHECK (the image's start). EXPOSE, VOLUME,
// STOPSIGNAL and MAINTAINER are ignored with a notice. Everything else is
// refused, naming the instruction and its line.
func compileDockerfile(df string, buildArgs map[string]string, target string) (*plan, []dfNotice, error) {
	res, dstages, metaArgs, err := parseDockerfile(df)
	if err != nil {
		return nil, nil, err
	}
	c := &dfCompiler{lex: shell.NewLex(res.EscapeToken), buildArgs: buildArgs, meta: map[string]string{}, byName: map[string]int{}}
	if err := c.globalArgs(metaArgs); err != nil {
		return nil, nil, err
	}
	last, err := targetStage(dstages, target)
	if err != nil {
		return nil, nil, err
	}
	p := &plan{}
	index := map[int]int{} // Dockerfile stage → plan stage
	for i := 0; i <= last; i++ {
		st, err := c.stage(&dstages[i], i)
		if err != nil {
			return nil, c.notices, err
		}
		index[i] = len(p.stages)
		p.stages = append(p.stages, st)
		if st.name != "" {
			c.byName[st.name] = i
		}
	}
	out := neededStages(p, index, last)
	n := 0
	for _, st := range out.stages {
		n += len(st.steps)
	}
	if n > maxSteps {
		return nil, c.notices, invalid("Dockerfile: more than %d steps", maxSteps)
	}
	return out, c.notices, nil
}

// parseDockerfile parses df with BuildKit's parser into its stages and
// global ARGs, within the size and stage limits.
func parseDockerfile(df string) (*parser.Result, []instructions.Stage, []instructions.ArgCommand, error) {
	if len(df) > maxDockerfile {
		return nil, nil, nil, invalid("Dockerfile: larger than %d bytes", maxDockerfile)
	}
	if strings.TrimSpace(df) == "" {
		return nil, nil, nil, invalid("Dockerfile: empty")
	}
	res, err := parser.Parse(strings.NewReader(df))
	if err != nil {
		return nil, nil, nil, invalid("Dockerfile: %v", lineOf(err))
	}
	dstages, metaArgs, err := instructions.Parse(res.AST, nil)
	if err != nil {
		return nil, nil, nil, invalid("Dockerfile: %v", lineOf(err))
	}
	if len(dstages) == 0 {
		return nil, nil, nil, invalid("Dockerfile: no FROM")
	}
	if len(dstages) > maxStages {
		return nil, nil, nil, invalid("Dockerfile: more than %d stages", maxStages)
	}
	return res, dstages, metaArgs, nil
}

// globalArgs sets the ARGs before the first FROM: from the build's
// arguments, else their defaults expanded in the ones before them.
func (c *dfCompiler) globalArgs(metaArgs []instructions.ArgCommand) error {
	for _, a := range metaArgs {
		for _, kv := range a.Args {
			v, given := c.buildArgs[kv.Key]
			if !given && kv.Value != nil {
				var err error
				if v, err = c.expand(*kv.Value, c.meta); err != nil {
					return c.refuse(&a, "%v", err)
				}
			}
			c.meta[kv.Key] = v
		}
	}
	return nil
}

// targetStage is the index of the stage the build ends with: the last of
// that name, or the last stage if target is empty.
func targetStage(dstages []instructions.Stage, target string) (int, error) {
	if target == "" {
		return len(dstages) - 1, nil
	}
	i, ok := -1, false
	for j, s := range dstages {
		if strings.EqualFold(s.Name, target) {
			i, ok = j, true
		}
	}
	if !ok {
		return 0, invalid("target %.100q: no stage of that name", target)
	}
	return i, nil
}

// neededStages drops the stages the target (Dockerfile stage last) does not
// need, renumbering references, and files each COPY --from with the stage
// it copies from. index maps Dockerfile stages to p's.
func neededStages(p *plan, index map[int]int, last int) *plan {
	need := make([]bool, last+1)
	need[last] = true
	for i := last; i >= 0; i-- {
		if !need[i] {
			continue
		}
		st := p.stages[index[i]]
		if st.baseStage >= 0 {
			need[st.baseStage] = true
		}
		for _, s := range st.steps {
			if s.copy != nil && s.copy.fromStage >= 0 {
				need[s.copy.fromStage] = true
			}
		}
	}
	out := &plan{}
	renum := map[int]int{}
	for i := 0; i <= last; i++ {
		if need[i] {
			renum[i] = len(out.stages)
			out.stages = append(out.stages, p.stages[index[i]])
		}
	}
	for _, st := range out.stages {
		if st.baseStage >= 0 {
			st.baseStage = renum[st.baseStage]
		}
		for _, s := range st.steps {
			if s.copy != nil && s.copy.fromStage >= 0 {
				s.copy.fromStage = renum[s.copy.fromStage]
				src := out.stages[s.copy.fromStage]
				src.exports = append(src.exports, s.copy)
			}
		}
	}
	return out
}

type dfCompiler struct {
	lex       *shell.Lex
	buildArgs map[string]string
	meta      map[string]string // global ARGs, for FROM and ARG defaults
	byName    map[string]int
	stages    []*stage
	notices   []dfNotice
}

type located interface{ Location() []parser.Range }

func lineOfNode(n located) int {
	if r := n.Location(); len(r) > 0 {
		return r[0].Start.Line
	}
	return 0
}

// lineOf gives a parse error's line when BuildKit knows it.
func lineOf(err error) string {
	var loc *parser.LocationError
	if errors.As(err, &loc) && len(loc.Locations) > 0 && len(loc.Locations[0]) > 0 {
		return fmt.Sprintf("line %d: %v", loc.Locations[0][0].Start.Line, err)
	}
	return err.Error()
}

func (c *dfCompiler) refuse(n located, format string, args ...any) error {
	return invalid("Dockerfile line %d: %s", lineOfNode(n), fmt.Sprintf(format, args...))
}

func (c *dfCompiler) expand(word string, env map[string]string) (string, error) {
	s, _, err := c.lex.ProcessWord(word, envGetter(env))
	return s, err
}

func (c *dfCompiler) stage(ds *instructions.Stage, idx int) (*stage, error) {
	st, err := c.from(ds)
	if err != nil {
		return nil, err
	}
	sc := &stageCompiler{c: c, st: st, args: map[string]string{}}
	for _, dc := range ds.Commands {
		if err := sc.instruction(dc); err != nil {
			return nil, err
		}
	}
	if start := startCommand(sc.entrypoint, sc.cmd); start != "" {
		st.start = &catalog.StartSpec{Command: start}
		switch health := sc.health; {
		case len(health) >= 2 && health[0] == "CMD-SHELL":
			st.start.ReadyCommand = health[1]
		case len(health) >= 2 && health[0] == "CMD":
			st.start.ReadyCommand = shellJoin(health[1:])
		}
	}
	c.stages = append(c.stages, st)
	_ = idx
	return st, nil
}

// from starts a stage at its FROM: an image by reference, or an earlier
// stage whose environment, labels, workdir, user and start it inherits.
func (c *dfCompiler) from(ds *instructions.Stage) (*stage, error) {
	st := &stage{name: strings.ToLower(ds.Name), line: lineOfNode(&fromNode{ds}), baseStage: -1, env: map[string]string{}, labels: map[string]string{}}
	from := &fromNode{ds}
	if ds.Platform != "" {
		p, err := c.expand(ds.Platform, c.meta)
		if err != nil || (p != "linux/amd64" && p != "$BUILDPLATFORM" && p != "$TARGETPLATFORM") {
			return nil, c.refuse(from, "FROM --platform=%s: only linux/amd64 images are built", ds.Platform)
		}
	}
	base, err := c.expand(ds.BaseName, c.meta)
	if err != nil {
		return nil, c.refuse(from, "FROM %s: %v", ds.BaseName, err)
	}
	switch j, ok := c.byName[strings.ToLower(base)]; {
	case ok:
		st.baseStage = j
		prev := c.stages[j]
		maps.Copy(st.env, prev.env)
		maps.Copy(st.labels, prev.labels)
		st.workdir, st.user, st.start = prev.workdir, prev.user, prev.start
	case strings.EqualFold(base, "scratch"):
		return nil, c.refuse(from, "FROM scratch: images here start from a bootable system; use one of ours (or leave the base out for the default image)")
	case base == "":
		return nil, c.refuse(from, "FROM with an empty image name")
	default:
		st.base = base
	}
	return st, nil
}

// A stageCompiler compiles the instructions of one stage after its FROM.
type stageCompiler struct {
	c    *dfCompiler
	st   *stage
	args map[string]string // the stage's ARGs

	// The image's start, composed once the stage is read.
	cmd, entrypoint *instructions.ShellDependantCmdLine
	health          []string
}

// vars is the environment a word is expanded in and a RUN sees: the
// stage's ARGs overridden by its ENV, with a default PATH.
func (sc *stageCompiler) vars() map[string]string {
	m := map[string]string{}
	maps.Copy(m, sc.args)
	maps.Copy(m, sc.st.env)
	if _, ok := m["PATH"]; !ok {
		m["PATH"] = defaultPath
	}
	return m
}

// instruction expands dc's words (RUN's are left to the shell) and
// compiles it by the rule for its type; a type without one is refused.
func (sc *stageCompiler) instruction(dc instructions.Command) error {
	if ex, ok := dc.(instructions.SupportsSingleWordExpansion); ok {
		if _, isRun := dc.(*instructions.RunCommand); !isRun {
			if err := ex.Expand(func(w string) (string, error) { return sc.c.expand(w, sc.vars()) }); err != nil {
				return sc.c.refuse(dc, "%s: %v", strings.ToUpper(dc.Name()), err)
			}
		}
	}
	compile, ok := instructionRules[reflect.TypeOf(dc)]
	if !ok {
		return sc.c.refuse(dc, "%s is not supported", strings.ToUpper(dc.Name()))
	}
	return compile(sc, dc)
}

// instructionRule compiles one instruction of the type it is filed under.
type instructionRule func(sc *stageCompiler, dc instructions.Command) error

// A typedRule is a rule and the instruction type it is filed under.
type typedRule struct {
	typ     reflect.Type
	compile instructionRule
}

// rule files compile under the instruction type T.
func rule[T instructions.Command](compile func(*stageCompiler, T) error) typedRule {
	return typedRule{reflect.TypeFor[T](), func(sc *stageCompiler, dc instructions.Command) error { return compile(sc, dc.(T)) }}
}

// instructionRules is the Dockerfile instructions a stage may hold, by type.
var instructionRules = rules(
	rule((*stageCompiler).env),
	rule((*stageCompiler).label),
	rule((*stageCompiler).arg),
	rule((*stageCompiler).workdir),
	rule((*stageCompiler).user),
	rule((*stageCompiler).run),
	rule((*stageCompiler).copy),
	rule((*stageCompiler).add),
	rule((*stageCompiler).cmdLine),
	rule((*stageCompiler).entrypointLine),
	rule((*stageCompiler).healthcheck),
	rule(ignore[*instructions.ExposeCommand]),
	rule(ignore[*instructions.VolumeCommand]),
	rule(ignore[*instructions.StopSignalCommand]),
	rule(ignore[*instructions.MaintainerCommand]),
	rule((*stageCompiler).onbuild),
	rule((*stageCompiler).shell),
)

// rules makes a table of rules by type.
func rules(rs ...typedRule) map[reflect.Type]instructionRule {
	m := make(map[reflect.Type]instructionRule, len(rs))
	for _, r := range rs {
		m[r.typ] = r.compile
	}
	return m
}

func (sc *stageCompiler) env(x *instructions.EnvCommand) error {
	for _, kv := range x.Env {
		if err := checkEnv(kv.Key, kv.Value); err != nil {
			return sc.c.refuse(x, "ENV %v", err)
		}
		sc.st.env[kv.Key] = kv.Value
	}
	return nil
}

func (sc *stageCompiler) label(x *instructions.LabelCommand) error {
	for _, kv := range x.Labels {
		sc.st.labels[kv.Key] = kv.Value
	}
	return nil
}

// arg takes a build argument's value from the build, else its default,
// else the global ARG of that name.
func (sc *stageCompiler) arg(x *instructions.ArgCommand) error {
	for _, kv := range x.Args {
		v, given := sc.c.buildArgs[kv.Key]
		if !given {
			if kv.Value != nil {
				v = *kv.Value
			} else {
				v = sc.c.meta[kv.Key]
			}
		}
		if err := checkEnv(kv.Key, v); err != nil {
			return sc.c.refuse(x, "ARG %v", err)
		}
		sc.args[kv.Key] = v
	}
	return nil
}

func (sc *stageCompiler) workdir(x *instructions.WorkdirCommand) error {
	p := x.Path
	if !path.IsAbs(p) {
		p = path.Join(orRoot(sc.st.workdir), p)
	}
	p = path.Clean(p)
	sc.st.workdir = p
	if p != "/" {
		sc.st.steps = append(sc.st.steps, &step{text: "WORKDIR " + p, line: lineOfNode(x), mkdir: p})
	}
	return nil
}

func (sc *stageCompiler) user(x *instructions.UserCommand) error {
	if x.User == "" || strings.ContainsAny(x.User, " \t\n\x00") || len(x.User) > 64 {
		return sc.c.refuse(x, "USER %.64q is not a user name", x.User)
	}
	sc.st.user = x.User
	return nil
}

func (sc *stageCompiler) run(x *instructions.RunCommand) error {
	if len(x.FlagsUsed) > 0 {
		return sc.c.refuse(x, "RUN --%s is not supported", x.FlagsUsed[0])
	}
	if len(x.Files) > 0 {
		return sc.c.refuse(x, "RUN with a heredoc is not supported")
	}
	argv := x.CmdLine
	text := "RUN " + strings.Join(x.CmdLine, " ")
	if x.PrependShell {
		argv = []string{"/bin/sh", "-c", strings.Join(x.CmdLine, " ")}
	} else {
		text = "RUN " + shellJoin(x.CmdLine)
	}
	if len(argv) == 0 {
		return sc.c.refuse(x, "RUN of nothing")
	}
	st := sc.st
	st.steps = append(st.steps, &step{text: text, line: lineOfNode(x),
		run: &runSpec{argv: argv, env: sc.vars(), cwd: orRoot(st.workdir), user: st.user}})
	return nil
}

func (sc *stageCompiler) copy(x *instructions.CopyCommand) error {
	s, err := sc.c.copyStep(x, "COPY", &x.SourcesAndDest, x.From, x.Chown, x.Chmod, sc.st)
	if err != nil {
		return err
	}
	if len(x.ExcludePatterns) > 0 {
		return sc.c.refuse(x, "COPY --exclude is not supported")
	}
	if x.Parents {
		return sc.c.refuse(x, "COPY --parents is not supported")
	}
	sc.st.steps = append(sc.st.steps, s)
	return nil
}

// addArchiveExts are the names Docker's ADD would unpack.
var addArchiveExts = []string{".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar.zst"}

// add is COPY from the context only: ADD's downloads and unpacking are
// refused.
func (sc *stageCompiler) add(x *instructions.AddCommand) error {
	if len(x.ExcludePatterns) > 0 || x.Checksum != "" || x.KeepGitDir != nil || x.Unpack != nil {
		return sc.c.refuse(x, "ADD with --exclude, --checksum, --keep-git-dir or --unpack is not supported")
	}
	for _, src := range x.SourcePaths {
		if strings.Contains(src, "://") || strings.HasPrefix(src, "git@") {
			return sc.c.refuse(x, "ADD %s: ADD of a URL is not supported; download it with RUN curl", src)
		}
		for _, ext := range addArchiveExts {
			if strings.HasSuffix(strings.ToLower(src), ext) {
				return sc.c.refuse(x, "ADD %s: ADD of an archive (unpacked by Docker) is not supported; COPY it and unpack it with RUN tar", src)
			}
		}
	}
	s, err := sc.c.copyStep(x, "ADD", &x.SourcesAndDest, "", x.Chown, x.Chmod, sc.st)
	if err != nil {
		return err
	}
	sc.st.steps = append(sc.st.steps, s)
	return nil
}

func (sc *stageCompiler) cmdLine(x *instructions.CmdCommand) error {
	sc.cmd = &x.ShellDependantCmdLine
	return nil
}

func (sc *stageCompiler) entrypointLine(x *instructions.EntrypointCommand) error {
	sc.entrypoint = &x.ShellDependantCmdLine
	return nil
}

func (sc *stageCompiler) healthcheck(x *instructions.HealthCheckCommand) error {
	sc.health = nil
	if x.Health != nil {
		sc.health = x.Health.Test
	}
	return nil
}

// ignore passes over an instruction that changes nothing here, with a
// notice in the build log.
func ignore[T instructions.Command](sc *stageCompiler, x T) error {
	sc.c.notices = append(sc.c.notices, fmt.Sprintf("Dockerfile line %d: %s ignored", lineOfNode(x), strings.ToUpper(x.Name())))
	return nil
}

func (sc *stageCompiler) onbuild(x *instructions.OnbuildCommand) error {
	return sc.c.refuse(x, "ONBUILD is not supported")
}

func (sc *stageCompiler) shell(x *instructions.ShellCommand) error {
	return sc.c.refuse(x, "SHELL is not supported: steps run with /bin/sh -c")
}

// fromNode locates a stage's FROM.
type fromNode struct{ s *instructions.Stage }

func (f *fromNode) Location() []parser.Range { return f.s.Location }

// startCommand is the shell command ENTRYPOINT and CMD make, as Docker
// composes them: a shell-form ENTRYPOINT ignores CMD.
func startCommand(entrypoint, cmd *instructions.ShellDependantCmdLine) string {
	form := func(c *instructions.ShellDependantCmdLine) string {
		if c.PrependShell {
			return strings.Join(c.CmdLine, " ")
		}
		return shellJoin(c.CmdLine)
	}
	switch {
	case entrypoint != nil && len(entrypoint.CmdLine) > 0:
		if entrypoint.PrependShell || cmd == nil || len(cmd.CmdLine) == 0 {
			return form(entrypoint)
		}
		if cmd.PrependShell {
			return form(entrypoint) + " " + shellJoin([]string{"/bin/sh", "-c", strings.Join(cmd.CmdLine, " ")})
		}
		return form(entrypoint) + " " + form(cmd)
	case cmd != nil && len(cmd.CmdLine) > 0:
		return form(cmd)
	}
	return ""
}

// copyStep compiles a COPY or ADD of local sources.
func (c *dfCompiler) copyStep(dc instructions.Command, name string, sd *instructions.SourcesAndDest, from, chown, chmod string, st *stage) (*step, error) {
	if len(sd.SourceContents) > 0 {
		return nil, c.refuse(dc, "%s with a heredoc is not supported", name)
	}
	if len(sd.SourcePaths) == 0 || sd.DestPath == "" {
		return nil, c.refuse(dc, "%s needs a source and a destination", name)
	}
	spec := &copySpec{fromStage: -1, srcs: sd.SourcePaths, chown: chown}
	dest := sd.DestPath
	if !path.IsAbs(dest) {
		dest = path.Join(orRoot(st.workdir), dest)
	}
	spec.dest = path.Clean(dest)
	if strings.HasSuffix(sd.DestPath, "/") || sd.DestPath == "." {
		spec.dest += "/"
	}
	if chmod != "" {
		m, err := strconv.ParseUint(chmod, 8, 32)
		if err != nil || m > 0o7777 {
			return nil, c.refuse(dc, "%s --chmod=%s: only octal modes are supported", name, chmod)
		}
		spec.chmod = uint32(m)
	}
	if chown != "" && (strings.ContainsAny(chown, " \t\n\x00") || len(chown) > 130) {
		return nil, c.refuse(dc, "%s --chown=%.64q is not user[:group]", name, chown)
	}
	if from != "" {
		j, err := c.copySource(dc, from, sd.SourcePaths)
		if err != nil {
			return nil, err
		}
		spec.fromStage = j
	}
	text := name
	if from != "" {
		text += " --from=" + from
	}
	if chown != "" {
		text += " --chown=" + chown
	}
	if chmod != "" {
		text += " --chmod=" + chmod
	}
	text += " " + strings.Join(sd.SourcePaths, " ") + " " + sd.DestPath
	return &step{text: text, line: lineOfNode(dc), copy: spec}, nil
}

// copySource is the earlier stage COPY --from names, by name or number.
// Its sources are plain paths: wildcards are matched in the context only.
func (c *dfCompiler) copySource(dc instructions.Command, from string, srcs []string) (int, error) {
	j, ok := c.byName[strings.ToLower(from)]
	if !ok {
		if n, err := strconv.Atoi(from); err == nil && n >= 0 && n < len(c.stages) {
			j, ok = n, true
		}
	}
	if !ok {
		return 0, c.refuse(dc, "COPY --from=%s: no earlier stage of that name (copying from an image is not supported)", from)
	}
	for _, s := range srcs {
		if strings.ContainsAny(s, "*?[") {
			return 0, c.refuse(dc, "COPY --from=%s %s: wildcards are supported only from the context", from, s)
		}
	}
	return j, nil
}

// envGetter is a shell.EnvGetter over a map.
type envGetter map[string]string

func (e envGetter) Get(k string) (string, bool) { v, ok := e[k]; return v, ok }
func (e envGetter) Keys() []string              { return slices.Sorted(maps.Keys(e)) }
