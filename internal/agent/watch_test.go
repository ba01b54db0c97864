package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/agentproto"
)

func watchCall(t *testing.T, a *Agent, method string, req agentproto.WatchRequest) agentproto.Reply {
	t.Helper()
	return call(t, a, agentproto.Request{Method: method, Watch: &req})
}

// collectEvents reads the watch until want (type and path relative to
// home) have all been seen, or fails after a deadline.
func collectEvents(t *testing.T, a *Agent, id, home string, cursor *int64, want ...string) []string {
	t.Helper()
	var seen []string
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		rep := watchCall(t, a, agentproto.MethodFileWatchEvents, agentproto.WatchRequest{ID: id, Cursor: *cursor, WaitMs: 2000})
		if rep.Error != nil {
			t.Fatalf("events: %v", rep.Error)
		}
		*cursor = rep.Batch.NextCursor
		for _, e := range rep.Batch.Events {
			rel, _ := filepath.Rel(home, e.Path)
			seen = append(seen, e.Type+" "+rel)
		}
		missing := false
		for _, w := range want {
			if !contains(seen, w) {
				missing = true
			}
		}
		if !missing {
			return seen
		}
	}
	t.Fatalf("saw %q, want all of %q", seen, want)
	return nil
}

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

func TestWatchRecursiveEvents(t *testing.T) {
	home := t.TempDir()
	a := newTestAgent(t, os.Geteuid(), os.Getegid(), home)
	t.Cleanup(a.watches.stopAll)
	must(t, os.MkdirAll(filepath.Join(home, "node_modules"), 0o755))
	rep := watchCall(t, a, agentproto.MethodFileWatchStart, agentproto.WatchRequest{Path: home, Recursive: true, Exclude: []string{"node_modules"}})
	if rep.Error != nil || rep.Watch == nil || rep.Watch.State != "running" || rep.Watch.ExpiresAt == nil {
		t.Fatalf("start: %+v %v", rep.Watch, rep.Error)
	}
	id := rep.Watch.ID
	var cursor int64
	must(t, os.WriteFile(filepath.Join(home, "a.txt"), []byte("1"), 0o644))
	must(t, os.MkdirAll(filepath.Join(home, "sub/deeper"), 0o755))
	must(t, os.WriteFile(filepath.Join(home, "node_modules/junk"), []byte("x"), 0o644))
	collectEvents(t, a, id, home, &cursor, "create a.txt", "create sub", "create sub/deeper")
	// A new directory is watched once its create is told, and what is
	// made in it from then on is seen.
	must(t, os.WriteFile(filepath.Join(home, "sub/deeper/b.txt"), []byte("2"), 0o644))
	f, err := os.OpenFile(filepath.Join(home, "a.txt"), os.O_WRONLY|os.O_APPEND, 0)
	must(t, err)
	_, err = f.WriteString("more")
	must(t, err)
	must(t, f.Close())
	must(t, os.Remove(filepath.Join(home, "a.txt")))
	must(t, os.Rename(filepath.Join(home, "sub/deeper/b.txt"), filepath.Join(home, "sub/c.txt")))
	seen := collectEvents(t, a, id, home, &cursor, "create sub/deeper/b.txt", "modify a.txt", "delete a.txt",
		"rename sub/deeper/b.txt", "create sub/c.txt")
	for _, s := range seen {
		if strings.Contains(s, "node_modules") {
			t.Errorf("an excluded path was reported: %s", s)
		}
	}
	list := watchCall(t, a, agentproto.MethodFileWatchList, agentproto.WatchRequest{})
	if len(list.Watches) != 1 || list.Watches[0].Dirs < 3 {
		t.Fatalf("list: %+v", list.Watches)
	}
	if rep := watchCall(t, a, agentproto.MethodFileWatchStop, agentproto.WatchRequest{ID: id}); rep.Stopped == nil || !*rep.Stopped {
		t.Fatalf("stop: %+v", rep)
	}
	if rep := watchCall(t, a, agentproto.MethodFileWatchEvents, agentproto.WatchRequest{ID: id}); rep.Error == nil || rep.Error.Code != agentproto.CodeWatchNotFound {
		t.Fatalf("events of a stopped watch: %+v", rep)
	}
}

func TestWatchOverflowTimeoutAndLimits(t *testing.T) {
	home := t.TempDir()
	a := newTestAgent(t, os.Geteuid(), os.Getegid(), home)
	t.Cleanup(a.watches.stopAll)
	ms := int64(300)
	rep := watchCall(t, a, agentproto.MethodFileWatchStart, agentproto.WatchRequest{Path: home, TimeoutMs: &ms, Events: []string{"create"}})
	if rep.Error != nil {
		t.Fatal(rep.Error)
	}
	w, _ := a.watches.get(rep.Watch.ID)
	// More events than are kept: a reader from 0 is told how many it lost.
	for i := range agentproto.MaxWatchEvents + 100 {
		w.emit(agentproto.WatchCreate, filepath.Join(home, "f"), i%2 == 0)
	}
	b := w.read(t.Context(), 0, 0)
	if len(b.Notices) == 0 || b.Notices[0].K != "overflow" || b.Notices[0].Lost <= 0 || len(b.Events) != agentproto.MaxWatchBatch {
		t.Fatalf("overflow: %+v, %d events", b.Notices, len(b.Events))
	}
	// Types not asked for are not kept.
	before := w.info().Cursor
	w.emit(agentproto.WatchModify, filepath.Join(home, "f"), false)
	if w.info().Cursor != before {
		t.Fatal("a modify was kept by a create-only watch")
	}
	// The timeout ends it; a reader sees the end once it has read all.
	deadline := time.Now().Add(10 * time.Second)
	cursor := b.NextCursor
	for {
		b := w.read(t.Context(), cursor, time.Second)
		cursor = b.NextCursor
		if b.Ended {
			if b.Reason != "timeout" {
				t.Fatalf("ended: %q", b.Reason)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the watch did not time out")
		}
	}
	// At most MaxWatches run at once.
	for i := range agentproto.MaxWatches {
		if rep := watchCall(t, a, agentproto.MethodFileWatchStart, agentproto.WatchRequest{Path: home}); rep.Error != nil {
			t.Fatalf("watch %d: %v", i, rep.Error)
		}
	}
	if rep := watchCall(t, a, agentproto.MethodFileWatchStart, agentproto.WatchRequest{Path: home}); rep.Error == nil {
		t.Fatal("a watch past the most was started")
	}
	for _, bad := range []agentproto.WatchRequest{{Path: filepath.Join(home, "nope")}, {Path: home, Events: []string{"explode"}},
		{Path: home, Include: []string{"["}}} {
		if rep := watchCall(t, a, agentproto.MethodFileWatchStart, bad); rep.Error == nil {
			t.Errorf("%+v was started", bad)
		}
	}
}
