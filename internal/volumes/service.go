package volumes

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// Bounds of volumes.
const (
	MinSizeMiB = 64
	MaxSizeMiB = 1 << 20 // 1 TiB, sparse
	// DefaultSizeMiB is the size of a create that gives none.
	DefaultSizeMiB = 1024
	// MaxPerOwner bounds the volumes (not deleted) one key keeps when no
	// admission ledger is configured (Config.Admission).
	MaxPerOwner = 100
	ModeRW      = "rw"
	// attachTimeout bounds an attach or detach in the guest.
	attachTimeout = 60 * time.Second
	// streamEndTimeout bounds the wait for an ended stream's last request
	// on the file (one request of at most nbd.MaxLength).
	streamEndTimeout = 10 * time.Second
)

// Guests finds a running sandbox's guest: sandbox.Manager.Guest.
type Guests interface {
	Guest(ctx context.Context, owner, id string) (*sandbox.Sandbox, guest.Handle, error)
}

// Config configures a Service.
type Config struct {
	Store   Store
	DataDir string // volumes live in DataDir/volumes/<id>/disk.raw
	Logger  *slog.Logger
	// Mkfs is the mkfs.ext4 binary; "" finds it on PATH.
	Mkfs string
	// Backups keeps backups; nil refuses them (volume_backups_unavailable).
	Backups BackupStore
	// Admission holds each volume's size from create to delete; nil
	// bounds only the count (MaxPerOwner). Call Recover at a start.
	Admission Admission
	// BackupQuota bounds each key's backups.
	BackupQuota BackupQuota
	// DiskFreeMiB reports the data dir's free space (admission.DiskFreeMiB);
	// nil skips the check. A backup or restore copies only if at least
	// DiskReserveMiB would be left after it.
	DiskFreeMiB    func() (int64, error)
	DiskReserveMiB int64
}

// Service manages volumes. It is the manager's sandbox.Volumes and a
// sandbox.Preparer (create-time volumes).
type Service struct {
	cfg    Config
	log    *slog.Logger
	guests Guests
	locks  sync.Map // volume id → *sync.Mutex (lock)
	// streams holds the one served stream per attachment: a new one (the
	// guest reconnected) ends the one before, and the attachment's end
	// (detach, release) ends it from the host's side.
	streamsMu sync.Mutex
	streams   map[string]*stream
}

// stream is an attachment's served NBD stream.
type stream struct {
	c    net.Conn
	done chan struct{} // closed once it no longer touches the volume's file
}

// New returns a Service. SetGuests must be called before attaches.
func New(cfg Config) *Service {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Mkfs == "" {
		cfg.Mkfs = "mkfs.ext4"
	}
	return &Service{cfg: cfg, log: log}
}

// SetGuests sets how the service reaches guests (the manager, made after it).
func (s *Service) SetGuests(g Guests) { s.guests = g }

var _ sandbox.Volumes = (*Service)(nil)

func newID(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s%012x%s", prefix, time.Now().UnixMilli(), hex.EncodeToString(b[:]))
}

func (s *Service) dir(id string) string { return filepath.Join(s.cfg.DataDir, "volumes", id) }

func (s *Service) file(id string) string { return filepath.Join(s.dir(id), "disk.raw") }

// CreateSpec is a new volume.
type CreateSpec struct {
	Name    string
	Labels  map[string]string
	SizeMiB int
	// FromBackup makes the volume a copy of that backup (its size).
	FromBackup string
}

