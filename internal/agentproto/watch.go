package agentproto

import "time"

// Bounds of file watches.
const (
	MaxWatches          = 16         // running at once in one guest
	MaxWatchDirs        = 8192       // directories one recursive watch follows
	MaxWatchEvents      = 4096       // kept per watch; older ones are dropped (overflow)
	MaxWatchBatch       = 1000       // events in one file.watch.events answer
	MaxWatchWait        = 60_000     // ms a file.watch.events call may wait
	MaxWatchPatterns    = 64         // include or exclude patterns
	MaxWatchTimeout     = 86_400_000 // ms: a day
	DefaultWatchTimeout = 3_600_000  // ms: an hour
)

// Watch event types.
const (
	WatchCreate = "create"
	WatchModify = "modify"
	WatchDelete = "delete"
	WatchRename = "rename" // the old name; the new one comes as create
	WatchChmod  = "chmod"
)

// WatchRequest is the body of the file.watch methods.
type WatchRequest struct {
	ID   string `json:"id,omitempty"` // start: the caller's id (a start of a running id answers it); else the watch
	Path string `json:"path,omitempty"`
	User string `json:"user,omitempty"`
	// Start only.
	Recursive bool     `json:"recursive,omitempty"`
	Events    []string `json:"events,omitempty"`  // types to keep; none: all
	Include   []string `json:"include,omitempty"` // path.Match patterns of a name or relative path
	Exclude   []string `json:"exclude,omitempty"`
	TimeoutMs *int64   `json:"timeoutMs,omitempty"` // nil: DefaultWatchTimeout; 0: until stopped
	MaxDirs   int      `json:"maxDirs,omitempty"`   // 0: MaxWatchDirs
	// Events only.
	Cursor int64 `json:"cursor,omitempty"`
	WaitMs int64 `json:"waitMs,omitempty"`
}

// WatchInfo describes a watch.
type WatchInfo struct {
	ID        string     `json:"id"`
	Path      string     `json:"path"`
	Recursive bool       `json:"recursive"`
	Events    []string   `json:"events,omitempty"`
	Cursor    int64      `json:"cursor"` // where the next event will be
	Dirs      int        `json:"dirs"`   // directories watched
	State     string     `json:"state"`  // running or ended
	Reason    string     `json:"reason,omitempty"`
	CreatedAt time.Time  `json:"createdAt"`
	ExpiresAt *time.Time `json:"expiresAt,omitempty"`
}

// WatchEvent is one change.
type WatchEvent struct {
	Type  string    `json:"type"`
	Path  string    `json:"path"`
	IsDir bool      `json:"isDir,omitempty"`
	At    time.Time `json:"at"`
}

// WatchNotice tells a reader that events were missed: "overflow" (the
// kept events or the kernel's queue overflowed; Lost counts those known)
// or "limit" (a directory was not watched: MaxDirs reached).
type WatchNotice struct {
	K     string `json:"k"`
	Lost  int64  `json:"lost,omitempty"`
	Path  string `json:"path,omitempty"`
	Count int    `json:"count,omitempty"`
}

// WatchBatch answers file.watch.events: the events from the cursor on,
// NextCursor to read from next, and whether the watch ended (and why:
// stopped, timeout, root-removed) with nothing more to read.
type WatchBatch struct {
	Events     []WatchEvent  `json:"events"`
	NextCursor int64         `json:"nextCursor"`
	Notices    []WatchNotice `json:"notices,omitempty"`
	Ended      bool          `json:"ended,omitempty"`
	Reason     string        `json:"reason,omitempty"`
}
