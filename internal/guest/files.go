package guest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/emberbox/emberbox/internal/agentproto"
	"github.com/emberbox/emberbox/internal/errdefs"
)

// Stat describes path (not following a final symlink).
func (c *Client) Stat(ctx context.Context, path string) (*agentproto.FileEntry, error) {
	rep, err := c.roundTrip(ctx, &agentproto.Request{Method: agentproto.MethodFileStat, File: &agentproto.FileRequest{Path: path}}, ordinaryReply)
	if err != nil {
		return nil, err
	}
	if rep.Entry == nil {
		return nil, c.missing(agentproto.MethodFileStat, "entry")
	}
	return rep.Entry, nil
}

// List lists a directory.
func (c *Client) List(ctx context.Context, req agentproto.FileRequest) ([]agentproto.FileEntry, error) {
	rep, err := c.roundTrip(ctx, &agentproto.Request{Method: agentproto.MethodFileList, File: &req},
		readLimit{bytes: maxListReply, listKey: "entries", maxItems: agentproto.ListLimit(req.Limit)})
	if err != nil {
		return nil, err
	}
	if rep.Entries == nil {
		return []agentproto.FileEntry{}, nil
	}
	return rep.Entries, nil
}

// Mkdir creates a directory.
func (c *Client) Mkdir(ctx context.Context, path string, parents bool) (*agentproto.FileEntry, error) {
	rep, err := c.roundTrip(ctx, &agentproto.Request{Method: agentproto.MethodFileMkdir, File: &agentproto.FileRequest{Path: path, Parents: parents}}, ordinaryReply)
	if err != nil {
		return nil, err
	}
	if rep.Entry == nil {
		return nil, c.missing(agentproto.MethodFileMkdir, "entry")
	}
	return rep.Entry, nil
}

// Remove removes path; removed is false if it did not exist.
func (c *Client) Remove(ctx context.Context, path string, recursive bool) (bool, error) {
	rep, err := c.roundTrip(ctx, &agentproto.Request{Method: agentproto.MethodFileRemove, File: &agentproto.FileRequest{Path: path, Recursive: recursive}}, ordinaryReply)
	if err != nil {
		return false, err
	}
	return rep.Removed != nil && *rep.Removed, nil
}

// Chmod sets the permission bits of path (following a final symlink) as the
// sandbox user, who may change only the modes of files it owns, and returns
// the entry of path. mode is at most 07777.
func (c *Client) Chmod(ctx context.Context, path string, mode uint32) (*agentproto.FileEntry, error) {
	if mode > 0o7777 {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "invalid_request", "invalid mode %o: only permission bits (at most 7777)", mode)
	}
	rep, err := c.roundTrip(ctx, &agentproto.Request{Method: agentproto.MethodFileChmod, File: &agentproto.FileRequest{Path: path, Mode: mode}}, ordinaryReply)
	if err != nil {
		return nil, err
	}
	if rep.Entry == nil {
		return nil, c.missing(agentproto.MethodFileChmod, "entry")
	}
	return rep.Entry, nil
}

// WriteFile atomically replaces path with exactly size bytes from r.
func (c *Client) WriteFile(ctx context.Context, path string, mode uint32, size int64, r io.Reader) (*agentproto.FileEntry, error) {
	rep, err := c.send(ctx, &agentproto.Request{Method: agentproto.MethodFileWrite, File: &agentproto.FileRequest{Path: path, Mode: mode, Size: size}}, size, r)
	if err != nil {
		return nil, err
	}
	if rep.Entry == nil {
		return nil, c.missing(agentproto.MethodFileWrite, "entry")
	}
	return rep.Entry, nil
}

