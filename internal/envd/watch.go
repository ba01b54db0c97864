package envd

import (
	"context"
	"encoding/hex"
	"fmt"
	"path"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/emberbox/emberbox/internal/envd/proto/filesystem"
	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/sandbox"
)

const (
	// watchWait is how long one read of a streamed watch waits for events.
	watchWait = 30 * time.Second
	// watchKeepAlive spaces keep-alive events on a quiet WatchDir stream.
	watchKeepAlive = 50 * time.Second
	// A polled watcher (CreateWatcher) lives until removed, at most a day:
	// a client that forgets it does not hold one of the guest's few
	// watches forever.
	watcherLifetime = guest.MaxWatchTimeoutMs
	stopTimeout     = 10 * time.Second
)

// watcher is what is kept of a polled watcher: its directory, as the
// guest resolved it, and where the next read starts.
type watcher struct {
	root   string
	cursor int64
}

// The guest's change types as envd's.
var eventTypes = map[string]filesystem.EventType{
	"create": filesystem.EventType_EVENT_TYPE_CREATE,
	"modify": filesystem.EventType_EVENT_TYPE_WRITE,
	"delete": filesystem.EventType_EVENT_TYPE_REMOVE,
	"rename": filesystem.EventType_EVENT_TYPE_RENAME,
	"chmod":  filesystem.EventType_EVENT_TYPE_CHMOD,
}

// WatchDir streams a directory's changes until the client goes or the
// request's deadline passes; the guest's watch ends with it.
func (f *filesystemService) WatchDir(ctx context.Context, req *connect.Request[filesystem.WatchDirRequest], stream *connect.ServerStream[filesystem.WatchDirResponse]) error {
	ctx, rt, p, err := pathTarget(ctx, req.Header(), req.Msg.GetPath())
	if err != nil {
		return err
	}
	lifetime := int64(0) // until stopped, below
	if dl, ok := ctx.Deadline(); ok {
		lifetime = min(max(1, time.Until(dl).Milliseconds()), guest.MaxWatchTimeoutMs)
	}
	w, err := startWatch(ctx, rt, p, req.Msg.GetRecursive(), lifetime)
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout)
		defer cancel()
		_, _ = rt.Guest.WatchStop(sctx, w.ID)
	}()

	var mu sync.Mutex
	emit := func(r *filesystem.WatchDirResponse) error {
		mu.Lock()
		defer mu.Unlock()
		return stream.Send(r)
	}
	if err := emit(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Start{Start: &filesystem.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	wg.Go(func() {
		t := time.NewTicker(watchKeepAlive)
		defer t.Stop()
		keep := &filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Keepalive{Keepalive: &filesystem.WatchDirResponse_KeepAlive{}}}
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if emit(keep) != nil {
					cancel()
					return
				}
			}
		}
	})
	cursor := w.Cursor
	for {
		b, err := rt.Guest.WatchEvents(ctx, w.ID, cursor, watchWait)
		if err != nil {
			return rpcError(err)
		}
		for _, ev := range fsEvents(ctx, rt, w.Path, b.Events, req.Msg.GetIncludeEntry()) {
			if err := emit(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Filesystem{Filesystem: ev}}); err != nil {
				return err
			}
		}
		cursor = b.NextCursor
		if b.Ended {
			return nil
		}
	}
}

