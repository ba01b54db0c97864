package catalog

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// ImportRequest registers a raw ext4 disk image file from the host as a
// ready image: the operator's way to add an image built elsewhere
// (`emberbox images import`).
type ImportRequest struct {
	File   string // copied (sparse) into the blob store; the file stays
	Owner  string // an API key id, or "" with Public
	Public bool
	Name   string
	Tags   []string // default ["latest"]
	Env    map[string]string
	Workdir,
	User string
	Start *StartSpec
}

// Import registers req.File as a ready image. Its digest is the sha256 of
// its bytes, so importing one file twice shares one blob.
func (s *Service) Import(ctx context.Context, req ImportRequest) (*Image, error) {
	if req.Owner == "" && !req.Public {
		req.Owner = SystemOwner
		req.Public = true
	}
	cr := CreateRequest{Name: req.Name, Tags: req.Tags, Source: Source{Reference: "file:" + filepath.Base(req.File), Start: req.Start}}
	if err := s.checkCreate(ctx, req.Owner, &cr); err != nil {
		return nil, err
	}
	fi, err := os.Stat(req.File)
	if err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("import: %s is not a regular file", req.File)
	}
	id := newID()
	work := filepath.Join(s.workRoot(), "import-"+id)
	if err := os.MkdirAll(work, 0o755); err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	dst := filepath.Join(work, "rootfs.img")
	// cp keeps the holes of a sparse disk (a fresh ext4 image is mostly
	// holes); a plain copy would allocate all of it.
	if out, err := exec.CommandContext(ctx, "cp", "--sparse=always", req.File, dst).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("import: copying %s: %v: %s", req.File, err, out)
	}
	digest, err := fileDigest(dst)
	if err != nil {
		return nil, err
	}
	cr.Source.Tags = cr.Tags
	raw, _ := json.Marshal(cr.Source)
	now := s.now()
	img := &Image{ID: id, Owner: req.Owner, Name: req.Name, State: StateBuilding, Kind: SourceArchive, Source: raw,
		Public: req.Public, CreatedAt: now}
	if err := s.st.CreateImage(ctx, img); err != nil {
		return nil, err
	}
	// The log names the file, not its host directory.
	s.logLines(ctx, id, []LogLine{{At: now, Stream: "build",
		Text: fmt.Sprintf("imported by the operator from %s (%s)", filepath.Base(req.File), digest)}})
	res := Result{RootfsPath: dst, Digest: digest, Env: req.Env, Workdir: req.Workdir, User: req.User}
	if err := s.finish(ctx, img, work, res, now); err != nil {
		s.fail(ctx, img, err.Error(), nil)
		return nil, err
	}
	return s.st.GetImage(ctx, id)
}

// Publish makes an image visible to every key (or, with public false,
// only to its owner again).
func (s *Service) Publish(ctx context.Context, id string, public bool) (*Image, error) {
	img, err := s.st.GetImage(ctx, id)
	if err != nil {
		return nil, err
	}
	img.Public = public
	if err := s.st.UpdateImage(ctx, img); err != nil {
		return nil, err
	}
	return img, nil
}
