package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// File watches: the guest's agent watches with inotify and keeps each
// watch's recent events numbered from 0; these handlers check requests and
// read events from a cursor, by one long poll or, with follow, as NDJSON
// lines until the watch ends, the sandbox pauses, or followFor passes (a
// "continue" line: the client reads again from its cursor).

const (
	// followFor is how long one follow request streams; withruntime
	// reconnects on "continue" and reads with a 150 s timeout.
	followFor = 110 * time.Second
	// followPoll bounds each wait of a follow for the guest.
	followPoll = 20 * time.Second
	// maxWatchWaitMs bounds a long poll (withruntime asks at most 8000).
	maxWatchWaitMs = 30_000
	maxBatchMs     = 60_000
)

type watchRequest struct {
	Path       string   `json:"path"`
	Recursive  bool     `json:"recursive"`
	Events     []string `json:"events"`
	Include    []string `json:"include"`
	Exclude    []string `json:"exclude"`
	BatchMs    *int64   `json:"batchMs"` // accepted; events are sent as they come
	TimeoutMs  *int64   `json:"timeoutMs"`
	MaxWatches *int     `json:"maxWatches"` // directories one watch may follow
	ID         string   `json:"id"`
	Webhook    bool     `json:"webhook"`
}

// watchEventTypes maps the SDK's event names (and ours) to the agent's.
var watchEventTypes = map[string]string{
	"create": "create", "write": "modify", "modify": "modify", "remove": "delete", "delete": "delete",
	"rename": "rename", "chmod": "chmod",
}

type watchJSON struct {
	ID        string    `json:"id"`
	Path      string    `json:"path"`
	Recursive bool      `json:"recursive"`
	Events    []string  `json:"events,omitempty"`
	Cursor    int64     `json:"cursor"`
	Dirs      int       `json:"dirs"`
	State     string    `json:"state"`
	Reason    string    `json:"reason,omitempty"`
	CreatedAt *jsonTime `json:"createdAt"`
	ExpiresAt *jsonTime `json:"expiresAt"`
}

func toWatchJSON(in *guest.WatchInfo) watchJSON {
	return watchJSON{ID: in.ID, Path: in.Path, Recursive: in.Recursive, Events: in.Events, Cursor: in.Cursor,
		Dirs: in.Dirs, State: in.State, Reason: in.Reason, CreatedAt: optTime(&in.CreatedAt), ExpiresAt: optTime(in.ExpiresAt)}
}

func (req *watchRequest) toGuest() (guest.WatchRequest, []issue) {
	issues := pathIssue("path", req.Path)
	out := guest.WatchRequest{ID: req.ID, Path: req.Path, Recursive: req.Recursive, Include: req.Include,
		Exclude: req.Exclude, TimeoutMs: req.TimeoutMs}
	for _, e := range req.Events {
		t, ok := watchEventTypes[e]
		if !ok {
			issues = append(issues, issue{Path: "events", Message: "must be create, write, remove, rename or chmod"})
			break
		}
		out.Events = append(out.Events, t)
	}
	if len(req.Include) > guest.MaxWatchPatterns || len(req.Exclude) > guest.MaxWatchPatterns {
		issues = append(issues, issue{Path: "include", Message: fmt.Sprintf("at most %d include and exclude patterns each", guest.MaxWatchPatterns)})
	}
	if t := req.TimeoutMs; t != nil && (*t < 0 || *t > guest.MaxWatchTimeoutMs) {
		issues = append(issues, issue{Path: "timeoutMs", Message: fmt.Sprintf("must be from 0 (until stopped) to %d", int64(guest.MaxWatchTimeoutMs))})
	}
	if b := req.BatchMs; b != nil && (*b < 0 || *b > maxBatchMs) {
		issues = append(issues, issue{Path: "batchMs", Message: fmt.Sprintf("must be from 0 to %d", maxBatchMs)})
	}
	if m := req.MaxWatches; m != nil {
		if *m < 1 || *m > guest.MaxWatchDirs {
			issues = append(issues, issue{Path: "maxWatches", Message: fmt.Sprintf("must be from 1 to %d directories", guest.MaxWatchDirs)})
		}
		out.MaxDirs = *m
	}
	if len(req.ID) > 64 {
		issues = append(issues, issue{Path: "id", Message: "must be at most 64 bytes"})
	}
	return out, issues
}

func (s watches) start(w http.ResponseWriter, r *http.Request, c *call) error {
	var req watchRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	gr, issues := req.toGuest()
	if len(issues) > 0 {
		return invalid(sortIssues(issues))
	}
	if req.Webhook {
		return newError(http.StatusNotImplemented, "webhooks_unavailable", "This server does not send webhooks.").
			withHint("Read the watch's events with GET …/files/watches/{id}/events instead.")
	}
	return guestJSON(s.server, w, r, c, func(ctx context.Context, g guest.Handle) (*guest.WatchInfo, error) {
		return g.WatchStart(ctx, gr)
	}, toWatchJSON)
}

func (s watches) list(w http.ResponseWriter, r *http.Request, c *call) error {
	return guestJSON(s.server, w, r, c, func(ctx context.Context, g guest.Handle) ([]guest.WatchInfo, error) {
		return g.Watches(ctx)
	}, func(ins []guest.WatchInfo) dataJSON[watchJSON] { return dataOf(ins, toWatchJSON) })
}

