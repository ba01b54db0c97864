package cluster

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/emberbox/emberbox/internal/sandbox"
)

// Bounds of a move: a paused sandbox is a few files (memory, device
// state, disk overlay and its chain), none larger than a disk may be.
const (
	maxMoveFiles    = 16
	maxMoveFileSize = 128 << 30
)

// Serve answers the node-to-node channel on ln until ctx ends: peers'
// forwarded API requests (served by local, this node's API without the
// cluster's routing, so never routed again)
// and the cluster's own calls under /cluster/v1/. Only peers with a
// certificate of the cluster's CA get through the handshake.
func (c *Cluster) Serve(ctx context.Context, ln net.Listener, local http.Handler) error {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /cluster/v1/sandboxes/{id}/move-in", func(w http.ResponseWriter, r *http.Request) { c.moveIn(w, r, untarFiles) })
	mux.HandleFunc("POST /cluster/v1/sandboxes/{id}/move-in-extents", func(w http.ResponseWriter, r *http.Request) { c.moveIn(w, r, readExtents) })
	mux.HandleFunc("POST /cluster/v1/sandboxes/{id}/checkpoints/{cid}/move-in", c.stageCheckpoint)
	mux.HandleFunc("GET /cluster/v1/snapshots/{id}/files", c.serveSnapshotFiles)
	mux.HandleFunc("GET /cluster/v1/alive", c.serveAlive)
	mux.HandleFunc("GET /cluster/v1/probe/{id}", c.serveProbe)
	mux.Handle("/", fromPeer(local))
	srv := &http.Server{
		Handler:           mux,
		TLSConfig:         c.tls.Server.Clone(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	err := srv.Serve(tls.NewListener(ln, srv.TLSConfig))
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// fromPeer serves a peer's forwarded request as from the client the peer
// names (HeaderClientAddr): the client's address replaces the peer's, so
// the per-address limits behind count the client. Only a request whose
// connection showed a certificate of the cluster's CA may name one (the
// channel refuses any other handshake; this checks again); the header
// goes in any case.
func fromPeer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		named := r.Header.Get(HeaderClientAddr)
		r.Header.Del(HeaderClientAddr)
		if ip, err := netip.ParseAddr(named); err == nil && peerID(r) != "" && ip.Zone() == "" {
			r.RemoteAddr = netip.AddrPortFrom(ip.Unmap(), 0).String()
		}
		next.ServeHTTP(w, r)
	})
}

// remoteIP is the IP address r's connection comes from (invalid if none).
func remoteIP(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// peerID is the node id of the peer that made r (its certificate's name).
func peerID(r *http.Request) string {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return ""
	}
	return r.TLS.PeerCertificates[0].Subject.CommonName
}

// movingFrom loads the sandbox of r's path and checks that it is paused on
// the peer that made r; else it answers r and returns nil.
func (c *Cluster) movingFrom(w http.ResponseWriter, r *http.Request) (*sandbox.Sandbox, Mover) {
	from, id := peerID(r), r.PathValue("id")
	sb, err := c.cfg.Store.GetSandbox(r.Context(), id)
	switch {
	case err != nil:
		http.Error(w, "unknown sandbox", http.StatusNotFound)
		return nil, nil
	case sb.NodeID != from || sb.State != sandbox.StatePaused:
		http.Error(w, fmt.Sprintf("sandbox %s is not paused on node %s", id, from), http.StatusConflict)
		return nil, nil
	}
	mover := c.mover.Load()
	if mover == nil {
		http.Error(w, "this node takes in no sandboxes yet", http.StatusServiceUnavailable)
		return nil, nil
	}
	return sb, *mover
}

