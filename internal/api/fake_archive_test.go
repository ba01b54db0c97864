package api

import (
	"context"
	"fmt"
	"io"
	"path"
	"strings"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
)

// fakeWatch is the fake guest's one watch.
type fakeWatch struct {
	req    guest.WatchRequest
	events []guest.WatchEvent
	ended  bool
}

// fakeArchive records what the fake guest's archive calls were given.
type fakeArchive struct {
	glob      string // root and pattern
	archive   string // dir, user, gzip and excludes
	unpacked  []byte
	unpackTo  string // dir and user
	unpackErr error
	cutAfter  int // Archive: bytes sent before the reader fails; 0 never
}

func (g fakeGuest) Glob(ctx context.Context, root, pattern string, hidden bool, limit int) ([]guest.FileEntry, error) {
	m := g.m
	if _, err := m.Get(ctx, g.owner, g.id); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.arch.glob = root + " " + pattern
	var out []guest.FileEntry
	for k, data := range m.files {
		id, p, _ := strings.Cut(k, "\x00")
		if ok, _ := path.Match(path.Join(root, pattern), p); id == g.id && ok {
			out = append(out, *m.entry(p, int64(len(data))))
		}
	}
	return out, nil
}

func (g fakeGuest) Rename(ctx context.Context, from, to string, overwrite bool) (*guest.FileEntry, error) {
	m := g.m
	if _, err := m.Get(ctx, g.owner, g.id); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	data, ok := m.files[g.id+"\x00"+from]
	if !ok {
		return nil, errdefs.New(errdefs.ErrNotFound, "file_not_found", "%s: no such file", from)
	}
	if _, exists := m.files[g.id+"\x00"+to]; exists && !overwrite {
		return nil, errdefs.New(errdefs.ErrConflict, "file_exists", "%s: exists", to)
	}
	delete(m.files, g.id+"\x00"+from)
	m.files[g.id+"\x00"+to] = data
	return m.entry(to, int64(len(data))), nil
}

func (g fakeGuest) Archive(ctx context.Context, dir, user string, gz bool, exclude []string) (io.ReadCloser, error) {
	m := g.m
	if _, err := m.Get(ctx, g.owner, g.id); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.arch.archive = fmt.Sprintf("%s user=%q gzip=%v exclude=%q", dir, user, gz, exclude)
	body := strings.Repeat("t", 100_000)
	if m.arch.cutAfter > 0 {
		return io.NopCloser(io.MultiReader(strings.NewReader(body[:m.arch.cutAfter]), errReader{})), nil
	}
	return io.NopCloser(strings.NewReader(body)), nil
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) {
	return 0, errdefs.New(errdefs.ErrConflict, "file_not_found", "vanished")
}

func (g fakeGuest) Unarchive(ctx context.Context, dir, user string, size int64, r io.Reader) (*guest.Unpacked, error) {
	m := g.m
	if _, err := m.Get(ctx, g.owner, g.id); err != nil {
		return nil, err
	}
	data, err := io.ReadAll(r)
	if err != nil || int64(len(data)) != size {
		return nil, fmt.Errorf("short body: %w", errdefs.ErrInternal)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.arch.unpacked, m.arch.unpackTo = data, fmt.Sprintf("%s user=%q", dir, user)
	if m.arch.unpackErr != nil {
		return nil, m.arch.unpackErr
	}
	return &guest.Unpacked{Entries: 3, Bytes: size}, nil
}

// The fake's watches: one list of events the test appends to.
func (g fakeGuest) WatchStart(ctx context.Context, req guest.WatchRequest) (*guest.WatchInfo, error) {
	m := g.m
	if _, err := m.Get(ctx, g.owner, g.id); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.watch.req = req
	return &guest.WatchInfo{ID: "wat_1", Path: req.Path, Recursive: req.Recursive, Events: req.Events, State: "running"}, nil
}

func (g fakeGuest) Watches(ctx context.Context) ([]guest.WatchInfo, error) {
	return []guest.WatchInfo{{ID: "wat_1", Path: "/workspace", State: "running"}}, nil
}

func (g fakeGuest) WatchEvents(ctx context.Context, id string, cursor int64, wait time.Duration) (*guest.WatchBatch, error) {
	m := g.m
	if id != "wat_1" {
		return nil, errdefs.New(errdefs.ErrNotFound, "watch_not_found", "no watch %s", id)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	b := &guest.WatchBatch{Events: []guest.WatchEvent{}, NextCursor: cursor}
	if cursor < int64(len(m.watch.events)) {
		b.Events = m.watch.events[cursor:]
		b.NextCursor = int64(len(m.watch.events))
	}
	b.Ended, b.Reason = m.watch.ended, "stopped"
	return b, nil
}

func (g fakeGuest) WatchStop(ctx context.Context, id string) (bool, error) {
	g.m.mu.Lock()
	defer g.m.mu.Unlock()
	g.m.watch.ended = true
	return true, nil
}
