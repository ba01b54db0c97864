package volumes_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/nbd"
	"github.com/emberbox/emberbox/internal/sandbox"
	"github.com/emberbox/emberbox/internal/volumes"
	"github.com/emberbox/emberbox/internal/volumes/volumestest"
)

// hostileGuest answers attach and detach as a guest whose root keeps the
// volume's NBD stream open after it says it let go; onAttach (nil: none)
// runs inside an attach and answers it. The rest of guest.Handle is
// never called here.
type hostileGuest struct {
	guest.Handle
	onAttach func(attachmentID string) error
}

func (g hostileGuest) AttachVolume(_ context.Context, req guest.VolumeRequest) error {
	if g.onAttach != nil {
		return g.onAttach(req.AttachmentID)
	}
	return nil
}
func (hostileGuest) DetachVolume(context.Context, string) error       { return nil }
func (hostileGuest) FreezeVolume(context.Context, string, bool) error { return nil }

type oneGuest struct{ g hostileGuest }

func (o oneGuest) Guest(_ context.Context, owner, id string) (*sandbox.Sandbox, guest.Handle, error) {
	return &sandbox.Sandbox{ID: id, OwnerKeyID: owner}, guest.Handle{ProcessRunner: o.g, FileSystem: o.g, Watcher: o.g, PortDialer: o.g, Volumes: o.g}, nil
}

const (
	owner     = "key_1"
	sandboxID = "sbx_1"
)

// guestStream is the guest's end of a served volume stream.
type guestStream struct {
	conn   net.Conn
	served chan struct{} // closed when ServeVolume returns
}

// openStream has the service serve attachmentID's stream, as the guest
// agent's volume.nbd channel would, and returns the guest's end; ok is
// whether the service accepted it.
func openStream(t *testing.T, svc *volumes.Service, attachmentID string) (*guestStream, bool) {
	t.Helper()
	host, guest := net.Pipe()
	t.Cleanup(func() { host.Close(); guest.Close() })
	accepted := make(chan bool, 1)
	gs := &guestStream{conn: guest, served: make(chan struct{})}
	go func() {
		defer close(gs.served)
		svc.ServeVolume(context.Background(), sandboxID, attachmentID, host, bufio.NewReader(host),
			func(err error) error { accepted <- err == nil; return nil })
	}()
	return gs, <-accepted
}

// write sends an NBD write of data at off and reads its reply.
func (g *guestStream) write(off uint64, data []byte) error {
	var h [nbd.RequestLen]byte
	binary.BigEndian.PutUint32(h[0:], nbd.RequestMagic)
	binary.BigEndian.PutUint16(h[6:], nbd.CmdWrite)
	binary.BigEndian.PutUint64(h[8:], 1)
	binary.BigEndian.PutUint64(h[16:], off)
	binary.BigEndian.PutUint32(h[24:], uint32(len(data)))
	if _, err := g.conn.Write(append(h[:], data...)); err != nil {
		return err
	}
	var reply [nbd.ReplyLen]byte
	if _, err := io.ReadFull(g.conn, reply[:]); err != nil {
		return err
	}
	if code := binary.BigEndian.Uint32(reply[4:]); code != 0 {
		return &os.PathError{Op: "nbd write", Path: "volume", Err: os.ErrInvalid}
	}
	return nil
}

func newAttached(t *testing.T) (*volumes.Service, string, *volumes.Attachment) {
	t.Helper()
	dir := t.TempDir()
	svc := volumes.New(volumes.Config{Store: volumestest.New(), DataDir: dir, Mkfs: "true"})
	svc.SetGuests(oneGuest{})
	ctx := context.Background()
	v, err := svc.Create(ctx, owner, volumes.CreateSpec{SizeMiB: volumes.MinSizeMiB})
	if err != nil {
		t.Fatal(err)
	}
	a, err := svc.Attach(ctx, owner, v.ID, sandboxID, "/data")
	if err != nil {
		t.Fatal(err)
	}
	return svc, filepath.Join(dir, "volumes", v.ID, "disk.raw"), a
}

// A detach or a release closes the volume's stream from the host's side,
// though the guest keeps its end open: what the guest writes after it
// fails and never reaches the file, and no new stream of the ended
// attachment is served.
func TestAttachmentEndClosesStream(t *testing.T) {
	for name, end := range map[string]func(svc *volumes.Service, a *volumes.Attachment) error{
		"detach": func(svc *volumes.Service, a *volumes.Attachment) error {
			_, err := svc.Detach(context.Background(), owner, a.VolumeID, a.ID)
			return err
		},
		"release": func(svc *volumes.Service, a *volumes.Attachment) error {
			svc.Release(context.Background(), sandboxID)
			return nil
		},
	} {
		t.Run(name, func(t *testing.T) {
			svc, file, a := newAttached(t)
			gs, ok := openStream(t, svc, a.ID)
			if !ok {
				t.Fatal("the attached volume's stream was refused")
			}
			if err := gs.write(0, []byte("before")); err != nil {
				t.Fatalf("write while attached: %v", err)
			}
			if err := end(svc, a); err != nil {
				t.Fatal(err)
			}
			select {
			case <-gs.served:
			case <-time.After(time.Minute):
				t.Fatal("the stream is still served after the attachment ended")
			}
			if err := gs.write(4096, []byte("after")); err == nil {
				t.Fatal("a write after the attachment ended was answered")
			}
			b, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.HasPrefix(b, []byte("before")) || bytes.Contains(b, []byte("after")) {
				t.Errorf("the volume's file holds %q at 0 and after-writes: %v", b[:6], bytes.Contains(b, []byte("after")))
			}
			if _, ok := openStream(t, svc, a.ID); ok {
				t.Error("a new stream of the ended attachment was served")
			}
		})
	}
}

// A guest that opens the stream during an attach and then says the attach
// failed keeps nothing: the attachment ends, and so does its stream.
func TestFailedAttachClosesStream(t *testing.T) {
	dir := t.TempDir()
	svc := volumes.New(volumes.Config{Store: volumestest.New(), DataDir: dir, Mkfs: "true"})
	var gs *guestStream
	svc.SetGuests(oneGuest{hostileGuest{onAttach: func(id string) error {
		var ok bool
		if gs, ok = openStream(t, svc, id); !ok {
			t.Error("the attaching volume's stream was refused")
		}
		return errors.New("mount failed")
	}}})
	ctx := context.Background()
	v, err := svc.Create(ctx, owner, volumes.CreateSpec{SizeMiB: volumes.MinSizeMiB})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Attach(ctx, owner, v.ID, sandboxID, "/data"); err == nil {
		t.Fatal("the attach succeeded")
	}
	if gs == nil {
		t.Fatal("the guest opened no stream")
	}
	select {
	case <-gs.served:
	case <-time.After(time.Minute):
		t.Fatal("the stream of a failed attach is still served")
	}
	if err := gs.write(0, []byte("kept")); err == nil {
		t.Error("a write on the stream of a failed attach was answered")
	}
	if b, err := os.ReadFile(filepath.Join(dir, "volumes", v.ID, "disk.raw")); err != nil || bytes.Contains(b, []byte("kept")) {
		t.Errorf("the volume's file: err %v, holds the write: %v", err, err == nil)
	}
}