// send makes a call whose request is followed by exactly size bytes from r
// in data frames, and reads its one reply; an error reply is returned as
// the error.
func (c *Client) send(ctx context.Context, req *agentproto.Request, size int64, r io.Reader) (*agentproto.Reply, error) {
	fc, done, err := c.call(ctx, req)
	if err != nil {
		return nil, err
	}
	defer done()
	if err := c.sendData(ctx, fc, size, r); err != nil {
		return nil, err
	}
	var rep agentproto.Reply
	if err := c.readJSON(ctx, fc, req.Method, ordinaryReply, &rep); err != nil {
		return nil, err
	}
	if rep.Error != nil {
		return nil, wireError(rep.Error)
	}
	return &rep, nil
}

// ReadFile opens path for reading. The returned reader yields the file's
// bytes and must be closed.
func (c *Client) ReadFile(ctx context.Context, path string) (*agentproto.FileEntry, io.ReadCloser, error) {
	fc, done, err := c.call(ctx, &agentproto.Request{Method: agentproto.MethodFileRead, File: &agentproto.FileRequest{Path: path}})
	if err != nil {
		return nil, nil, err
	}
	var rep agentproto.Reply
	if err := c.readJSON(ctx, fc, agentproto.MethodFileRead, ordinaryReply, &rep); err != nil {
		done()
		return nil, nil, err
	}
	if rep.Error != nil {
		done()
		return nil, nil, wireError(rep.Error)
	}
	if rep.Entry == nil {
		done()
		return nil, nil, c.missing(agentproto.MethodFileRead, "entry")
	}
	return rep.Entry, &fileReader{c: c, fc: fc, done: done, ctx: ctx, method: agentproto.MethodFileRead}, nil
}

type fileReader struct {
	method string
	ctx    context.Context
	c      *Client
	fc     *agentproto.Conn
	done   func()
	buf    []byte
	err    error
}

func (r *fileReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		// The agent sends the file in DataChunk frames; a JSON frame ends
		// it and is small.
		kind, payload, err := r.fc.ReadFrameMax(max(agentproto.DataChunk, MaxReply))
		switch {
		case r.ctx.Err() != nil:
			r.err = r.ctx.Err()
		case errors.Is(err, agentproto.ErrFrameTooLarge), errors.Is(err, agentproto.ErrUnknownKind):
			r.err = r.c.violation(r.method, "frame over the limit or of unknown kind")
		case err != nil:
			r.err = r.c.lost(r.ctx)
		case kind == agentproto.KindData && len(payload) > agentproto.DataChunk:
			r.err = r.c.violation(r.method, "data frame over %d bytes", agentproto.DataChunk)
		}
		if r.err != nil {
			return 0, r.err
		}
		if kind == agentproto.KindData {
			r.buf = payload
			continue
		}
		var rep agentproto.Reply
		if err := checkShape(payload, "", 0); err != nil {
			r.err = r.c.violation(r.method, "%v", err)
		} else if err := json.Unmarshal(payload, &rep); err != nil {
			r.err = r.c.violation(r.method, "reply does not decode")
		} else if rep.Error != nil {
			r.err = fmt.Errorf("%s: %w", r.method, wireError(rep.Error))
		} else {
			r.err = io.EOF
		}
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

func (r *fileReader) Close() error {
	r.done()
	return nil
}

// sendData sends exactly size bytes from r in data frames.
func (c *Client) sendData(ctx context.Context, fc *agentproto.Conn, size int64, r io.Reader) error {
	buf := make([]byte, agentproto.DataChunk)
	var sent int64
	for sent < size {
		n, rerr := io.ReadFull(r, buf[:min(int64(len(buf)), size-sent)])
		if n > 0 {
			if err := fc.WriteFrame(agentproto.KindData, buf[:n]); err != nil {
				return c.lost(ctx)
			}
			sent += int64(n)
		}
		if rerr != nil && sent < size {
			// The agent is waiting for size bytes; ending the stream makes
			// it discard what it took.
			return errdefs.New(errdefs.ErrInvalidArgument, "invalid_request", "body ended after %d of %d bytes", sent, size)
		}
	}
	return nil
}
