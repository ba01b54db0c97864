package guest

import (
	"context"
	"io"
	"time"

	"github.com/emberbox/emberbox/internal/agentproto"
	"github.com/emberbox/emberbox/internal/errdefs"
)

// Glob lists the entries under root whose paths relative to root match
// pattern ("**" spans directories), at most limit of them.
func (c *Client) Glob(ctx context.Context, root, pattern string, hidden bool, limit int) ([]agentproto.FileEntry, error) {
	req := agentproto.FileRequest{Path: root, Glob: pattern, Hidden: hidden, Limit: limit}
	rep, err := c.roundTrip(ctx, &agentproto.Request{Method: agentproto.MethodFileGlob, File: &req},
		readLimit{bytes: maxListReply, listKey: "entries", maxItems: agentproto.ListLimit(limit)})
	if err != nil {
		return nil, err
	}
	if rep.Entries == nil {
		return []agentproto.FileEntry{}, nil
	}
	return rep.Entries, nil
}

// Rename moves from to to as the sandbox user; without overwrite an
// existing to is refused (file_exists). It returns to's entry.
func (c *Client) Rename(ctx context.Context, from, to string, overwrite bool) (*agentproto.FileEntry, error) {
	req := agentproto.FileRequest{Path: from, Target: to, Overwrite: overwrite}
	rep, err := c.roundTrip(ctx, &agentproto.Request{Method: agentproto.MethodFileRename, File: &req}, ordinaryReply)
	if err != nil {
		return nil, err
	}
	if rep.Entry == nil {
		return nil, c.missing(agentproto.MethodFileRename, "entry")
	}
	return rep.Entry, nil
}

// Archive streams the directory dir as a tar (gzipped with gz), read as
// user ("" or "root"), leaving out exclude (paths relative to dir). An
// error about dir comes back before any byte; one later ends the reader
// with an error. The reader must be closed.
func (c *Client) Archive(ctx context.Context, dir, user string, gz bool, exclude []string) (io.ReadCloser, error) {
	req := agentproto.FileRequest{Path: dir, User: user, Gzip: gz, Exclude: exclude}
	fc, done, err := c.call(ctx, &agentproto.Request{Method: agentproto.MethodFileArchive, File: &req})
	if err != nil {
		return nil, err
	}
	var rep agentproto.Reply
	if err := c.readJSON(ctx, fc, agentproto.MethodFileArchive, ordinaryReply, &rep); err != nil {
		done()
		return nil, err
	}
	if rep.Error != nil {
		done()
		return nil, wireError(rep.Error)
	}
	if !rep.OK {
		done()
		return nil, c.missing(agentproto.MethodFileArchive, "ok")
	}
	return &fileReader{c: c, fc: fc, done: done, ctx: ctx, method: agentproto.MethodFileArchive}, nil
}

// Unarchive sends exactly size bytes of a tar or tar.gz from r to be
// unpacked into the directory dir as user ("" or "root").
func (c *Client) Unarchive(ctx context.Context, dir, user string, size int64, r io.Reader) (*agentproto.Unpacked, error) {
	if size < 0 || size > agentproto.MaxUnarchive {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "invalid_request", "an archive is 0 to %d bytes", int64(agentproto.MaxUnarchive))
	}
	req := agentproto.FileRequest{Path: dir, User: user, Size: size}
	rep, err := c.send(ctx, &agentproto.Request{Method: agentproto.MethodFileUnarchive, File: &req}, size, r)
	if err != nil {
		return nil, err
	}
	if rep.Unpacked == nil {
		return nil, c.missing(agentproto.MethodFileUnarchive, "unpacked")
	}
	return rep.Unpacked, nil
}

// WatchStart starts a file watch (see agentproto.WatchRequest).
func (c *Client) WatchStart(ctx context.Context, req agentproto.WatchRequest) (*agentproto.WatchInfo, error) {
	rep, err := c.roundTrip(ctx, &agentproto.Request{Method: agentproto.MethodFileWatchStart, Watch: &req}, ordinaryReply)
	if err != nil {
		return nil, err
	}
	if rep.Watch == nil {
		return nil, c.missing(agentproto.MethodFileWatchStart, "watch")
	}
	return rep.Watch, nil
}

// Watches lists the guest's file watches.
func (c *Client) Watches(ctx context.Context) ([]agentproto.WatchInfo, error) {
	rep, err := c.roundTrip(ctx, &agentproto.Request{Method: agentproto.MethodFileWatchList, Watch: &agentproto.WatchRequest{}},
		readLimit{bytes: maxListReply, listKey: "watches", maxItems: 4 * agentproto.MaxWatches})
	if err != nil {
		return nil, err
	}
	if rep.Watches == nil {
		return []agentproto.WatchInfo{}, nil
	}
	return rep.Watches, nil
}

// WatchEvents reads a watch's events from cursor, waiting up to wait for
// some.
func (c *Client) WatchEvents(ctx context.Context, id string, cursor int64, wait time.Duration) (*agentproto.WatchBatch, error) {
	req := agentproto.WatchRequest{ID: id, Cursor: cursor, WaitMs: wait.Milliseconds()}
	rep, err := c.roundTrip(ctx, &agentproto.Request{Method: agentproto.MethodFileWatchEvents, Watch: &req},
		readLimit{bytes: maxListReply}) // events are nested: bounded as nested items
	if err != nil {
		return nil, err
	}
	if rep.Batch == nil {
		return nil, c.missing(agentproto.MethodFileWatchEvents, "batch")
	}
	return rep.Batch, nil
}

// WatchStop stops a watch.
func (c *Client) WatchStop(ctx context.Context, id string) (bool, error) {
	rep, err := c.roundTrip(ctx, &agentproto.Request{Method: agentproto.MethodFileWatchStop, Watch: &agentproto.WatchRequest{ID: id}}, ordinaryReply)
	if err != nil {
		return false, err
	}
	if rep.Stopped == nil {
		return false, c.missing(agentproto.MethodFileWatchStop, "stopped")
	}
	return *rep.Stopped, nil
}