// stageCheckpoint takes in the files of a checkpoint of a paused sandbox a
// peer is about to move here (an extents stream); they wait for the
// sandbox's move-in, which names the checkpoints to take.
func (c *Cluster) stageCheckpoint(w http.ResponseWriter, r *http.Request) {
	sb, mover := c.movingFrom(w, r)
	if sb == nil {
		return
	}
	cid := r.PathValue("cid")
	receive := func(ctx context.Context, dir string) error { return readExtents(r.Body, dir) }
	if err := mover.StageCheckpoint(r.Context(), sb.ID, cid, receive); err != nil {
		c.log.Warn("taking in a moving sandbox's checkpoint", "sandbox_id", sb.ID, "checkpoint_id", cid, "err", err)
		http.Error(w, "checkpoint refused: "+err.Error(), http.StatusConflict)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// moveIn takes in a paused sandbox a draining peer hands over: the body
// holds its files, read by read (a tar, or an extents stream), and the
// query names its checkpoints staged here. The store's owner switches
// only once every file is in place, in MoveIn's commit.
func (c *Cluster) moveIn(w http.ResponseWriter, r *http.Request, read func(io.Reader, string) error) {
	sb, mover := c.movingFrom(w, r)
	if sb == nil {
		return
	}
	from, id := peerID(r), sb.ID
	wake := r.URL.Query().Get("wake") == "1"
	in := sandbox.Incoming{Sandbox: sb, Checkpoints: splitIDs(r.URL.Query().Get("checkpoints"), maxMoveCheckpoints)}
	in.Receive = func(ctx context.Context, dir string) error { return read(r.Body, dir) }
	var taken []string
	in.Commit = func(ctx context.Context, checkpoints []string) error {
		if wake {
			// Calls routed here once the owner switches wait for the wake
			// (sandbox_moving), not find it paused.
			mover.BeginMove(id)
		}
		taken = checkpoints
		return c.cfg.Store.MoveSandbox(ctx, id, from, c.ID(), checkpoints)
	}
	if wake {
		defer mover.EndMove(id)
	}
	if err := mover.MoveIn(r.Context(), in); err != nil {
		c.log.Warn("taking in a moved sandbox", "sandbox_id", id, "from", from, "err", err)
		http.Error(w, "move failed: "+err.Error(), http.StatusConflict)
		return
	}
	c.log.Info("took in a paused sandbox", "sandbox_id", id, "from", from, "checkpoints", len(taken))
	w.Header().Set(headerCheckpoints, strings.Join(taken, ","))
	if wake {
		// It ran on the node it left: it runs here from now on. A wake
		// that fails leaves it paused here, for a client's wake.
		if err := mover.WakeMoved(r.Context(), id); err != nil {
			c.log.Warn("waking a sandbox moved while it ran", "sandbox_id", id, "from", from, "err", err)
			w.Header().Set(headerWoken, "false")
		} else {
			w.Header().Set(headerWoken, "true")
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

// maxMoveCheckpoints bounds the checkpoints one move carries: a sandbox
// keeps at most --checkpoints-per-sandbox, plus the bases of those.
const maxMoveCheckpoints = 256

// headerCheckpoints answers a move-in: the checkpoints the new node took.
const headerCheckpoints = "X-Emberbox-Checkpoints"

// splitIDs splits a comma-separated list of at most max ids.
func splitIDs(s string, max int) []string {
	if s == "" {
		return nil
	}
	ids := strings.Split(s, ",")
	if len(ids) > max {
		ids = ids[:max]
	}
	return ids
}

// headerWoken answers a move-in of a running sandbox: whether it runs on
// its new node.
const headerWoken = "X-Emberbox-Woken"

// untarFiles writes the plain files of a move tar into dir, keeping runs
// of zeros as holes (guest memory is mostly holes).
func untarFiles(r io.Reader, dir string) error {
	tr := tar.NewReader(r)
	for n := 0; ; n++ {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading the moved files: %w", err)
		}
		if n >= maxMoveFiles {
			return errors.New("too many files in a move")
		}
		if h.Typeflag != tar.TypeReg || h.Name == "" || h.Name != filepath.Base(h.Name) ||
			strings.HasPrefix(h.Name, ".") || h.Size < 0 || h.Size > maxMoveFileSize {
			return fmt.Errorf("moved file %q refused: want a plain file name and a bounded size", h.Name)
		}
		if err := writeSparse(filepath.Join(dir, h.Name), tr, h.Size); err != nil {
			return fmt.Errorf("writing moved file %s: %w", h.Name, err)
		}
	}
}

func writeSparse(name string, r io.Reader, size int64) error {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := writeRegion(f, r, 0, size, make([]byte, 1<<20)); err != nil {
		return err
	}
	if err := f.Truncate(size); err != nil {
		return err
	}
	return f.Sync()
}

// zeros is what writeRegion compares chunks with.
var zeros = make([]byte, 64<<10)

// writeRegion copies n bytes of r into f at off, leaving chunks of zeros
// unwritten (holes, in a file that has none there yet).
func writeRegion(f *os.File, r io.Reader, off, n int64, buf []byte) error {
	for end := off + n; off < end; {
		k, err := io.ReadFull(r, buf[:min(int64(len(buf)), end-off)])
		if err != nil {
			return err
		}
		for b := buf[:k]; len(b) > 0; {
			chunk := b[:min(len(b), len(zeros))]
			if !bytes.Equal(chunk, zeros[:len(chunk)]) {
				if _, err := f.WriteAt(chunk, off); err != nil {
					return err
				}
			}
			off += int64(len(chunk))
			b = b[len(chunk):]
		}
	}
	return nil
}

// sendFiles moves the sandbox out describes to node n: its checkpoints'
// files first, each staged there, then its own files to n's move-in,
// which takes the sandbox and the checkpoints staged in one commit. Files
// go as their data extents alone, or as a tar to a node from before
// extents (its channel answers the extents route 404), which takes no
// checkpoints; those in early were staged there already (before a running
// sandbox was paused). With wake, n wakes the sandbox once it is in place
// (it ran here), and woken says whether it could. A nil error means the
// move is committed; out.Taken is then the checkpoints n took.
func (c *Cluster) sendFiles(ctx context.Context, n *Node, out *sandbox.Outgoing, wake bool, early []string) (woken bool, err error) {
	id := out.Sandbox.ID
	if len(out.Files) > maxMoveFiles {
		return false, fmt.Errorf("moving %s: %d files", id, len(out.Files))
	}
	var late []sandbox.OutgoingCheckpoint
	for _, cp := range out.Checkpoints {
		if !slices.Contains(early, cp.ID) {
			late = append(late, cp)
		}
	}
	sent := append(slices.Clone(early), c.stageCheckpoints(ctx, n, id, late)...)
	var staged []string // in out's order: each base before those over it
	for _, cp := range out.Checkpoints {
		if slices.Contains(sent, cp.ID) {
			staged = append(staged, cp.ID)
		}
	}
	query := url.Values{}
	if wake {
		query.Set("wake", "1")
	}
	if len(staged) > 0 {
		query.Set("checkpoints", strings.Join(staged, ","))
	}
	resp, err := c.postFiles(ctx, n, "sandboxes/"+id+"/move-in-extents", query, func(w io.Writer) error { return writeExtents(w, out.Files) })
	if err == nil && resp.StatusCode == http.StatusNotFound {
		resp.Body.Close()
		query.Del("checkpoints")
		resp, err = c.postFiles(ctx, n, "sandboxes/"+id+"/move-in", query, func(w io.Writer) error { return writeTar(w, out.Files) })
	}
	if err != nil {
		return false, fmt.Errorf("moving %s to node %s: %w", id, n.ID, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return false, fmt.Errorf("moving %s to node %s: %s: %s", id, n.ID, resp.Status, strings.TrimSpace(string(msg)))
	}
	out.Taken = splitIDs(resp.Header.Get(headerCheckpoints), maxMoveCheckpoints)
	return resp.Header.Get(headerWoken) == "true", nil
}

// stageCheckpoints sends the checkpoints' files of sandbox id to node n,
// each to be staged there, and returns those n staged. One that fails
// stays here (logged); a node that knows no such route takes none.
func (c *Cluster) stageCheckpoints(ctx context.Context, n *Node, id string, cps []sandbox.OutgoingCheckpoint) []string {
	var staged []string
	for _, cp := range cps[:min(len(cps), maxMoveCheckpoints)] {
		if len(cp.Files) > maxMoveFiles {
			continue
		}
		resp, err := c.postFiles(ctx, n, "sandboxes/"+id+"/checkpoints/"+cp.ID+"/move-in", nil,
			func(w io.Writer) error { return writeExtents(w, cp.Files) })
		if err != nil {
			c.log.Warn("moving a sandbox's checkpoint; it stays here", "sandbox_id", id, "checkpoint_id", cp.ID, "to", n.ID, "err", err)
			continue
		}
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusNoContent:
			staged = append(staged, cp.ID)
		case http.StatusNotFound:
			c.log.Warn("the node a sandbox moves to takes no checkpoints (an older version); they stay here",
				"sandbox_id", id, "to", n.ID)
			return nil
		default:
			c.log.Warn("moving a sandbox's checkpoint; it stays here", "sandbox_id", id, "checkpoint_id", cp.ID, "to", n.ID,
				"status", resp.Status, "err", strings.TrimSpace(string(msg)))
		}
	}
	return staged
}

// postFiles posts what write writes to node n's route (under
// /cluster/v1/) with query.
func (c *Cluster) postFiles(ctx context.Context, n *Node, route string, query url.Values, write func(io.Writer) error) (*http.Response, error) {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(write(pw)) }()
	u := peerURL(n) + "/cluster/v1/" + route
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, pr)
	if err != nil {
		pr.Close()
		return nil, err
	}
	resp, err := c.client.Do(req)
	if err != nil {
		pr.CloseWithError(err)
	}
	return resp, err
}

func writeTar(w io.Writer, files map[string]string) error {
	tw := tar.NewWriter(w)
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if err := addFile(tw, name, files[name]); err != nil {
			return err
		}
	}
	return tw.Close()
}

// openRegular opens the file a move sends as name, refusing anything but
// a regular file.
func openRegular(name, path string) (*os.File, os.FileInfo, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	st, err := f.Stat()
	if err == nil && !st.Mode().IsRegular() {
		err = fmt.Errorf("%s is not a regular file", name)
	}
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, st, nil
}

func addFile(tw *tar.Writer, name, path string) error {
	f, st, err := openRegular(name, path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: st.Size(), Typeflag: tar.TypeReg,
		ModTime: st.ModTime()}); err != nil {
		return err
	}
	_, err = io.CopyN(tw, f, st.Size())
	return err
}

