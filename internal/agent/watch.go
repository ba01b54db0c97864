package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/emberbox/emberbox/internal/agentproto"
)

// File watches: inotify (fsnotify) on a directory, and with recursive on
// every directory below it, new ones included. Each watch keeps at most
// MaxWatchEvents events, numbered from 0; a reader asks from a cursor and
// is told when events it had not read were dropped. A watch ends when
// stopped, at its timeout, or when its directory goes; an ended watch is
// kept (without inotify) for endedKeep so its last events can be read.

// endedKeep is how long an ended watch stays readable.
const endedKeep = 10 * time.Minute

// Watch states.
const (
	watchRunning = "running"
	watchEnded   = "ended"
)

type watchSet struct {
	mu   sync.Mutex
	byID map[string]*watch
	now  func() time.Time
}

func newWatchSet() *watchSet {
	return &watchSet{byID: map[string]*watch{}, now: time.Now}
}

type watch struct {
	id, root  string
	recursive bool
	types     []string // nil: all
	include   []string
	exclude   []string
	maxDirs   int
	created   time.Time
	expires   time.Time // zero: none
	fsw       *fsnotify.Watcher
	stopTimer func() bool

	mu      sync.Mutex
	changed chan struct{} // closed and replaced when events arrive or the watch ends
	events  []agentproto.WatchEvent
	first   int64 // number of events[0]
	lost    int64 // dropped by the kernel's queue overflowing, not yet reported
	notices []agentproto.WatchNotice
	dirs    map[string]bool
	ended   time.Time
	reason  string
}

func newWatchID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "wat_" + hex.EncodeToString(b[:])
}

var watchTypes = []string{agentproto.WatchCreate, agentproto.WatchModify, agentproto.WatchDelete,
	agentproto.WatchRename, agentproto.WatchChmod}

func checkWatchRequest(req *agentproto.WatchRequest) error {
	if err := checkPath(req.Path); err != nil {
		return err
	}
	if len(req.ID) > 64 || strings.ContainsAny(req.ID, "/\x00") {
		return invalid("watch id: at most 64 bytes, no slash")
	}
	for _, t := range req.Events {
		if !slices.Contains(watchTypes, t) {
			return invalid(fmt.Sprintf("event type %q: want one of %s", t, strings.Join(watchTypes, ", ")))
		}
	}
	if len(req.Include) > agentproto.MaxWatchPatterns || len(req.Exclude) > agentproto.MaxWatchPatterns {
		return invalid(fmt.Sprintf("at most %d include and %d exclude patterns", agentproto.MaxWatchPatterns, agentproto.MaxWatchPatterns))
	}
	for _, p := range append(slices.Clone(req.Include), req.Exclude...) {
		if _, err := path.Match(p, ""); err != nil || len(p) > agentproto.MaxGlobLen {
			return invalid(fmt.Sprintf("pattern %q is not valid", p))
		}
	}
	if t := req.TimeoutMs; t != nil && (*t < 0 || *t > agentproto.MaxWatchTimeout) {
		return invalid(fmt.Sprintf("timeoutMs: 0 to %d", int64(agentproto.MaxWatchTimeout)))
	}
	if req.MaxDirs < 0 || req.MaxDirs > agentproto.MaxWatchDirs {
		return invalid(fmt.Sprintf("maxDirs: 0 to %d", agentproto.MaxWatchDirs))
	}
	return nil
}

