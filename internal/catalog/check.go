package catalog

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
)

// What a create request may ask, checked before anything is stored.

var (
	nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._/-]{0,127}$`)
	tagRE  = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$`)
	uuidRE = regexp.MustCompile(`^[a-f0-9]{8}-[a-f0-9]{4}-[a-f0-9]{4}-[a-f0-9]{4}-[a-f0-9]{12}$`)
)

func invalidField(field, format string, args ...any) error {
	e := errdefs.New(errdefs.ErrInvalidArgument, "invalid_request", "%s: %s", field, fmt.Sprintf(format, args...))
	e.Details = map[string]any{"issues": []map[string]string{{"path": field, "message": fmt.Sprintf(format, args...)}}}
	return e
}

// checkCreate checks a create request before anything is stored: one
// source, names and tags, its inputs, its start and its build's limits, in
// that order (the first wrong field is the one reported).
func (s *Service) checkCreate(ctx context.Context, owner string, r *CreateRequest) error {
	n := 0
	for _, set := range []bool{r.Recipe != nil, r.Dockerfile != "", r.Reference != "", r.Archive != nil} {
		if set {
			n++
		}
	}
	if n != 1 {
		return invalidField("image", "give exactly one source: image, archive, dockerfile or recipe")
	}
	if err := checkNames(r); err != nil {
		return err
	}
	if err := s.checkInputs(owner, r); err != nil {
		return err
	}
	if err := checkStart(r.Start); err != nil {
		return err
	}
	return s.checkBuild(r.Build)
}

// checkNames checks the image's name and tags.
func checkNames(r *CreateRequest) error {
	if r.Name != "" && !nameRE.MatchString(r.Name) {
		return invalidField("name", "must be 1 to 128 characters of a-z 0-9 . _ - /, starting with a letter or digit")
	}
	if r.Name == DefaultName {
		return invalidField("name", `"default" is the server's own image`)
	}
	if len(r.Tags) > 16 {
		return invalidField("tags", "at most 16")
	}
	for _, t := range r.Tags {
		if !tagRE.MatchString(t) {
			return invalidField("tags", "%q is not a tag: 1 to 128 characters of A-Z a-z 0-9 _ . -", t)
		}
	}
	if len(r.Tags) > 0 && r.Name == "" {
		return invalidField("tags", "need a name")
	}
	return nil
}

// checkInputs checks what a build reads: a context or inline files (the
// chunks of a context or an archive owner uploaded), a recipe's files.
func (s *Service) checkInputs(owner string, r *CreateRequest) error {
	if r.Context != nil && r.Dockerfile == "" {
		return invalidField("context", "goes with a dockerfile")
	}
	if r.Context != nil && len(r.Files) > 0 {
		return invalidField("files", "give a context or inline files, not both")
	}
	if r.Context != nil {
		if err := s.chunks.check(owner, r.Context.Archive, contextBounds); err != nil {
			return err
		}
	}
	if r.Archive != nil {
		if err := s.chunks.check(owner, *r.Archive, imageBounds); err != nil {
			return err
		}
	}
	if err := checkFiles("files", r.Files); err != nil {
		return err
	}
	if r.Recipe != nil {
		if err := checkFiles("recipe.files", r.Recipe.Files); err != nil {
			return err
		}
	}
	return nil
}

// checkBuild bounds a build's limits by the server's.
func (s *Service) checkBuild(b BuildLimits) error {
	switch {
	case b.TimeoutSeconds < 0 || b.TimeoutSeconds > int(s.cfg.Limits.Timeout/time.Second):
		return invalidField("build.timeoutSeconds", "must be from 1 to %d", int(s.cfg.Limits.Timeout/time.Second))
	case b.MaxImageMiB < 0 || b.MaxImageMiB > s.cfg.Limits.MaxImageMiB:
		return invalidField("build.maxImageMiB", "must be from 1 to %d", s.cfg.Limits.MaxImageMiB)
	case b.DiskMiB < 0 || b.DiskMiB > s.cfg.Limits.DiskMiB:
		return invalidField("build.diskMiB", "must be from 1 to %d", s.cfg.Limits.DiskMiB)
	case b.MemoryMiB < 0 || b.MemoryMiB > s.cfg.Limits.MemoryMiB:
		return invalidField("build.memoryMiB", "must be from 1 to %d", s.cfg.Limits.MemoryMiB)
	case b.VCPU < 0 || b.VCPU > s.cfg.Limits.VCPU:
		return invalidField("build.vcpu", "must be from 1 to %d", s.cfg.Limits.VCPU)
	}
	return nil
}

func checkFiles(field string, files []File) error {
	if len(files) > 1000 {
		return invalidField(field, "at most 1000 files")
	}
	total := 0
	for i, f := range files {
		total += len(f.Content)
		p := filepath.ToSlash(f.Path)
		if p == "" || strings.ContainsRune(p, 0) || len(p) > 4096 {
			return invalidField(fmt.Sprintf("%s[%d].path", field, i), "must be a path")
		}
		if f.Encoding != "" && f.Encoding != "utf-8" && f.Encoding != "base64" {
			return invalidField(fmt.Sprintf("%s[%d].encoding", field, i), `must be "utf-8" or "base64"`)
		}
		if f.Mode != "" {
			if m, err := strconv.ParseUint(f.Mode, 8, 32); err != nil || m > 0o7777 {
				return invalidField(fmt.Sprintf("%s[%d].mode", field, i), "must be octal, at most 7777")
			}
		}
	}
	if total > 16<<20 {
		return invalidField(field, "at most 16 MiB in all; upload a context for more")
	}
	return nil
}

func checkStart(st *StartSpec) error {
	if st == nil {
		return nil
	}
	switch {
	case strings.TrimSpace(st.Command) == "" || len(st.Command) > 16<<10:
		return invalidField("start.command", "must be a command of at most 16 KiB")
	case st.ReadyPort < 0 || st.ReadyPort > 65535:
		return invalidField("start.readyPort", "must be a port, 1 to 65535")
	case st.ReadyPort != 0 && st.ReadyCommand != "":
		return invalidField("start.readyCommand", "give readyPort or readyCommand, not both")
	case len(st.ReadyCommand) > 16<<10:
		return invalidField("start.readyCommand", "must be at most 16 KiB")
	case st.ReadyTimeoutSeconds < 0 || st.ReadyTimeoutSeconds > 600:
		return invalidField("start.readyTimeoutSeconds", "must be from 1 to 600")
	}
	return nil
}
