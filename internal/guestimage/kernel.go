package guestimage

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/emberbox/emberbox/internal/guestinit"
)

// kernelMeta is Debian's metapackage that always depends on the current
// cloud kernel (fewer drivers than the generic one, but all of virtio).
const kernelMeta = "linux-image-cloud-amd64"

// resolveKernel asks the host's apt index which kernel package the
// metapackage currently points at, and that package's version.
func resolveKernel(ctx context.Context) (kernelPackage, error) {
	out, err := runOutput(ctx, "apt-cache", "depends", kernelMeta)
	if err != nil {
		return kernelPackage{}, fmt.Errorf("resolving %s: %w", kernelMeta, err)
	}
	var k kernelPackage
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		dep, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "Depends: ")
		if ok && strings.HasPrefix(dep, "linux-image-") && !strings.HasPrefix(dep, "<") {
			k.Name = dep
			break
		}
	}
	if k.Name == "" {
		return kernelPackage{}, fmt.Errorf("resolving %s: no linux-image dependency in apt-cache output", kernelMeta)
	}
	k.Release = strings.TrimPrefix(k.Name, "linux-image-")
	out, err = runOutput(ctx, "apt-cache", "show", "--no-all-versions", k.Name)
	if err != nil {
		return kernelPackage{}, fmt.Errorf("resolving version of %s: %w", k.Name, err)
	}
	sc = bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Version: "); ok {
			k.Version = strings.TrimSpace(v)
			break
		}
	}
	if k.Version == "" {
		return kernelPackage{}, fmt.Errorf("resolving version of %s: no Version field", k.Name)
	}
	return k, nil
}

// fetchKernel downloads and unpacks the kernel package in work, copies the
// kernel to outDir/vmlinuz and the boot modules, uncompressed, to
// outDir/modules together with their load order. It returns that order.
func fetchKernel(ctx context.Context, k kernelPackage, work, outDir string, logw *os.File) ([]string, error) {
	if err := os.MkdirAll(work, 0o755); err != nil {
		return nil, err
	}
	// The download runs as root without apt's _apt sandbox user, which
	// could not write into our cache directory.
	if err := runLogged(ctx, logw, work, "apt-get", "download", "-o", "APT::Sandbox::User=root",
		k.Name+"="+k.Version); err != nil {
		return nil, fmt.Errorf("downloading %s: %w", k.Name, err)
	}
	debs, _ := filepath.Glob(filepath.Join(work, k.Name+"_*.deb"))
	if len(debs) != 1 {
		return nil, fmt.Errorf("downloading %s: expected one .deb, found %d", k.Name, len(debs))
	}
	root := filepath.Join(work, "root")
	if err := runLogged(ctx, logw, work, "dpkg-deb", "-x", debs[0], root); err != nil {
		return nil, fmt.Errorf("unpacking %s: %w", debs[0], err)
	}
	if err := copyFile(filepath.Join(root, "boot", "vmlinuz-"+k.Release), filepath.Join(outDir, "vmlinuz"), 0o644); err != nil {
		return nil, fmt.Errorf("copying kernel: %w", err)
	}

	modDir := filepath.Join(root, "lib", "modules", k.Release)
	if _, err := os.Stat(modDir); err != nil {
		modDir = filepath.Join(root, "usr", "lib", "modules", k.Release) // merged-/usr packages
	}
	order, err := bootModules(ctx, modDir, filepath.Join(outDir, "modules"))
	if err != nil {
		return nil, err
	}
	return order, nil
}

// bootModules resolves wantedModules in modDir and writes them, uncompressed,
// to outDir as <name>.ko plus the load-order file the initramfs reads.
func bootModules(ctx context.Context, modDir, outDir string) ([]string, error) {
	var idx moduleIndex
	if f, err := os.Open(filepath.Join(modDir, "modules.dep")); err == nil {
		idx, err = parseModulesDep(f)
		f.Close()
		if err != nil {
			return nil, err
		}
	} else {
		idx, err = indexFromModinfo(ctx, modDir)
		if err != nil {
			return nil, err
		}
	}
	builtin := map[string]bool{}
	if f, err := os.Open(filepath.Join(modDir, "modules.builtin")); err == nil {
		builtin, err = parseModulesBuiltin(f)
		f.Close()
		if err != nil {
			return nil, err
		}
	}
	order, missing, err := loadOrder(idx, builtin, wantedModules)
	if err != nil {
		return nil, fmt.Errorf("resolving boot modules: %w", err)
	}
	for _, m := range missing {
		// Optional extras (vsock, rng) may be absent from some kernels.
		if essentialModules[m] {
			return nil, fmt.Errorf("resolving boot modules: kernel has no %s module", m)
		}
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return nil, err
	}
	var list strings.Builder
	for _, name := range order {
		data, err := readModule(ctx, filepath.Join(modDir, idx[name].Path))
		if err != nil {
			return nil, fmt.Errorf("reading module %s: %w", name, err)
		}
		if err := os.WriteFile(filepath.Join(outDir, name+".ko"), data, 0o644); err != nil {
			return nil, err
		}
		fmt.Fprintf(&list, "%s.ko\n", name)
	}
	if err := os.WriteFile(filepath.Join(outDir, loadOrderName), []byte(list.String()), 0o644); err != nil {
		return nil, err
	}
	return order, nil
}

// loadOrderName is the load-order file inside Image.ModulesDir; it lists
// module file names, dependencies first, as the initramfs loads them.
var loadOrderName = filepath.Base(guestinit.LoadOrderFile)
