package agent

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"

	"github.com/emberbox/emberbox/internal/agentproto"
)

// A handler serves one call. An error it returns is sent as the call's final
// Reply; streaming handlers send their own errors as events. Handlers are
// functions of an Agent rather than its methods, so the tables do not
// widen the Agent's method set.
type handler func(a *Agent, ctx context.Context, c *agentproto.Conn, req *agentproto.Request) error

// methods routes a call by its exact method name. It is consulted before
// methodFamilies, so an exact name (process.list) wins over its family.
var methods = map[string]handler{
	agentproto.MethodInfo:         callInfo,
	agentproto.MethodConfigure:    callConfigure,
	agentproto.MethodDetach:       callDetach,
	agentproto.MethodVolumeAttach: callVolumeAttach,
	agentproto.MethodVolumeFreeze: callVolumeFreeze,
	agentproto.MethodVolumeThaw:   callVolumeFreeze,
	agentproto.MethodVolumeSync:   callVolumeSync,
	agentproto.MethodVolumeDetach: callVolumeDetach,
	agentproto.MethodRenew:        callRenew,
	agentproto.MethodSecretEnv:    callSecretEnv,
	agentproto.MethodTrust:        callTrust,
	agentproto.MethodExec:         callExec,
	agentproto.MethodSpawn:        callSpawn,
	agentproto.MethodProcessList:  callProcessList,
}

// methodFamilies routes the calls that share a body and its checks, by
// method name prefix. Order matters: the first prefix that matches wins, so
// file.watch. comes before file.
var methodFamilies = []struct {
	prefix string
	serve  handler
}{
	{"process.", (*Agent).dispatchProcess},
	{"file.watch.", (*Agent).dispatchWatch},
	{"file.", (*Agent).dispatchFile},
}

// dispatch runs req. An error it returns is sent as the call's final Reply;
// streaming handlers send their own errors as events.
func (a *Agent) dispatch(ctx context.Context, c *agentproto.Conn, req *agentproto.Request) error {
	if h, ok := methods[req.Method]; ok {
		return h(a, ctx, c, req)
	}
	for _, f := range methodFamilies {
		if strings.HasPrefix(req.Method, f.prefix) {
			return f.serve(a, ctx, c, req)
		}
	}
	return unknownMethod(req.Method)
}

// unknownMethod is the answer to a method the agent does not serve; an
// older agent gives the same, so hosts test for CodeUnknownMethod.
func unknownMethod(method string) error {
	return &agentproto.Error{Code: agentproto.CodeUnknownMethod, Message: fmt.Sprintf("unknown method %q", method)}
}

// writeOK answers a call that has nothing to return.
func writeOK(c *agentproto.Conn) error { return c.WriteJSON(agentproto.Reply{OK: true}) }

func callInfo(a *Agent, _ context.Context, c *agentproto.Conn, _ *agentproto.Request) error {
	return c.WriteJSON(agentproto.Reply{Info: a.info()})
}

func callConfigure(a *Agent, _ context.Context, c *agentproto.Conn, req *agentproto.Request) error {
	if req.Configure == nil {
		return invalid("configure: missing body")
	}
	if err := a.installCACerts(req.Configure.CACerts); err != nil {
		a.log.Warn("installing CA certificates", "err", err)
	}
	a.mu.Lock()
	a.env = req.Configure.Env
	a.caSet = a.caSet || req.Configure.CACerts != ""
	a.mu.Unlock()
	if h := req.Configure.Hostname; h != "" {
		if err := unix.Sethostname([]byte(h)); err != nil {
			a.log.Warn("sethostname", "err", err)
		}
	}
	return writeOK(c)
}

func callSecretEnv(a *Agent, _ context.Context, c *agentproto.Conn, req *agentproto.Request) error {
	if req.SecretEnv == nil {
		return invalid("secrets.env: missing body")
	}
	env := req.SecretEnv.Env
	if len(env) > agentproto.MaxSecretEnv {
		return invalid("secrets.env: too many variables")
	}
	for k, v := range env {
		if k == "" || len(k) > agentproto.MaxSecretEnvBytes || len(v) > agentproto.MaxSecretEnvBytes ||
			strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return invalid("secrets.env: a malformed variable")
		}
	}
	a.mu.Lock()
	a.secretEnv = env
	a.mu.Unlock()
	return writeOK(c)
}

