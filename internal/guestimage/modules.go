package guestimage

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"debug/elf"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// moduleName turns a module file name or path ("kernel/drivers/char/hw_random/virtio-rng.ko.xz")
// into the name the kernel uses ("virtio_rng").
func moduleName(path string) string {
	base := filepath.Base(path)
	if i := strings.Index(base, ".ko"); i >= 0 {
		base = base[:i]
	}
	return strings.ReplaceAll(base, "-", "_")
}

// moduleIndex maps a module name to its path (relative to the modules
// directory) and the names of the modules it depends on.
type moduleIndex map[string]moduleEntry

type moduleEntry struct {
	Path string
	Deps []string
}

// parseModulesDep reads depmod's modules.dep ("path: dep-path dep-path ...").
func parseModulesDep(r io.Reader) (moduleIndex, error) {
	idx := make(moduleIndex)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		path, rest, ok := strings.Cut(line, ":")
		if !ok {
			return nil, fmt.Errorf("modules.dep line %d: missing colon", n)
		}
		e := moduleEntry{Path: strings.TrimSpace(path)}
		for _, d := range strings.Fields(rest) {
			e.Deps = append(e.Deps, moduleName(d))
		}
		idx[moduleName(e.Path)] = e
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading modules.dep: %w", err)
	}
	return idx, nil
}

// parseModulesBuiltin reads modules.builtin: one path per built-in module.
func parseModulesBuiltin(r io.Reader) (map[string]bool, error) {
	builtin := make(map[string]bool)
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); line != "" {
			builtin[moduleName(line)] = true
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading modules.builtin: %w", err)
	}
	return builtin, nil
}

// indexFromModinfo builds a moduleIndex from the .modinfo "depends=" field of
// every module under dir. Debian's linux-image packages do not ship
// modules.dep (depmod creates it in postinst), and the host may lack kmod.
func indexFromModinfo(ctx context.Context, dir string) (moduleIndex, error) {
	idx := make(moduleIndex)
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || !strings.Contains(d.Name(), ".ko") {
			return nil
		}
		data, err := readModule(ctx, path)
		if err != nil {
			return err
		}
		deps, err := modinfoDepends(data)
		if err != nil {
			return fmt.Errorf("reading modinfo of %s: %w", path, err)
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		idx[moduleName(rel)] = moduleEntry{Path: rel, Deps: deps}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("indexing modules in %s: %w", dir, err)
	}
	return idx, nil
}

// modinfoDepends returns the "depends=" list from a module's .modinfo section.
func modinfoDepends(ko []byte) ([]string, error) {
	f, err := elf.NewFile(bytes.NewReader(ko))
	if err != nil {
		return nil, err
	}
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, nil
	}
	data, err := sec.Data()
	if err != nil {
		return nil, err
	}
	for _, kv := range bytes.Split(data, []byte{0}) {
		v, ok := bytes.CutPrefix(kv, []byte("depends="))
		if !ok {
			continue
		}
		var deps []string
		for _, d := range strings.Split(string(v), ",") {
			if d = strings.TrimSpace(d); d != "" {
				deps = append(deps, moduleName(d))
			}
		}
		return deps, nil
	}
	return nil, nil
}

// loadOrder returns the modules to load for wanted, dependencies first, each
// once. Built-in modules are left out; wanted modules the kernel does not have
// at all are returned in missing. A missing dependency is an error.
func loadOrder(idx moduleIndex, builtin map[string]bool, wanted []string) (order, missing []string, err error) {
	const (
		visiting = 1
		done     = 2
	)
	state := make(map[string]int)
	var visit func(name string, chain []string) error
	visit = func(name string, chain []string) error {
		switch state[name] {
		case done:
			return nil
		case visiting:
			return fmt.Errorf("module dependency cycle: %s -> %s", strings.Join(chain, " -> "), name)
		}
		if builtin[name] {
			state[name] = done
			return nil
		}
		e, ok := idx[name]
		if !ok {
			return fmt.Errorf("module %s (needed by %s) not found", name, strings.Join(chain, " -> "))
		}
		state[name] = visiting
		for _, d := range e.Deps {
			if err := visit(d, append(chain, name)); err != nil {
				return err
			}
		}
		state[name] = done
		order = append(order, name)
		return nil
	}
	for _, w := range wanted {
		w = moduleName(w)
		if _, ok := idx[w]; !ok && !builtin[w] {
			missing = append(missing, w)
			continue
		}
		if err := visit(w, nil); err != nil {
			return nil, nil, err
		}
	}
	return order, missing, nil
}

// readModule returns the uncompressed bytes of a .ko, .ko.gz, .ko.xz or
// .ko.zst file, so the guest can hand them straight to finit_module.
func readModule(ctx context.Context, path string) ([]byte, error) {
	switch {
	case strings.HasSuffix(path, ".ko"):
		return os.ReadFile(path)
	case strings.HasSuffix(path, ".ko.gz"):
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		zr, err := gzip.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("decompressing %s: %w", path, err)
		}
		return io.ReadAll(zr)
	case strings.HasSuffix(path, ".ko.xz"):
		return decompressWith(ctx, path, "xz")
	case strings.HasSuffix(path, ".ko.zst"):
		return decompressWith(ctx, path, "zstd")
	}
	return nil, fmt.Errorf("unknown module file type: %s", path)
}

func decompressWith(ctx context.Context, path, tool string) ([]byte, error) {
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, tool, "-dc", path)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("decompressing %s with %s: %w: %s", path, tool, err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}