// start begins a watch of dir (resolved) as req asks.
func (ws *watchSet) start(dir string, req *agentproto.WatchRequest) (*agentproto.WatchInfo, error) {
	if err := checkWatchRequest(req); err != nil {
		return nil, err
	}
	st, err := os.Stat(dir)
	if err != nil {
		return nil, fileError(dir, err)
	}
	if !st.IsDir() {
		return nil, &agentproto.Error{Code: agentproto.CodeNotADirectory, Message: dir + " is not a directory"}
	}
	ws.mu.Lock()
	ws.sweepLocked()
	if req.ID != "" {
		if w := ws.byID[req.ID]; w != nil && w.running() {
			ws.mu.Unlock()
			return w.info(), nil
		}
	}
	running := 0
	for _, w := range ws.byID {
		if w.running() {
			running++
		}
	}
	if running >= agentproto.MaxWatches {
		ws.mu.Unlock()
		return nil, &agentproto.Error{Code: agentproto.CodeTooLarge,
			Message: fmt.Sprintf("%d watches are running, the most one sandbox may have; stop one first", agentproto.MaxWatches)}
	}
	id := req.ID
	if id == "" {
		id = newWatchID()
	}
	now := ws.now()
	w := &watch{id: id, root: dir, recursive: req.Recursive, types: req.Events, include: req.Include, exclude: req.Exclude,
		maxDirs: req.MaxDirs, created: now, changed: make(chan struct{}), dirs: map[string]bool{}}
	if w.maxDirs == 0 {
		w.maxDirs = agentproto.MaxWatchDirs
	}
	timeout := int64(agentproto.DefaultWatchTimeout)
	if req.TimeoutMs != nil {
		timeout = *req.TimeoutMs
	}
	ws.byID[id] = w // reserve the slot; fsnotify setup below
	ws.mu.Unlock()

	fsw, err := fsnotify.NewWatcher()
	if err != nil {
		ws.drop(id, w)
		return nil, internal(fmt.Errorf("inotify: %w", err))
	}
	w.fsw = fsw
	if err := w.add(dir, false); err != nil {
		_ = fsw.Close()
		ws.drop(id, w)
		return nil, fileError(dir, err)
	}
	if timeout > 0 {
		w.expires = now.Add(time.Duration(timeout) * time.Millisecond)
		t := time.AfterFunc(time.Duration(timeout)*time.Millisecond, func() { w.end("timeout") })
		w.stopTimer = t.Stop
	}
	go w.run()
	return w.info(), nil
}

func (ws *watchSet) drop(id string, w *watch) {
	ws.mu.Lock()
	if ws.byID[id] == w {
		delete(ws.byID, id)
	}
	ws.mu.Unlock()
}

// sweepLocked forgets watches ended more than endedKeep ago.
func (ws *watchSet) sweepLocked() {
	now := ws.now()
	for id, w := range ws.byID {
		w.mu.Lock()
		old := !w.ended.IsZero() && now.Sub(w.ended) > endedKeep
		w.mu.Unlock()
		if old {
			delete(ws.byID, id)
		}
	}
}

func (ws *watchSet) get(id string) (*watch, error) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.sweepLocked()
	w := ws.byID[id]
	if w == nil {
		return nil, &agentproto.Error{Code: agentproto.CodeWatchNotFound, Message: "no watch " + id}
	}
	return w, nil
}

func (ws *watchSet) list() []agentproto.WatchInfo {
	ws.mu.Lock()
	ws.sweepLocked()
	out := make([]agentproto.WatchInfo, 0, len(ws.byID))
	for _, w := range ws.byID {
		out = append(out, *w.info())
	}
	ws.mu.Unlock()
	slices.SortFunc(out, func(a, b agentproto.WatchInfo) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return out
}

// stop ends a watch and forgets it.
func (ws *watchSet) stop(id string) (bool, error) {
	w, err := ws.get(id)
	if err != nil {
		return false, err
	}
	w.end("stopped")
	ws.drop(id, w)
	return true, nil
}

// stopAll ends every watch (the agent is going away).
func (ws *watchSet) stopAll() {
	ws.mu.Lock()
	all := ws.byID
	ws.byID = map[string]*watch{}
	ws.mu.Unlock()
	for _, w := range all {
		w.end("stopped")
	}
}

func (w *watch) running() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ended.IsZero()
}

func (w *watch) info() *agentproto.WatchInfo {
	w.mu.Lock()
	defer w.mu.Unlock()
	in := &agentproto.WatchInfo{ID: w.id, Path: w.root, Recursive: w.recursive, Events: w.types,
		Cursor: w.first + int64(len(w.events)), Dirs: len(w.dirs), State: watchRunning, Reason: w.reason, CreatedAt: w.created}
	if !w.ended.IsZero() {
		in.State = watchEnded
	}
	if !w.expires.IsZero() {
		e := w.expires
		in.ExpiresAt = &e
	}
	return in
}

// add watches dir and, for a recursive watch, the directories below it.
// With report, what is found below dir is reported as created: it may
// have been made before its directory was watched.
func (w *watch) add(dir string, report bool) error {
	if err := w.addOne(dir); err != nil {
		return err
	}
	w.walk(dir, report)
	return nil
}

// walk watches the directories below dir of a recursive watch.
func (w *watch) walk(dir string, report bool) {
	if !w.recursive {
		return
	}
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return nil // gone or unreadable meanwhile: nothing to watch
		}
		if w.excluded(p) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		// As in handle: a directory is watched before its create is
		// told, so a reader who saw it may rely on changes in it being
		// seen.
		var skip error
		if d.IsDir() {
			if err := w.addOne(p); err != nil {
				skip = filepath.SkipDir
			}
		}
		if report {
			w.emit(agentproto.WatchCreate, p, d.IsDir())
		}
		return skip
	})
}