// CreateWatcher starts a watch read by polling GetWatcherEvents.
func (f *filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[filesystem.CreateWatcherRequest]) (*connect.Response[filesystem.CreateWatcherResponse], error) {
	ctx, rt, p, err := pathTarget(ctx, req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	w, err := startWatch(ctx, rt, p, req.Msg.GetRecursive(), watcherLifetime)
	if err != nil {
		return nil, err
	}
	f.s.watchers.put(rt.Sandbox.ID, w.ID, watcher{root: w.Path, cursor: w.Cursor})
	return connect.NewResponse(&filesystem.CreateWatcherResponse{WatcherId: w.ID}), nil
}

// GetWatcherEvents answers the events since the previous call. A watcher
// that ended (its directory removed, its lifetime over) with nothing left
// to read is NotFound, so a polling client stops.
func (f *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[filesystem.GetWatcherEventsRequest]) (*connect.Response[filesystem.GetWatcherEventsResponse], error) {
	rt, err := target(ctx)
	if err != nil {
		return nil, err
	}
	id := req.Msg.GetWatcherId()
	if id == "" {
		return nil, invalidArg("watcher_id is required")
	}
	st, _ := f.s.watchers.get(rt.Sandbox.ID, id) // forgotten: read from the start
	b, err := rt.Guest.WatchEvents(ctx, id, st.cursor, 0)
	if err != nil {
		return nil, rpcError(err)
	}
	if b.Ended && len(b.Events) == 0 {
		f.s.watchers.remove(rt.Sandbox.ID, id)
		return nil, notFound(fmt.Sprintf("watcher %s ended (%s)", id, b.Reason))
	}
	st.cursor = b.NextCursor
	f.s.watchers.put(rt.Sandbox.ID, id, st)
	return connect.NewResponse(&filesystem.GetWatcherEventsResponse{Events: fsEvents(ctx, rt, st.root, b.Events, false)}), nil
}

func (f *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[filesystem.RemoveWatcherRequest]) (*connect.Response[filesystem.RemoveWatcherResponse], error) {
	rt, err := target(ctx)
	if err != nil {
		return nil, err
	}
	id := req.Msg.GetWatcherId()
	if id == "" {
		return nil, invalidArg("watcher_id is required")
	}
	f.s.watchers.remove(rt.Sandbox.ID, id)
	if _, err := rt.Guest.WatchStop(ctx, id); err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&filesystem.RemoveWatcherResponse{}), nil
}

// startWatch watches the directory p: a path that is missing is NotFound,
// one that is not a directory InvalidArgument, as with envd.
func startWatch(ctx context.Context, rt sandbox.Routed, p string, recursive bool, lifetimeMs int64) (*guest.WatchInfo, error) {
	e, err := rt.Guest.Stat(ctx, p)
	if err != nil {
		return nil, rpcError(err)
	}
	if e.Type != typeDirectory {
		return nil, invalidArg(fmt.Sprintf("path %s is not a directory", p))
	}
	w, err := rt.Guest.WatchStart(ctx, guest.WatchRequest{Path: e.Path, Recursive: recursive, TimeoutMs: &lifetimeMs})
	if err != nil {
		return nil, rpcError(err)
	}
	return w, nil
}

// fsEvents are the guest's events as envd's: named relative to the
// watched directory, with the entry when asked (and still there).
func fsEvents(ctx context.Context, rt sandbox.Routed, root string, evs []guest.WatchEvent, withEntry bool) []*filesystem.FilesystemEvent {
	out := make([]*filesystem.FilesystemEvent, 0, len(evs))
	for _, ev := range evs {
		typ, ok := eventTypes[ev.Type]
		if !ok || isWriteTemp(ev.Path) {
			continue
		}
		name := ev.Path
		if root != "" {
			name = relName(root, ev.Path)
		}
		fe := &filesystem.FilesystemEvent{Name: name, Type: typ}
		if withEntry && typ != filesystem.EventType_EVENT_TYPE_REMOVE && typ != filesystem.EventType_EVENT_TYPE_RENAME {
			if e, err := rt.Guest.Stat(ctx, ev.Path); err == nil {
				fe.Entry = entryInfo(e)
			}
		}
		out = append(out, fe)
	}
	return out
}

// isWriteTemp tells the temporary file the guest writes a file's new
// bytes to, beside it, before renaming it over the file: an upload shows
// as the file's own creation only, as it does with envd.
func isWriteTemp(p string) bool {
	base := path.Base(p)
	i := strings.LastIndex(base, ".emberbox-")
	if !strings.HasPrefix(base, ".") || i < 2 {
		return false
	}
	rnd := base[i+len(".emberbox-"):]
	if len(rnd) != 12 {
		return false
	}
	_, err := hex.DecodeString(rnd)
	return err == nil
}