// Create makes a volume: a sparse file formatted ext4, its root owned by
// the sandbox user (uid 1000).
func (s *Service) Create(ctx context.Context, owner string, spec CreateSpec) (*Volume, error) {
	if spec.SizeMiB == 0 {
		spec.SizeMiB = DefaultSizeMiB
	}
	if spec.FromBackup != "" {
		b, err := s.GetBackup(ctx, owner, spec.FromBackup)
		if err != nil {
			return nil, err
		}
		spec.SizeMiB = b.SizeMiB // admitted at the backup's size
	}
	if spec.SizeMiB < MinSizeMiB || spec.SizeMiB > MaxSizeMiB {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "invalid_request", "sizeMiB must be from %d to %d", MinSizeMiB, MaxSizeMiB)
	}
	now := time.Now().UTC()
	v := &Volume{ID: newID("vol_"), OwnerKeyID: owner, Name: spec.Name, Labels: spec.Labels, SizeMiB: spec.SizeMiB,
		State: StateReady, CreatedAt: now, UpdatedAt: now}
	if err := s.admit(ctx, v); err != nil {
		return nil, err
	}
	if err := s.make(ctx, owner, spec.FromBackup, v); err != nil {
		s.release(v.ID)
		return nil, err
	}
	return v, nil
}

// make fills v's file (formatted, or a copy of backup fromBackup) and
// records v; a failure leaves no file.
func (s *Service) make(ctx context.Context, owner, fromBackup string, v *Volume) error {
	if err := os.MkdirAll(s.dir(v.ID), 0o700); err != nil {
		return fmt.Errorf("volume directory: %w", err)
	}
	fill := s.format
	if fromBackup != "" {
		fill = func(ctx context.Context, v *Volume) error { return s.restore(ctx, owner, fromBackup, v) }
	}
	if err := fill(ctx, v); err != nil {
		_ = os.RemoveAll(s.dir(v.ID))
		return err
	}
	if err := s.cfg.Store.InsertVolume(ctx, v); err != nil {
		_ = os.RemoveAll(s.dir(v.ID))
		return err
	}
	return nil
}

