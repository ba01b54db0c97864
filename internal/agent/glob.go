package agent

import (
	"fmt"
	"os"
	"path"
	"sort"
	"strings"

	"github.com/emberbox/emberbox/internal/agentproto"
)

// Bounds of a glob: the pattern's shape, and the walk it may cause.
const (
	maxGlobSegments = 64
	maxGlobStars    = 4 // "**" segments; matching is polynomial in their number
	maxGlobDepth    = 32
	maxGlobVisits   = 200_000
)

// compileGlob splits a pattern into segments, folding repeated "**", and
// checks each with path.Match so a bad pattern is refused before the walk.
func compileGlob(pattern string) ([]string, error) {
	if pattern == "" || len(pattern) > agentproto.MaxGlobLen {
		return nil, invalid(fmt.Sprintf("glob must be 1 to %d bytes", agentproto.MaxGlobLen))
	}
	if strings.HasPrefix(pattern, "/") {
		return nil, invalid("glob must be relative to the path it searches")
	}
	var segs []string
	stars := 0
	for _, s := range strings.Split(pattern, "/") {
		switch {
		case s == "" || s == ".":
			continue
		case s == "..":
			return nil, invalid("glob must not contain ..")
		case s == "**":
			if len(segs) > 0 && segs[len(segs)-1] == "**" {
				continue
			}
			stars++
		default:
			if _, err := path.Match(s, ""); err != nil {
				return nil, invalid(fmt.Sprintf("glob segment %q: %v", s, err))
			}
		}
		segs = append(segs, s)
	}
	switch {
	case len(segs) == 0:
		return nil, invalid("glob matches nothing but its root")
	case len(segs) > maxGlobSegments:
		return nil, invalid(fmt.Sprintf("glob has more than %d segments", maxGlobSegments))
	case stars > maxGlobStars:
		return nil, invalid(fmt.Sprintf(`glob has more than %d "**"`, maxGlobStars))
	}
	return segs, nil
}

// globMatch reports whether the segments of a relative path match pat.
// With prefix, it reports whether something below the path could match.
func globMatch(pat, name []string, prefix bool) bool {
	for len(pat) > 0 {
		if pat[0] == "**" {
			if prefix {
				return true // it matches any depth below
			}
			for i := 0; i <= len(name); i++ {
				if globMatch(pat[1:], name[i:], prefix) {
					return true
				}
			}
			return false
		}
		if len(name) == 0 {
			return prefix
		}
		if ok, _ := path.Match(pat[0], name[0]); !ok {
			return false
		}
		pat, name = pat[1:], name[1:]
	}
	return len(name) == 0 && !prefix
}

// glob lists what under root matches pattern, sorted by path. Symlinks are
// matched but never followed; dotfiles are left out unless hidden or named
// by a segment that starts with a dot. The walk descends only where a match
// is still possible and visits at most maxGlobVisits entries.
func (a *Agent) glob(acct *account, root, pattern string, hidden bool, limit int) ([]agentproto.FileEntry, error) {
	pat, err := compileGlob(pattern)
	if err != nil {
		return nil, err
	}
	limit = agentproto.ListLimit(limit)
	var out []agentproto.FileEntry
	err = a.asUser(acct, func() error {
		fi, err := os.Stat(root)
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			return &agentproto.Error{Code: agentproto.CodeNotADirectory, Message: root + ": not a directory"}
		}
		visits, dots := 0, dotNamed(pat)
		var walk func(dir string, rel []string) error
		walk = func(dir string, rel []string) error {
			des, err := os.ReadDir(dir)
			if err != nil {
				if len(rel) > 0 {
					return nil // an unreadable subdirectory is skipped
				}
				return err
			}
			for _, de := range des {
				if len(out) >= limit {
					return nil
				}
				if visits++; visits > maxGlobVisits {
					return &agentproto.Error{Code: agentproto.CodeTooLarge,
						Message: fmt.Sprintf("glob visited more than %d entries; search a smaller directory", maxGlobVisits)}
				}
				name := de.Name()
				if !hidden && strings.HasPrefix(name, ".") && !dots {
					continue
				}
				child := path.Join(dir, name)
				segs := append(rel[:len(rel):len(rel)], name)
				if globMatch(pat, segs, false) {
					if info, err := de.Info(); err == nil {
						out = append(out, a.entry(child, info))
					}
				}
				if de.IsDir() && len(segs) < maxGlobDepth && globMatch(pat, segs, true) {
					if err := walk(child, segs); err != nil {
						return err
					}
				}
			}
			return nil
		}
		return walk(root, nil)
	})
	if err != nil {
		return nil, fileError(root, err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

// dotNamed reports whether the pattern asks for dotfiles: one of its
// segments starts with a dot, as a shell's glob requires.
func dotNamed(pat []string) bool {
	for _, s := range pat {
		if strings.HasPrefix(s, ".") {
			return true
		}
	}
	return false
}