func (s watches) stop(w http.ResponseWriter, r *http.Request, c *call) error {
	id := r.PathValue("watchId")
	return guestJSON(s.server, w, r, c, func(ctx context.Context, g guest.Handle) (bool, error) {
		return g.WatchStop(ctx, id)
	}, func(stopped bool) map[string]any {
		return map[string]any{"stopped": stopped, "id": id}
	})
}

type watchBatchJSON struct {
	Events     []guest.WatchEvent `json:"events"`
	NextCursor int64              `json:"nextCursor"`
	Notices    []map[string]any   `json:"notices,omitempty"`
	Ended      bool               `json:"ended,omitempty"`
}

// notices are a batch's notices as the SDK reads them, with "end" last
// when the watch ended.
func notices(b *guest.WatchBatch) []map[string]any {
	var out []map[string]any
	for _, n := range b.Notices {
		m := map[string]any{"k": n.K}
		if n.Lost > 0 {
			m["lost"] = n.Lost
		}
		if n.Path != "" {
			m["path"] = n.Path
		}
		if n.Count > 0 {
			m["count"] = n.Count
		}
		out = append(out, m)
	}
	if b.Ended {
		out = append(out, map[string]any{"k": "end", "reason": b.Reason})
	}
	return out
}

func (s watches) watchEvents(w http.ResponseWriter, r *http.Request, c *call) error {
	q := r.URL.Query()
	var issues []issue
	var cursor, waitMs int64
	if v := q.Get("cursor"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			issues = append(issues, issue{Path: "cursor", Message: "must be an event number (0 or more)"})
		}
		cursor = n
	}
	if v := q.Get("waitMs"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 || n > maxWatchWaitMs {
			issues = append(issues, issue{Path: "waitMs", Message: fmt.Sprintf("must be from 0 to %d", maxWatchWaitMs)})
		}
		waitMs = n
	}
	follow, err := boolParam(q.Get("follow"))
	if err != nil {
		issues = append(issues, issue{Path: "follow", Message: "must be true or false"})
	}
	if len(issues) > 0 {
		return invalid(issues)
	}
	_, g, err := s.guest(r, c)
	if err != nil {
		return err
	}
	id := r.PathValue("watchId")
	if !follow {
		b, err := g.WatchEvents(r.Context(), id, cursor, time.Duration(waitMs)*time.Millisecond)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, watchBatchJSON{Events: b.Events, NextCursor: b.NextCursor, Notices: notices(b), Ended: b.Ended})
		return nil
	}
	// The first read answers errors (no such watch) in the usual shape.
	b, err := g.WatchEvents(r.Context(), id, cursor, 0)
	if err != nil {
		return err
	}
	s.followWatch(w, r, c, g, id, b)
	return nil
}

// followWatch streams a watch's events as NDJSON lines: {"k":"events"},
// notices, then one of "end", "paused", "failure" or "continue".
func (s watches) followWatch(w http.ResponseWriter, r *http.Request, c *call, g guest.Handle, id string, b *guest.WatchBatch) {
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Time{})
	h := w.Header()
	h.Set("Content-Type", "application/x-ndjson")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	_ = rc.Flush()
	line := func(v map[string]any) bool {
		data, err := json.Marshal(v)
		if err != nil {
			return false
		}
		if _, err := w.Write(append(data, '\n')); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	ctx, cancel := context.WithTimeout(r.Context(), followFor)
	defer cancel()
	for {
		cursor := b.NextCursor
		ns := notices(b) // overflow and limit notices, then any end
		var end map[string]any
		if b.Ended {
			ns, end = ns[:len(ns)-1], ns[len(ns)-1]
		}
		for _, n := range ns {
			if n["cursor"] = cursor; !line(n) {
				return
			}
		}
		if len(b.Events) > 0 && !line(map[string]any{"k": "events", "events": b.Events, "cursor": cursor}) {
			return
		}
		if end != nil {
			end["cursor"] = cursor
			line(end)
			return
		}
		var err error
		wait := followPoll
		if dl, ok := ctx.Deadline(); ok {
			wait = min(wait, time.Until(dl))
		}
		if wait <= 0 {
			line(map[string]any{"k": "continue", "cursor": cursor})
			return
		}
		b, err = g.WatchEvents(ctx, id, cursor, wait)
		switch {
		case r.Context().Err() != nil:
			return
		case err == nil:
			continue
		case ctx.Err() != nil:
			line(map[string]any{"k": "continue", "cursor": cursor})
			return
		}
		if sb, gerr := s.mgr.Get(r.Context(), c.owner, r.PathValue("id")); gerr == nil && (sb.State.Paused() || sb.State == sandbox.StatePausing) {
			line(map[string]any{"k": "paused", "cursor": cursor})
			return
		}
		ae := toAPIError(err)
		line(map[string]any{"k": "failure", "code": ae.Code, "status": ae.Status, "message": ae.Message,
			"hint": ae.Hint, "requestId": requestID(r.Context()), "cursor": cursor})
		return
	}
}