func (w *watch) addOne(dir string) error {
	w.mu.Lock()
	if w.dirs[dir] || !w.ended.IsZero() {
		w.mu.Unlock()
		return nil
	}
	if len(w.dirs) >= w.maxDirs {
		w.noticeLocked(agentproto.WatchNotice{K: "limit", Path: dir, Count: w.maxDirs})
		w.mu.Unlock()
		return errors.New("directory limit")
	}
	w.dirs[dir] = true
	w.mu.Unlock()
	if err := w.fsw.Add(dir); err != nil {
		w.mu.Lock()
		delete(w.dirs, dir)
		w.mu.Unlock()
		return err
	}
	return nil
}

// run turns inotify events into the watch's events until it ends.
func (w *watch) run() {
	for {
		select {
		case ev, ok := <-w.fsw.Events:
			if !ok {
				return
			}
			w.handle(ev)
		case err, ok := <-w.fsw.Errors:
			if !ok {
				return
			}
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				w.mu.Lock()
				w.noticeLocked(agentproto.WatchNotice{K: "overflow"})
				w.wakeLocked()
				w.mu.Unlock()
			}
		}
	}
}

func (w *watch) handle(ev fsnotify.Event) {
	p := filepath.Clean(ev.Name)
	if p == w.root && (ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename)) {
		w.end("root-removed")
		return
	}
	if w.excluded(p) {
		return
	}
	isDir := false
	if ev.Has(fsnotify.Create) {
		if st, err := os.Lstat(p); err == nil && st.IsDir() {
			isDir = true
		}
	} else {
		w.mu.Lock()
		isDir = w.dirs[p]
		w.mu.Unlock()
	}
	switch {
	case ev.Has(fsnotify.Create):
		// A new directory is watched before its create is told, so a
		// reader who saw it may rely on changes in it being seen.
		if isDir && w.recursive {
			_ = w.addOne(p)
		}
		w.emit(agentproto.WatchCreate, p, isDir)
		if isDir && w.recursive {
			w.walk(p, true) // what was made in it before it was watched
		}
	case ev.Has(fsnotify.Write):
		w.emit(agentproto.WatchModify, p, isDir)
	case ev.Has(fsnotify.Remove):
		w.forget(p)
		w.emit(agentproto.WatchDelete, p, isDir)
	case ev.Has(fsnotify.Rename):
		w.forget(p)
		w.emit(agentproto.WatchRename, p, isDir)
	case ev.Has(fsnotify.Chmod):
		w.emit(agentproto.WatchChmod, p, isDir)
	}
}

// forget drops a directory that went (inotify drops its watch itself).
func (w *watch) forget(p string) {
	w.mu.Lock()
	delete(w.dirs, p)
	w.mu.Unlock()
}

// excluded reports whether p is left out by the exclude patterns (any
// segment of its path relative to the root, or that path, matching).
func (w *watch) excluded(p string) bool {
	rel, err := filepath.Rel(w.root, p)
	if err != nil || rel == "." {
		return false
	}
	for _, pat := range w.exclude {
		if m, _ := path.Match(pat, rel); m {
			return true
		}
		for seg := range strings.SplitSeq(rel, "/") {
			if m, _ := path.Match(pat, seg); m {
				return true
			}
		}
	}
	return false
}

// included reports whether an event of p is kept by the include patterns.
func (w *watch) included(p string) bool {
	if len(w.include) == 0 {
		return true
	}
	rel, _ := filepath.Rel(w.root, p)
	for _, pat := range w.include {
		if m, _ := path.Match(pat, rel); m {
			return true
		}
		if m, _ := path.Match(pat, path.Base(p)); m {
			return true
		}
	}
	return false
}