// RunDrain moves this node's paused sandboxes to other nodes with mover
// while the node is draining, one at a time, until ctx ends; and takes in
// those other nodes move here. It runs beside Run, so a long move never
// delays a heartbeat.
func (c *Cluster) RunDrain(ctx context.Context, mover Mover) {
	c.mover.Store(&mover)
	t := time.NewTicker(c.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.drainStep(ctx)
	}
}

func (c *Cluster) drainStep(ctx context.Context) {
	self, err := c.cfg.Store.GetNode(ctx, c.ID())
	if err != nil || self.State != StateDraining {
		return
	}
	if c.stopping.Load() {
		c.drainRunning(ctx)
		return
	}
	paused, _, err := c.cfg.Store.ListSandboxes(ctx, sandbox.ListOptions{AllOwners: true, Local: true,
		States: []sandbox.State{sandbox.StatePaused}, Limit: 100})
	if err != nil {
		c.log.Warn("draining: listing paused sandboxes", "err", err)
		return
	}
	for _, sb := range paused {
		if ctx.Err() != nil {
			return
		}
		// It must be able to wake where it goes.
		cands, err := c.cfg.Store.Place(ctx, Placement{MemoryMiB: int64(sb.MemoryMiB), VCPU: sb.VCPU, Alive: c.alive(),
			Exclude: []string{c.ID()}})
		if err != nil || len(cands) == 0 {
			c.log.Warn("draining: no node can take a paused sandbox", "sandbox_id", sb.ID, "err", err)
			continue
		}
		to := cands[0]
		started := time.Now()
		err = (*c.mover.Load()).MoveOut(ctx, sb.ID, func(ctx context.Context, out *sandbox.Outgoing) error {
			_, err := c.sendFiles(ctx, to, out, false, nil)
			return err
		})
		if err != nil {
			c.log.Warn("draining: moving a paused sandbox", "sandbox_id", sb.ID, "to", to.ID, "err", err)
			continue
		}
		c.log.Info("draining: moved a paused sandbox", "sandbox_id", sb.ID, "to", to.ID, "took", time.Since(started))
	}
	c.drainRunning(ctx)
}

