package ociimport

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/emberbox/emberbox/internal/guest"
)

// GuestVM is a VM over a sandbox's guest agent (Manager.Guest): scripts
// run as root through exec, files move through the agent's file calls as
// root.
type GuestVM struct {
	G VMGuest
}

// VMGuest is what a GuestVM calls in the guest: a guest.Handle or its
// client has it.
type VMGuest interface {
	Exec(ctx context.Context, req guest.ExecRequest, onEvent func(guest.Event) error) (*guest.ExecResult, error)
	WriteFile(ctx context.Context, path string, mode uint32, size int64, r io.Reader) (*guest.FileEntry, error)
	ReadFile(ctx context.Context, path string) (*guest.FileEntry, io.ReadCloser, error)
}

// maxTail is how much of a failed script's output its error carries.
const maxTail = 2048

// Run implements VM.
func (v GuestVM) Run(ctx context.Context, script string, log io.Writer) error {
	tail := &tailBuffer{max: maxTail}
	w := io.MultiWriter(log, tail)
	res, err := v.G.Exec(ctx, guest.ExecRequest{
		Argv: []string{"/bin/sh", "-c", script}, User: "root", Cwd: "/", Stream: true,
	}, func(ev guest.Event) error {
		if ev.Type == "stdout" || ev.Type == "stderr" {
			_, _ = w.Write(ev.Data)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if res.ExitCode == nil || *res.ExitCode != 0 {
		code := "none"
		if res.ExitCode != nil {
			code = fmt.Sprint(*res.ExitCode)
		}
		return fmt.Errorf("exit %s: %s", code, strings.TrimSpace(tail.String()))
	}
	return nil
}

// WriteFile implements VM.
func (v GuestVM) WriteFile(ctx context.Context, path string, r io.Reader, size int64) error {
	_, err := v.G.WriteFile(guest.WithFileUser(ctx, "root"), path, 0o600, size, r)
	return err
}

// ReadFile implements VM.
func (v GuestVM) ReadFile(ctx context.Context, path string, w io.Writer) (int64, error) {
	_, rc, err := v.G.ReadFile(guest.WithFileUser(ctx, "root"), path)
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	return io.Copy(w, rc)
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string { return string(t.b) }
