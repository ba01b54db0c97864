package envd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"path"
	"strconv"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/emberbox/emberbox/internal/envd/proto/filesystem"
	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/sandbox"
)

const (
	// maxListDepth is the deepest ListDir the guest walks.
	maxListDepth = 10
	// maxListEntries is the most entries one ListDir answers (the guest's
	// own bound).
	maxListEntries = 10000
	maxPathLen     = 4096
)

// Entry types as the guest names them.
const (
	typeFile      = "file"
	typeDirectory = "directory"
	typeSymlink   = "symlink"
)

// filesystemService is E2B's filesystem.Filesystem over the guest's file
// calls, which act as the sandbox's user.
type filesystemService struct{ s *Server }

func (f *filesystemService) Stat(ctx context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	ctx, rt, p, err := pathTarget(ctx, req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	e, err := rt.Guest.Stat(ctx, p)
	if err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: entryInfo(e)}), nil
}

// MakeDir creates a directory and its parents; one that exists is
// AlreadyExists, as with envd (the SDK's make_dir answers false).
func (f *filesystemService) MakeDir(ctx context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	ctx, rt, p, err := pathTarget(ctx, req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if e, err := rt.Guest.Stat(ctx, p); err == nil {
		if e.Type == typeDirectory {
			return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory %s already exists", p))
		}
		return nil, invalidArg(fmt.Sprintf("path %s already exists and is not a directory", p))
	} else if !errdefs.IsNotFound(err) {
		return nil, rpcError(err)
	}
	e, err := rt.Guest.Mkdir(ctx, p, true)
	if err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&filesystem.MakeDirResponse{Entry: entryInfo(e)}), nil
}

// Move renames, replacing a destination file as rename(2) does.
func (f *filesystemService) Move(ctx context.Context, req *connect.Request[filesystem.MoveRequest]) (*connect.Response[filesystem.MoveResponse], error) {
	ctx, rt, src, err := pathTarget(ctx, req.Header(), req.Msg.GetSource())
	if err != nil {
		return nil, err
	}
	dst, err := checkPath(req.Msg.GetDestination())
	if err != nil {
		return nil, err
	}
	user, _ := userFrom(req.Header()) // checked by pathTarget
	dst = inHome(rt, user, dst)
	e, err := rt.Guest.Rename(ctx, src, dst, true)
	if err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&filesystem.MoveResponse{Entry: entryInfo(e)}), nil
}

func (f *filesystemService) ListDir(ctx context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	ctx, rt, p, err := pathTarget(ctx, req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	depth := int(min(max(req.Msg.GetDepth(), 1), maxListDepth))
	list, err := rt.Guest.List(ctx, guest.FileRequest{Path: p, Depth: depth, Hidden: true, Limit: maxListEntries})
	if err != nil {
		return nil, rpcError(err)
	}
	out := &filesystem.ListDirResponse{Entries: make([]*filesystem.EntryInfo, 0, len(list))}
	for i := range list {
		out.Entries = append(out.Entries, entryInfo(&list[i]))
	}
	return connect.NewResponse(out), nil
}

// Remove removes a file or a directory with all it holds.
func (f *filesystemService) Remove(ctx context.Context, req *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
	ctx, rt, p, err := pathTarget(ctx, req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if _, err := rt.Guest.Remove(ctx, p, true); err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&filesystem.RemoveResponse{}), nil
}

// pathTarget returns the routed sandbox, a checked path, and ctx under
// which the guest's file calls act as the request's user.
func pathTarget(ctx context.Context, h http.Header, p string) (context.Context, sandbox.Routed, string, error) {
	rt, err := target(ctx)
	if err != nil {
		return ctx, rt, "", err
	}
	user, err := userFrom(h)
	if err != nil {
		return ctx, rt, "", err
	}
	p, err = checkPath(p)
	return guest.WithFileUser(ctx, user), rt, inHome(rt, user, p), err
}

// checkPath refuses what no guest path can be; the guest resolves the
// rest (a relative path against the user's home).
func checkPath(p string) (string, error) {
	switch {
	case p == "":
		return "", invalidArg("path is required")
	case len(p) > maxPathLen:
		return "", invalidArg(fmt.Sprintf("path is longer than %d bytes", maxPathLen))
	case strings.ContainsRune(p, 0):
		return "", invalidArg("path contains a NUL byte")
	}
	return p, nil
}

// entryInfo is a guest's file entry as envd describes one: mode holds the
// permission bits, permissions Go's rendering of the whole mode.
func entryInfo(e *guest.FileEntry) *filesystem.EntryInfo {
	perm, _ := strconv.ParseUint(e.Mode, 8, 32)
	mode := fs.FileMode(perm & 0o777)
	if perm&0o4000 != 0 {
		mode |= fs.ModeSetuid
	}
	if perm&0o2000 != 0 {
		mode |= fs.ModeSetgid
	}
	if perm&0o1000 != 0 {
		mode |= fs.ModeSticky
	}
	info := &filesystem.EntryInfo{
		Name:         e.Name,
		Path:         e.Path,
		Size:         e.Size,
		Owner:        e.Owner,
		Group:        e.Group,
		ModifiedTime: timestamppb.New(e.ModifiedAt),
	}
	if info.Owner == "" {
		info.Owner = strconv.Itoa(e.UID)
	}
	if info.Group == "" {
		info.Group = strconv.Itoa(e.GID)
	}
	switch e.Type {
	case typeFile:
		info.Type = filesystem.FileType_FILE_TYPE_FILE
	case typeDirectory:
		info.Type = filesystem.FileType_FILE_TYPE_DIRECTORY
		mode |= fs.ModeDir
	case typeSymlink:
		info.Type = filesystem.FileType_FILE_TYPE_SYMLINK
		info.IsSymlink = true
		mode |= fs.ModeSymlink
		target := e.SymlinkTarget
		info.SymlinkTarget = &target
	}
	info.Mode = uint32(mode.Perm())
	info.Permissions = mode.String()
	return info
}

// relName is an event's path relative to the watched directory, as envd
// names it.
func relName(root, p string) string {
	root = path.Clean(root)
	if rel, ok := strings.CutPrefix(path.Clean(p), root+"/"); ok {
		return rel
	}
	if root == "/" {
		return strings.TrimPrefix(p, "/")
	}
	return path.Base(p)
}

var errWatchEnded = errors.New("the watch ended")