func callTrust(a *Agent, _ context.Context, c *agentproto.Conn, req *agentproto.Request) error {
	if req.Trust == nil {
		return invalid("trust.set: missing body")
	}
	bundle := req.Trust.CACerts
	if len(bundle) > agentproto.MaxTrustBytes {
		return invalid("trust.set: the bundle is too large")
	}
	if err := checkCertBundle(bundle); err != nil {
		return invalid("trust.set: " + err.Error())
	}
	if err := replaceCACerts(bundle); err != nil {
		return fmt.Errorf("trust.set: %w", err)
	}
	a.mu.Lock()
	a.caSet = bundle != ""
	a.mu.Unlock()
	return writeOK(c)
}

// checkCertBundle accepts PEM CERTIFICATE blocks that parse, and nothing
// else but whitespace.
func checkCertBundle(bundle string) error {
	rest := []byte(bundle)
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			return fmt.Errorf("a %q block in the bundle", b.Type)
		}
		if _, err := x509.ParseCertificate(b.Bytes); err != nil {
			return fmt.Errorf("a certificate in the bundle: %w", err)
		}
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return errors.New("the bundle holds something other than PEM certificates")
	}
	return nil
}

func callDetach(a *Agent, ctx context.Context, c *agentproto.Conn, _ *agentproto.Request) error {
	if err := writeOK(c); err != nil {
		return err
	}
	// The answer is written to the port; ending the session sends
	// the agent back to waiting for a Hello.
	if sess, ok := ctx.Value(sessionKey{}).(*yamux.Session); ok {
		_ = sess.Close()
	}
	return nil
}

func callVolumeAttach(a *Agent, _ context.Context, c *agentproto.Conn, req *agentproto.Request) error {
	if err := a.volumeAttach(req.Volume); err != nil {
		return err
	}
	return writeOK(c)
}

// callVolumeFreeze serves both volume.freeze and volume.thaw.
func callVolumeFreeze(a *Agent, _ context.Context, c *agentproto.Conn, req *agentproto.Request) error {
	if err := a.volumeFreeze(req.Volume, req.Method == agentproto.MethodVolumeFreeze); err != nil {
		return err
	}
	return writeOK(c)
}

func callVolumeSync(a *Agent, _ context.Context, c *agentproto.Conn, _ *agentproto.Request) error {
	a.volumeSyncAll()
	return writeOK(c)
}

func callVolumeDetach(a *Agent, _ context.Context, c *agentproto.Conn, req *agentproto.Request) error {
	if err := a.volumeDetach(req.Volume); err != nil {
		return err
	}
	return writeOK(c)
}

func callRenew(a *Agent, _ context.Context, c *agentproto.Conn, req *agentproto.Request) error {
	if req.Renew == nil {
		return invalid("renew: missing body")
	}
	if err := a.renew(req.Renew); err != nil {
		return err
	}
	return writeOK(c)
}

func callExec(a *Agent, ctx context.Context, c *agentproto.Conn, req *agentproto.Request) error {
	if req.Exec == nil {
		return invalid("exec: missing body")
	}
	if req.Exec.StdinPipe || req.Exec.Pty != nil {
		return invalid("exec: stdinPipe and pty are for spawn")
	}
	return a.exec(ctx, c, req.Exec)
}

func callSpawn(a *Agent, _ context.Context, c *agentproto.Conn, req *agentproto.Request) error {
	if req.Exec == nil {
		return invalid("spawn: missing body")
	}
	p, err := a.start(req.Exec, nil, nil)
	if err != nil {
		return err
	}
	return writeProcess(c, p)
}

func callProcessList(a *Agent, _ context.Context, c *agentproto.Conn, _ *agentproto.Request) error {
	return c.WriteJSON(agentproto.Reply{Processes: a.procs.list()})
}

// A processHandler serves a process.* call on the process it names.
type processHandler func(ctx context.Context, c *agentproto.Conn, p *process, pr *agentproto.ProcessRequest) error

var processMethods = map[string]processHandler{
	agentproto.MethodProcessGet:    processGet,
	agentproto.MethodProcessSignal: processSignal,
	agentproto.MethodProcessWrite:  processWrite,
	agentproto.MethodProcessResize: processResize,
	agentproto.MethodProcessOutput: processOutput,
}