// format makes the sparse file and an empty ext4 on it. The file is new,
// so the host tool reads nothing a guest wrote; being all zeros, its inode
// tables and journal need no writing (lazy_*_init; the guest mounts with
// noinit_itable).
func (s *Service) format(ctx context.Context, v *Volume) error {
	f, err := os.OpenFile(s.file(v.ID), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("volume file: %w", err)
	}
	err = f.Truncate(int64(v.SizeMiB) << 20)
	f.Close()
	if err != nil {
		return fmt.Errorf("volume file: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, s.cfg.Mkfs, "-F", "-q", "-m", "0", "-b", "4096",
		"-E", "root_owner=1000:1000,lazy_itable_init=1,lazy_journal_init=1,nodiscard", "-L", "volume", s.file(v.ID)).CombinedOutput()
	if err != nil {
		return fmt.Errorf("formatting volume: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Get returns owner's volume.
func (s *Service) Get(ctx context.Context, owner, id string) (*Volume, error) {
	v, err := s.cfg.Store.GetVolume(ctx, id)
	if err != nil {
		return nil, err
	}
	if v.OwnerKeyID != owner {
		return nil, errdefs.New(errdefs.ErrNotFound, "volume_not_found", "no volume %s", id)
	}
	return v, nil
}

// List returns a page of volumes.
func (s *Service) List(ctx context.Context, opts ListOptions) ([]*Volume, string, error) {
	return s.cfg.Store.ListVolumes(ctx, opts)
}

// Attachment returns owner's attachment of a volume.
func (s *Service) Attachment(ctx context.Context, owner, volumeID, id string) (*Attachment, error) {
	a, err := s.cfg.Store.GetAttachment(ctx, id)
	if err != nil {
		return nil, err
	}
	if a.OwnerKeyID != owner || a.VolumeID != volumeID {
		return nil, errdefs.New(errdefs.ErrNotFound, "attachment_not_found", "no attachment %s", id)
	}
	return a, nil
}

// Delete removes a volume no sandbox holds, and its file.
func (s *Service) Delete(ctx context.Context, owner, id string) (*Volume, error) {
	v, err := s.Get(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	if v.State == StateDeleted {
		return v, nil
	}
	defer s.lock(id)()
	v, err = s.cfg.Store.UpdateVolume(ctx, id, StateReady, v.SizeMiB, StateDeleted)
	if err != nil {
		return nil, err
	}
	s.release(id)
	if err := os.RemoveAll(s.dir(id)); err != nil {
		s.log.Warn("removing a deleted volume's file", "volume_id", id, "err", err)
	}
	return v, nil
}

// Resize grows a detached volume; the guest grows its filesystem at the
// next attach.
func (s *Service) Resize(ctx context.Context, owner, id string, sizeMiB int) (*Volume, error) {
	v, err := s.Get(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	if sizeMiB > MaxSizeMiB {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "invalid_request", "sizeMiB must be at most %d", MaxSizeMiB)
	}
	if sizeMiB < v.SizeMiB {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "invalid_request", "volumes only grow: sizeMiB must be at least %d", v.SizeMiB)
	}
	defer s.lock(id)()
	if v, err = s.Get(ctx, owner, id); err != nil {
		return nil, err
	}
	if v.State != StateReady {
		return nil, errdefs.New(errdefs.ErrConflict, "volume_attached", "volume %s is attached to sandbox %s; detach it to resize", id, v.SandboxID)
	}
	if err := s.regrow(v, sizeMiB); err != nil {
		return nil, err
	}
	if err := os.Truncate(s.file(id), int64(sizeMiB)<<20); err != nil {
		s.unregrow(v)
		return nil, fmt.Errorf("growing volume %s: %w", id, err)
	}
	grown, err := s.cfg.Store.UpdateVolume(ctx, id, StateReady, sizeMiB, StateReady)
	if err != nil {
		// The file is longer, but the record and the ledger keep the old
		// size: sparse, the tail holds nothing until the next grow.
		s.unregrow(v)
		return nil, err
	}
	return grown, nil
}

// Attach attaches owner's volume to owner's running sandbox at path.
func (s *Service) Attach(ctx context.Context, owner, id, sandboxID, path string) (*Attachment, error) {
	if why := checkPath(path); why != "" {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "invalid_request", "path: %s", why)
	}
	if s.guests == nil {
		return nil, errdefs.New(errdefs.ErrUnavailable, "volumes_unavailable", "volumes are not set up")
	}
	if _, err := s.Get(ctx, owner, id); err != nil {
		return nil, err
	}
	defer s.lock(id)()
	sb, g, err := s.guests.Guest(ctx, owner, sandboxID)
	if err != nil {
		return nil, err
	}
	if held, _ := s.cfg.Store.HeldAttachments(ctx, sb.ID); len(held) >= sandbox.MaxCreateVolumes*2 {
		return nil, errdefs.New(errdefs.ErrConflict, "quota_exceeded", "a sandbox holds at most %d volumes", sandbox.MaxCreateVolumes*2)
	}
	a := &Attachment{ID: newID("att_"), VolumeID: id, SandboxID: sb.ID, OwnerKeyID: owner, Path: path, Mode: ModeRW,
		State: AttachAttaching, CreatedAt: time.Now().UTC()}
	if err := s.cfg.Store.BeginAttach(ctx, a); err != nil {
		return nil, err
	}
	return s.attachIn(ctx, g, a)
}

// attachIn asks the guest to attach a recorded attachment; a failure ends
// it (the volume is free again).
func (s *Service) attachIn(ctx context.Context, g guest.Handle, a *Attachment) (*Attachment, error) {
	v, err := s.cfg.Store.GetVolume(ctx, a.VolumeID)
	if err != nil {
		return nil, err
	}
	vg, ok := g.Volumes, g.Volumes != nil
	if !ok {
		err = errdefs.New(errdefs.ErrUnavailable, "volumes_unavailable", "this sandbox's agent cannot attach volumes")
	} else {
		actx, cancel := context.WithTimeout(ctx, attachTimeout)
		err = vg.AttachVolume(actx, guest.VolumeRequest{AttachmentID: a.ID, Path: a.Path, SizeBytes: int64(v.SizeMiB) << 20})
		cancel()
	}
	if err != nil {
		if _, serr := s.cfg.Store.SetAttachment(context.Background(), a.ID, AttachDetached, errText(err)); serr != nil {
			s.log.Error("ending a failed attachment", "attachment_id", a.ID, "err", serr)
		}
		// A guest that opened the stream before it failed keeps no part
		// of a volume that is free again.
		s.endStream(context.Background(), a.ID)
		if errdefs.Code(err) == "unknown_method" {
			err = errdefs.New(errdefs.ErrUnavailable, "volumes_unavailable", "this sandbox's agent is older than volumes; restart the sandbox on a newer image")
		}
		return nil, fmt.Errorf("attaching volume %s: %w", a.VolumeID, err)
	}
	return s.cfg.Store.SetAttachment(ctx, a.ID, AttachAttached, "")
}

func errText(err error) string {
	t := err.Error()
	if len(t) > 1024 {
		t = t[:1024]
	}
	return t
}

// Detach unmounts and disconnects an attachment in its sandbox; a mount
// in use is refused (conflict volume_busy) and stays attached.
func (s *Service) Detach(ctx context.Context, owner, volumeID, attachmentID string) (*Attachment, error) {
	a, err := s.Attachment(ctx, owner, volumeID, attachmentID)
	if err != nil {
		return nil, err
	}
	if a.State == AttachDetached {
		return a, nil
	}
	defer s.lock(volumeID)()
	if s.guests == nil {
		return nil, errdefs.New(errdefs.ErrUnavailable, "volumes_unavailable", "volumes are not set up")
	}
	_, g, err := s.guests.Guest(ctx, owner, a.SandboxID)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return s.endAttachment(ctx, a.ID)
		}
		return nil, err
	}
	vg, ok := g.Volumes, g.Volumes != nil
	if !ok {
		return nil, errdefs.New(errdefs.ErrUnavailable, "volumes_unavailable", "this sandbox's agent cannot detach volumes")
	}
	dctx, cancel := context.WithTimeout(ctx, attachTimeout)
	err = vg.DetachVolume(dctx, a.ID)
	cancel()
	if err != nil {
		if errdefs.Code(err) == guest.CodeVolumeBusy {
			return nil, errdefs.New(errdefs.ErrConflict, "volume_busy", "%s", err.Error()).
				WithHint("stop what uses the mount (cd out of it, close its files), then detach again")
		}
		return nil, fmt.Errorf("detaching volume %s: %w", volumeID, err)
	}
	return s.endAttachment(ctx, a.ID)
}

// endAttachment records the attachment detached, then closes its stream
// from the host's side: the guest's word that it let go is not trusted (a
// root guest can keep the stream and go on reading and writing a volume
// that is being resized, backed up or attached elsewhere). The order
// matters: a stream that ServeVolume registers after the close finds the
// attachment detached.
func (s *Service) endAttachment(ctx context.Context, attachmentID string) (*Attachment, error) {
	a, err := s.cfg.Store.SetAttachment(ctx, attachmentID, AttachDetached, "")
	s.endStream(ctx, attachmentID)
	return a, err
}

// endStream closes the attachment's served stream, if any, and waits until
// it no longer touches the volume's file.
func (s *Service) endStream(ctx context.Context, attachmentID string) {
	s.streamsMu.Lock()
	st := s.streams[attachmentID]
	delete(s.streams, attachmentID)
	s.streamsMu.Unlock()
	if st == nil {
		return
	}
	_ = st.c.Close()
	t := time.NewTimer(streamEndTimeout)
	defer t.Stop()
	select {
	case <-st.done:
	case <-t.C:
		s.log.Error("a closed volume stream still serves", "attachment_id", attachmentID, "waited", streamEndTimeout)
	case <-ctx.Done():
	}
}

// Claim implements sandbox.Volumes: it records a create's attachments
// before the sandbox boots; Prepare attaches them.
func (s *Service) Claim(ctx context.Context, sb *sandbox.Sandbox, mounts []sandbox.VolumeMount) error {
	if len(mounts) > sandbox.MaxCreateVolumes {
		return errdefs.New(errdefs.ErrInvalidArgument, "invalid_request", "volumes: at most %d", sandbox.MaxCreateVolumes)
	}
	paths := map[string]bool{}
	for i, m := range mounts {
		if why := checkPath(m.Path); why != "" {
			return errdefs.New(errdefs.ErrInvalidArgument, "invalid_request", "volumes[%d].path: %s", i, why)
		}
		if paths[m.Path] {
			return errdefs.New(errdefs.ErrInvalidArgument, "invalid_request", "volumes[%d].path: given twice", i)
		}
		paths[m.Path] = true
		if m.Mode != "" && m.Mode != ModeRW {
			return errdefs.New(errdefs.ErrInvalidArgument, "invalid_request", `volumes[%d].mode: only "rw" is offered here`, i)
		}
	}
	for _, m := range mounts {
		a := &Attachment{ID: newID("att_"), VolumeID: m.VolumeID, SandboxID: sb.ID, OwnerKeyID: sb.OwnerKeyID,
			Path: m.Path, Mode: ModeRW, State: AttachAttaching, CreatedAt: time.Now().UTC()}
		if err := s.cfg.Store.BeginAttach(ctx, a); err != nil {
			s.Release(ctx, sb.ID)
			return err
		}
	}
	return nil
}

// Prepare attaches the volumes a create claimed (a sandbox.Preparer): the
// sandbox runs only once they are mounted.
func (s *Service) Prepare(ctx context.Context, sb *sandbox.Sandbox, g guest.Handle) error {
	held, err := s.cfg.Store.HeldAttachments(ctx, sb.ID)
	if err != nil {
		return err
	}
	for _, a := range held {
		if a.State != AttachAttaching {
			continue
		}
		if _, err := s.attachIn(ctx, g, a); err != nil {
			return err
		}
	}
	return nil
}

// Reattach implements sandbox.VolumeReattacher: a new VM of the sandbox (a
// switch of image) mounts every volume it holds at the same paths. A
// failure is returned and changes no attachment: the switch is undone and
// the old VM, resumed, still has them mounted.
func (s *Service) Reattach(ctx context.Context, sandboxID string, g guest.Handle) error {
	held, err := s.cfg.Store.HeldAttachments(ctx, sandboxID)
	if err != nil {
		return err
	}
	vg, ok := g.Volumes, g.Volumes != nil
	for _, a := range held {
		if a.State != AttachAttached {
			continue // attaching: Prepare attaches it; detaching: on its way out
		}
		if !ok {
			return errdefs.New(errdefs.ErrUnavailable, "volumes_unavailable", "this sandbox's agent cannot attach volumes")
		}
		v, err := s.cfg.Store.GetVolume(ctx, a.VolumeID)
		if err != nil {
			return err
		}
		actx, cancel := context.WithTimeout(ctx, attachTimeout)
		err = vg.AttachVolume(actx, guest.VolumeRequest{AttachmentID: a.ID, Path: a.Path, SizeBytes: int64(v.SizeMiB) << 20})
		cancel()
		if err != nil {
			return fmt.Errorf("attaching volume %s at %s: %w", a.VolumeID, a.Path, err)
		}
	}
	return nil
}

// Mounts implements sandbox.VolumeReattacher.
func (s *Service) Mounts(ctx context.Context, sandboxID string) ([]string, error) {
	held, err := s.cfg.Store.HeldAttachments(ctx, sandboxID)
	if err != nil {
		return nil, err
	}
	paths := make([]string, 0, len(held))
	for _, a := range held {
		paths = append(paths, a.Path)
	}
	return paths, nil
}

var _ sandbox.VolumeReattacher = (*Service)(nil)

// Release implements sandbox.Volumes: the sandbox's VM is gone, so its
// attachments end and its volumes are free.
func (s *Service) Release(ctx context.Context, sandboxID string) {
	held, err := s.cfg.Store.HeldAttachments(ctx, sandboxID)
	if err != nil {
		s.log.Error("listing a stopped sandbox's volumes", "sandbox_id", sandboxID, "err", err)
		return
	}
	for _, a := range held {
		if _, err := s.endAttachment(ctx, a.ID); err != nil {
			s.log.Error("releasing a volume", "sandbox_id", sandboxID, "attachment_id", a.ID, "err", err)
		}
	}
}

// Holds implements sandbox.Volumes.
func (s *Service) Holds(ctx context.Context, sandboxID string) bool {
	held, err := s.cfg.Store.HeldAttachments(ctx, sandboxID)
	return err != nil || len(held) > 0
}

// ServeVolume implements sandbox.Volumes: it serves the attachment's
// blocks if the store says sandboxID holds it.
func (s *Service) ServeVolume(ctx context.Context, sandboxID, attachmentID string, c net.Conn, br *bufio.Reader, accept func(error) error) {
	a, err := s.cfg.Store.GetAttachment(ctx, attachmentID)
	if err == nil && (a.SandboxID != sandboxID || a.State == AttachDetached) {
		err = errors.New("not held by this sandbox")
	}
	var v *Volume
	if err == nil {
		v, err = s.cfg.Store.GetVolume(ctx, a.VolumeID)
	}
	var f *os.File
	if err == nil {
		f, err = os.OpenFile(s.file(a.VolumeID), os.O_RDWR, 0)
	}
	if err != nil {
		s.log.Warn("refusing a volume stream", "sandbox_id", sandboxID, "attachment_id", attachmentID, "err", err)
		_ = accept(err)
		return
	}
	if err := accept(nil); err != nil {
		_ = f.Close()
		return
	}
	st := &stream{c: c, done: make(chan struct{})}
	defer close(st.done) // after f's close: deferred first, run last
	defer f.Close()
	if !s.register(ctx, attachmentID, st) {
		return
	}
	defer s.unregister(attachmentID, st)
	// The session's end closes c, which ends the loop.
	if err := serveNBD(br, c, f, int64(v.SizeMiB)<<20); err != nil && !errors.Is(err, net.ErrClosed) {
		s.log.Info("volume stream ended", "sandbox_id", sandboxID, "attachment_id", attachmentID, "err", err)
	}
	_ = datasync(f)
}

// register makes st the attachment's stream, ending the one before (the
// guest reconnected), and reports whether the attachment is still held:
// if it ended meanwhile (endAttachment records that before it closes the
// registered stream), st is closed at once.
func (s *Service) register(ctx context.Context, attachmentID string, st *stream) bool {
	s.streamsMu.Lock()
	if s.streams == nil {
		s.streams = map[string]*stream{}
	}
	if old := s.streams[attachmentID]; old != nil {
		_ = old.c.Close()
	}
	s.streams[attachmentID] = st
	s.streamsMu.Unlock()
	if a, err := s.cfg.Store.GetAttachment(ctx, attachmentID); err != nil || a.State == AttachDetached {
		s.unregister(attachmentID, st)
		_ = st.c.Close()
		return false
	}
	return true
}

func (s *Service) unregister(attachmentID string, st *stream) {
	s.streamsMu.Lock()
	if s.streams[attachmentID] == st {
		delete(s.streams, attachmentID)
	}
	s.streamsMu.Unlock()
}

// checkPath says why path cannot carry a volume, or "" (the agent checks
// again).
func checkPath(p string) string {
	switch {
	case p == "" || !strings.HasPrefix(p, "/"):
		return "must be absolute"
	case len(p) > 1024:
		return "too long"
	case filepath.Clean(p) != p:
		return "must be clean (no //, . or .. parts, no trailing /)"
	case p == "/":
		return "must not be /"
	}
	for _, f := range []string{"/proc", "/sys", "/dev", "/run", "/etc", "/bin", "/sbin", "/lib", "/lib64", "/usr", "/boot"} {
		if p == f || strings.HasPrefix(p, f+"/") {
			return "must not be " + f + " or under it"
		}
	}
	return ""
}

// Name implements sandbox.Preparer.
func (s *Service) Name() string { return "volumes" }

var _ sandbox.Preparer = (*Service)(nil)
