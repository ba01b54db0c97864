package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// qmpConn is a connection to a VM's QEMU Machine Protocol monitor. The
// driver needs a handful of commands (stop, cont, migrate, getfd,
// query-status, quit), one at a time, and getfd needs its descriptor sent
// with SCM_RIGHTS, which the QMP libraries for Go do not offer; so this is
// a small client of its own.
type qmpConn struct {
	c   *net.UnixConn
	dec *json.Decoder
}

// qmpError is an error QEMU answered a command with.
type qmpError struct {
	Cmd, Class, Desc string
}

func (e *qmpError) Error() string { return fmt.Sprintf("qmp %s: %s: %s", e.Cmd, e.Class, e.Desc) }

// dialQMP connects to the monitor socket in dir and leaves capabilities
// negotiation mode. QEMU serves one monitor client at a time; a second
// waits until the first hangs up.
func dialQMP(ctx context.Context, dir string, done <-chan struct{}) (*qmpConn, error) {
	c, err := dialUnix(ctx, dir, qmpSocket, done)
	if err != nil {
		return nil, err
	}
	q := &qmpConn{c: c.(*net.UnixConn)}
	q.dec = json.NewDecoder(bufio.NewReader(q.c))
	stop := context.AfterFunc(ctx, func() { q.c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	var greeting struct {
		QMP json.RawMessage `json:"QMP"`
	}
	if err := q.dec.Decode(&greeting); err != nil || greeting.QMP == nil {
		q.Close()
		return nil, fmt.Errorf("qmp greeting: %w", errors.Join(err, ctx.Err()))
	}
	if err := q.execute(ctx, "qmp_capabilities", nil, nil); err != nil {
		q.Close()
		return nil, err
	}
	return q, nil
}

func (q *qmpConn) Close() error { return q.c.Close() }

// execute runs cmd with args and decodes its "return" into out (if not nil).
// Events that arrive meanwhile are skipped.
func (q *qmpConn) execute(ctx context.Context, cmd string, args any, out any) error {
	return q.executeFD(ctx, cmd, args, out, -1)
}

// executeFD is execute that passes fd (if >= 0) along with the command, as
// getfd and add-fd expect.
func (q *qmpConn) executeFD(ctx context.Context, cmd string, args any, out any, fd int) error {
	stop := context.AfterFunc(ctx, func() { q.c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	req := map[string]any{"execute": cmd}
	if args != nil {
		req["arguments"] = args
	}
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	var oob []byte
	if fd >= 0 {
		oob = unix.UnixRights(fd)
	}
	if _, _, err := q.c.WriteMsgUnix(b, oob, nil); err != nil {
		return fmt.Errorf("qmp %s: %w", cmd, errors.Join(err, ctx.Err()))
	}
	for {
		var resp struct {
			Return json.RawMessage `json:"return"`
			Error  *struct {
				Class string `json:"class"`
				Desc  string `json:"desc"`
			} `json:"error"`
			Event string `json:"event"`
		}
		if err := q.dec.Decode(&resp); err != nil {
			return fmt.Errorf("qmp %s: %w", cmd, errors.Join(err, ctx.Err()))
		}
		switch {
		case resp.Event != "":
			continue
		case resp.Error != nil:
			return &qmpError{Cmd: cmd, Class: resp.Error.Class, Desc: resp.Error.Desc}
		}
		if out != nil && resp.Return != nil {
			return json.Unmarshal(resp.Return, out)
		}
		return nil
	}
}

// status is the VM's run state as QEMU names it ("running", "paused",
// "inmigrate", "postmigrate", "finish-migrate"…).
func (q *qmpConn) status(ctx context.Context) (string, error) {
	var st struct {
		Status string `json:"status"`
	}
	err := q.execute(ctx, "query-status", nil, &st)
	return st.Status, err
}

// ignoreShared turns on x-ignore-shared: guest RAM lives in a shared file
// that outlives QEMU, so a migration carries only the device state (some
// 100 KB) and the destination maps the same file.
func (q *qmpConn) ignoreShared(ctx context.Context) error {
	return q.execute(ctx, "migrate-set-capabilities", map[string]any{
		"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": true}},
	}, nil)
}

// saveState writes the device state of the stopped VM into f and waits
// until QEMU reports the migration completed.
func (q *qmpConn) saveState(ctx context.Context, f *os.File) error {
	if err := q.ignoreShared(ctx); err != nil {
		return err
	}
	if err := q.executeFD(ctx, "getfd", map[string]any{"fdname": "state"}, nil, int(f.Fd())); err != nil {
		return err
	}
	if err := q.execute(ctx, "migrate", map[string]any{"uri": "fd:state"}, nil); err != nil {
		return err
	}
	for {
		var mi struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		if err := q.execute(ctx, "query-migrate", nil, &mi); err != nil {
			return err
		}
		switch mi.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("saving the VM state: migration %s: %s", mi.Status, mi.ErrorDesc)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("saving the VM state: %w", ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// loadState reads the device state from the descriptor QEMU inherited as
// fd (started with -incoming defer and -S) and waits until the VM is
// restored and stopped, ready for cont.
func (q *qmpConn) loadState(ctx context.Context, fd int, exited <-chan struct{}) error {
	if err := q.ignoreShared(ctx); err != nil {
		return err
	}
	if err := q.execute(ctx, "migrate-incoming", map[string]any{"uri": fmt.Sprintf("fd:%d", fd)}, nil); err != nil {
		return err
	}
	for {
		st, err := q.status(ctx)
		if err != nil {
			return err
		}
		if st != "inmigrate" {
			if st != "paused" && st != "prelaunch" {
				return fmt.Errorf("restoring the VM state: ended in run state %q", st)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("restoring the VM state: %w", ctx.Err())
		case <-exited:
			return errors.New("restoring the VM state: qemu exited (see qemu.log)")
		case <-time.After(2 * time.Millisecond):
		}
	}
}