// dispatchProcess checks what every process call needs (a body naming a
// live process) before it looks the method up: an unknown process.* method
// with a bad body answers with the body's fault.
func (a *Agent) dispatchProcess(ctx context.Context, c *agentproto.Conn, req *agentproto.Request) error {
	pr := req.Process
	if pr == nil {
		return invalid(req.Method + ": missing body")
	}
	p, err := a.procs.get(pr.ID)
	if err != nil {
		return err
	}
	h, ok := processMethods[req.Method]
	if !ok {
		return unknownMethod(req.Method)
	}
	return h(ctx, c, p, pr)
}

// writeProcess answers with p's current state.
func writeProcess(c *agentproto.Conn, p *process) error {
	info := p.info()
	return c.WriteJSON(agentproto.Reply{Process: &info})
}

func processGet(_ context.Context, c *agentproto.Conn, p *process, _ *agentproto.ProcessRequest) error {
	return writeProcess(c, p)
}

func processSignal(_ context.Context, c *agentproto.Conn, p *process, pr *agentproto.ProcessRequest) error {
	sig, err := parseSignal(pr.Signal)
	if err != nil {
		return err
	}
	if err := p.signal(sig); err != nil {
		return err
	}
	return writeProcess(c, p)
}

func processWrite(_ context.Context, c *agentproto.Conn, p *process, pr *agentproto.ProcessRequest) error {
	if err := p.write(pr); err != nil {
		return err
	}
	return writeProcess(c, p)
}

func processResize(_ context.Context, c *agentproto.Conn, p *process, pr *agentproto.ProcessRequest) error {
	if pr.Size == nil {
		return invalid("process.resize: missing size")
	}
	if err := p.resize(pr.Size); err != nil {
		return err
	}
	return writeProcess(c, p)
}

func processOutput(ctx context.Context, c *agentproto.Conn, p *process, pr *agentproto.ProcessRequest) error {
	wait := time.Duration(min(max(pr.WaitMs, 0), 60_000)) * time.Millisecond
	err := p.output(ctx, pr.Cursor, pr.Follow, wait, func(ev agentproto.Event) error { return c.WriteJSON(ev) })
	if err != nil && ctx.Err() == nil {
		_ = c.WriteJSON(agentproto.Event{Type: "error", Error: internal(err)})
	}
	return nil
}

// A fileCall is a file.* call whose account and path passed the checks
// every file method shares.
type fileCall struct {
	c      *agentproto.Conn
	method string
	fr     *agentproto.FileRequest
	acct   *account
	path   string // fr.Path resolved against the account's home
}

// A fileHandler serves one file.* method.
type fileHandler func(a *Agent, fc fileCall) error

var fileMethods = map[string]fileHandler{
	agentproto.MethodFileStat:      fileStat,
	agentproto.MethodFileList:      fileList,
	agentproto.MethodFileGlob:      fileGlob,
	agentproto.MethodFileRename:    fileRename,
	agentproto.MethodFileArchive:   fileArchive,
	agentproto.MethodFileUnarchive: fileUnarchive,
	agentproto.MethodFileMkdir:     fileMkdir,
	agentproto.MethodFileChmod:     fileChmod,
	agentproto.MethodFileRemove:    fileRemove,
	agentproto.MethodFileWrite:     fileWrite,
	agentproto.MethodFileRead:      fileRead,
}

// dispatchFile checks the account and path every file call names before it
// looks the method up, so an unknown file.* method answers with their
// faults first. A refused call that carries data drains it first.
func (a *Agent) dispatchFile(_ context.Context, c *agentproto.Conn, req *agentproto.Request) error {
	fr := req.File
	if fr == nil {
		return invalid(req.Method + ": missing body")
	}
	acct, err := a.account(fr.User)
	if err != nil {
		if sendsData(req.Method) {
			return drainThen(dataReader(c), fr.Size, err)
		}
		return err
	}
	if err := checkPath(fr.Path); err != nil {
		if sendsData(req.Method) {
			return drainThen(dataReader(c), fr.Size, err)
		}
		return err
	}
	h, ok := fileMethods[req.Method]
	if !ok {
		return unknownMethod(req.Method)
	}
	return h(a, fileCall{c: c, method: req.Method, fr: fr, acct: acct, path: resolvePath(acct.home, fr.Path)})
}