// drainRunning moves this node's running sandboxes to other nodes, one at
// a time: each is paused, moved as a paused one is, and woken on its new
// node with its processes, files and lease; its clients see calls answered
// sandbox_moving (retryable) for the pause. A move that fails wakes it
// here again.
func (c *Cluster) drainRunning(ctx context.Context) {
	running, _, err := c.cfg.Store.ListSandboxes(ctx, sandbox.ListOptions{AllOwners: true, Local: true,
		States: []sandbox.State{sandbox.StateRunning}, Limit: 100})
	if err != nil {
		c.log.Warn("draining: listing running sandboxes", "err", err)
		return
	}
	mover := *c.mover.Load()
	for _, sb := range running {
		if ctx.Err() != nil {
			return
		}
		if self, err := c.cfg.Store.GetNode(ctx, c.ID()); err != nil || self.State != StateDraining {
			return // undrained meanwhile
		}
		cands, err := c.cfg.Store.Place(ctx, Placement{MemoryMiB: int64(sb.MemoryMiB), VCPU: sb.VCPU, Alive: c.alive(),
			Exclude: []string{c.ID()}})
		if err != nil || len(cands) == 0 {
			c.log.Warn("draining: no node can take a running sandbox", "sandbox_id", sb.ID, "err", err)
			continue
		}
		to := cands[0]
		// Its checkpoints first, while it runs: the pause is for its own
		// files.
		early := c.stageCheckpoints(ctx, to, sb.ID, mover.OutgoingCheckpoints(ctx, sb.ID))
		started := time.Now()
		if err := mover.PauseForMove(ctx, sb.ID); err != nil {
			c.log.Warn("draining: pausing a running sandbox to move it", "sandbox_id", sb.ID, "err", err)
			continue
		}
		paused := time.Since(started)
		woken := false
		err = mover.MoveOut(ctx, sb.ID, func(ctx context.Context, out *sandbox.Outgoing) (err error) {
			woken, err = c.sendFiles(ctx, to, out, true, early)
			return err
		})
		mover.EndMove(sb.ID)
		switch {
		case err == nil && !woken:
			c.log.Warn("draining: moved a running sandbox, which its new node left paused", "sandbox_id", sb.ID, "to", to.ID)
		case err != nil:
			c.log.Warn("draining: moving a running sandbox; waking it here again", "sandbox_id", sb.ID, "to", to.ID, "err", err)
			if werr := mover.WakeMoved(ctx, sb.ID); werr != nil {
				c.log.Warn("draining: waking a sandbox whose move failed", "sandbox_id", sb.ID, "err", werr)
			}
		default:
			c.log.Info("draining: moved a running sandbox", "sandbox_id", sb.ID, "to", to.ID,
				"pause", paused.Round(time.Millisecond), "unavailable_for", time.Since(started).Round(time.Millisecond))
		}
	}
}