func (w *watch) emit(typ, p string, isDir bool) {
	if (w.types != nil && !slices.Contains(w.types, typ)) || !w.included(p) {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.ended.IsZero() {
		return
	}
	w.events = append(w.events, agentproto.WatchEvent{Type: typ, Path: p, IsDir: isDir, At: time.Now().UTC()})
	if n := len(w.events); n > agentproto.MaxWatchEvents {
		// Drop a quarter at once, so a storm costs amortized O(1).
		drop := n - agentproto.MaxWatchEvents*3/4
		w.events = slices.Delete(w.events, 0, drop)
		w.first += int64(drop)
	}
	w.wakeLocked()
}

// maxNotices bounds the notices waiting for a reader.
const maxNotices = 16

func (w *watch) noticeLocked(n agentproto.WatchNotice) {
	if len(w.notices) < maxNotices {
		w.notices = append(w.notices, n)
	}
}

func (w *watch) wakeLocked() {
	close(w.changed)
	w.changed = make(chan struct{})
}

// end stops a watch's inotify with reason; its events stay readable.
func (w *watch) end(reason string) {
	w.mu.Lock()
	if !w.ended.IsZero() {
		w.mu.Unlock()
		return
	}
	w.ended, w.reason = time.Now(), reason
	w.wakeLocked()
	w.mu.Unlock()
	if w.stopTimer != nil {
		w.stopTimer()
	}
	if w.fsw != nil {
		_ = w.fsw.Close()
	}
}

// read returns the events from cursor on, waiting up to wait for some.
func (w *watch) read(ctx context.Context, cursor int64, wait time.Duration) *agentproto.WatchBatch {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for {
		w.mu.Lock()
		next := w.first + int64(len(w.events))
		if cursor > next || cursor < 0 {
			cursor = next // a cursor from before a restart, say: from now
		}
		if cursor < next || !w.ended.IsZero() || len(w.notices) > 0 || wait <= 0 {
			b := &agentproto.WatchBatch{NextCursor: cursor, Events: []agentproto.WatchEvent{}}
			if cursor < w.first {
				b.Notices = append(b.Notices, agentproto.WatchNotice{K: "overflow", Lost: w.first - cursor})
				cursor = w.first
			}
			b.Notices = append(b.Notices, w.notices...)
			w.notices = nil
			from := int(cursor - w.first)
			to := min(len(w.events), from+agentproto.MaxWatchBatch)
			b.Events = append(b.Events, w.events[from:to]...)
			b.NextCursor = w.first + int64(to)
			if !w.ended.IsZero() && to == len(w.events) {
				b.Ended, b.Reason = true, w.reason
			}
			w.mu.Unlock()
			return b
		}
		ch := w.changed
		w.mu.Unlock()
		select {
		case <-ch:
		case <-deadline.C:
			wait = 0
		case <-ctx.Done():
			wait = 0
		}
	}
}

// A watchHandler serves one file.watch.* method.
type watchHandler func(a *Agent, ctx context.Context, c *agentproto.Conn, wr *agentproto.WatchRequest) error

var watchMethods = map[string]watchHandler{
	agentproto.MethodFileWatchStart:  watchStart,
	agentproto.MethodFileWatchList:   watchList,
	agentproto.MethodFileWatchEvents: watchEvents,
	agentproto.MethodFileWatchStop:   watchStop,
}

// dispatchWatch serves the file.watch methods. A missing body is refused
// before the method is looked up.
func (a *Agent) dispatchWatch(ctx context.Context, c *agentproto.Conn, req *agentproto.Request) error {
	wr := req.Watch
	if wr == nil {
		return invalid(req.Method + ": missing body")
	}
	h, ok := watchMethods[req.Method]
	if !ok {
		return unknownMethod(req.Method)
	}
	return h(a, ctx, c, wr)
}

func watchStart(a *Agent, _ context.Context, c *agentproto.Conn, wr *agentproto.WatchRequest) error {
	acct, err := a.account(wr.User)
	if err != nil {
		return err
	}
	if err := checkPath(wr.Path); err != nil {
		return err
	}
	in, err := a.watches.start(resolvePath(acct.home, wr.Path), wr)
	if err != nil {
		return err
	}
	return c.WriteJSON(agentproto.Reply{Watch: in})
}

func watchList(a *Agent, _ context.Context, c *agentproto.Conn, _ *agentproto.WatchRequest) error {
	return c.WriteJSON(agentproto.Reply{Watches: a.watches.list()})
}

func watchEvents(a *Agent, ctx context.Context, c *agentproto.Conn, wr *agentproto.WatchRequest) error {
	w, err := a.watches.get(wr.ID)
	if err != nil {
		return err
	}
	wait := time.Duration(min(max(wr.WaitMs, 0), agentproto.MaxWatchWait)) * time.Millisecond
	return c.WriteJSON(agentproto.Reply{Batch: w.read(ctx, wr.Cursor, wait)})
}

func watchStop(a *Agent, _ context.Context, c *agentproto.Conn, wr *agentproto.WatchRequest) error {
	stopped, err := a.watches.stop(wr.ID)
	if err != nil {
		return err
	}
	return c.WriteJSON(agentproto.Reply{Stopped: &stopped})
}