// writeEntries answers with es, as an empty list rather than null.
func writeEntries(c *agentproto.Conn, es []agentproto.FileEntry) error {
	if es == nil {
		es = []agentproto.FileEntry{}
	}
	return c.WriteJSON(agentproto.Reply{Entries: es})
}

func fileStat(a *Agent, fc fileCall) error {
	e, err := a.stat(fc.acct, fc.path)
	if err != nil {
		return err
	}
	return fc.c.WriteJSON(agentproto.Reply{Entry: e})
}

func fileList(a *Agent, fc fileCall) error {
	es, err := a.list(fc.acct, fc.path, fc.fr.Depth, fc.fr.Hidden, fc.fr.Limit)
	if err != nil {
		return err
	}
	return writeEntries(fc.c, es)
}

func fileGlob(a *Agent, fc fileCall) error {
	es, err := a.glob(fc.acct, fc.path, fc.fr.Glob, fc.fr.Hidden, fc.fr.Limit)
	if err != nil {
		return err
	}
	return writeEntries(fc.c, es)
}

func fileRename(a *Agent, fc fileCall) error {
	fr := fc.fr
	if fr.Path == "" || fr.Target == "" {
		return invalid(fc.method + ": path and target are required")
	}
	if err := checkPath(fr.Target); err != nil {
		return err
	}
	e, err := a.rename(fc.acct, fc.path, resolvePath(fc.acct.home, fr.Target), fr.Overwrite)
	if err != nil {
		return err
	}
	return fc.c.WriteJSON(agentproto.Reply{Entry: e})
}

func fileArchive(a *Agent, fc fileCall) error {
	return a.archive(fc.c, fc.acct, fc.path, fc.fr.Gzip, fc.fr.Exclude)
}

func fileUnarchive(a *Agent, fc fileCall) error {
	if fc.fr.Size < 0 {
		return invalid("negative size")
	}
	u, err := a.unarchive(fc.acct, fc.path, fc.fr.Size, dataReader(fc.c))
	if err != nil {
		return err
	}
	return fc.c.WriteJSON(agentproto.Reply{Unpacked: u})
}

func fileMkdir(a *Agent, fc fileCall) error {
	e, err := a.mkdir(fc.acct, fc.path, fc.fr.Mode, fc.fr.Parents)
	if err != nil {
		return err
	}
	return fc.c.WriteJSON(agentproto.Reply{Entry: e})
}

func fileChmod(a *Agent, fc fileCall) error {
	if fc.fr.Path == "" { // not the home by omission
		return invalid(fc.method + ": path is required")
	}
	e, err := a.chmod(fc.acct, fc.path, fc.fr.Mode)
	if err != nil {
		return err
	}
	return fc.c.WriteJSON(agentproto.Reply{Entry: e})
}

func fileRemove(a *Agent, fc fileCall) error {
	removed, err := a.remove(fc.acct, fc.path, fc.fr.Recursive)
	if err != nil {
		return err
	}
	return fc.c.WriteJSON(agentproto.Reply{Removed: &removed})
}

func fileWrite(a *Agent, fc fileCall) error {
	if fc.fr.Size < 0 {
		return invalid("negative size")
	}
	e, err := a.writeFile(fc.acct, fc.path, fc.fr.Mode, fc.fr.Size, dataReader(fc.c))
	if err != nil {
		return err
	}
	return fc.c.WriteJSON(agentproto.Reply{Entry: e})
}

// fileRead answers with the entry, then the file's bytes as data frames,
// then OK. Once the entry is sent a failed write means the host is gone:
// there is no one to tell.
func fileRead(a *Agent, fc fileCall) error {
	f, e, err := a.openRead(fc.acct, fc.path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := fc.c.WriteJSON(agentproto.Reply{Entry: e}); err != nil {
		return nil
	}
	buf := make([]byte, agentproto.DataChunk)
	for {
		n, rerr := f.Read(buf)
		if n > 0 {
			if err := fc.c.WriteFrame(agentproto.KindData, buf[:n]); err != nil {
				return nil
			}
		}
		if rerr == io.EOF {
			return writeOK(fc.c)
		}
		if rerr != nil {
			return fileError(fc.path, rerr)
		}
	}
}
