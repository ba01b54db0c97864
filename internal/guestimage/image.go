package guestimage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/emberbox/emberbox/internal/errdefs"
)

// Config says where images live and how to report progress.
type Config struct {
	CacheDir string       // default: $XDG_CACHE_HOME/emberbox or ~/.cache/emberbox; images go in CacheDir/images/<recipe-hash>/
	Progress io.Writer    // human progress display; may be nil
	Logger   *slog.Logger // may be nil
}

// Image is a built guest image. All paths are absolute.
type Image struct {
	Dir    string
	Kernel string // vmlinuz
	Rootfs string // raw ext4, the read-only base for per-sandbox overlays
	// Layer is the computer-use layer (layer.go): raw ext4, attached
	// read-only to every VM, the same file for all; "" for an image built
	// before there was one.
	Layer         string
	ModulesDir    string // the initramfs modules and their load-order file
	KernelVersion string // uname -r of Kernel, e.g. 6.1.0-28-cloud-amd64
	RecipeHash    string
}

// manifest is written last into a build directory; an image directory
// without it is not an image.
type manifest struct {
	Format        string    `json:"format"`
	RecipeHash    string    `json:"recipeHash"`
	KernelPackage string    `json:"kernelPackage"`
	KernelVersion string    `json:"kernelVersion"`
	KernelRelease string    `json:"kernelRelease"`
	Modules       []string  `json:"modules"` // load order
	RootfsBytes   int64     `json:"rootfsBytes"`
	BuiltAt       time.Time `json:"builtAt"`
	BuildSeconds  float64   `json:"buildSeconds"`
}

const (
	manifestName = "manifest.json"
	kernelName   = "vmlinuz"
	rootfsName   = "rootfs.img"
	modulesName  = "modules"
	currentLink  = "current" // in CacheDir/images: the newest built image
)

func (c Config) imagesDir() (string, error) {
	dir := c.CacheDir
	if dir == "" {
		base := os.Getenv("XDG_CACHE_HOME")
		if base == "" {
			home, err := os.UserHomeDir()
			if err != nil {
				return "", fmt.Errorf("finding cache directory: %w", err)
			}
			base = filepath.Join(home, ".cache")
		}
		dir = filepath.Join(base, "emberbox")
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "images"), nil
}

func (c Config) logger() *slog.Logger {
	if c.Logger != nil {
		return c.Logger
	}
	return slog.New(slog.DiscardHandler)
}

// Lookup returns the image for the current recipe if it is built. If the
// recipe changed (a new Debian kernel in the apt index, say) and the new
// image is not built yet, or the kernel cannot be resolved at all (the
// host's apt lists were cleaned), it returns the newest built image
// instead, so sandboxes keep starting. Otherwise the error wraps
// errdefs.ErrNotFound.
func Lookup(cfg Config) (*Image, error) {
	dir, err := cfg.imagesDir()
	if err != nil {
		return nil, err
	}
	k, kerr := resolveKernel(context.Background())
	if kerr == nil {
		if img, err := load(filepath.Join(dir, recipeHash(k))); err == nil {
			return img, nil
		}
	}
	if img, err := newest(dir); err == nil {
		cfg.logger().Warn("using the newest built guest image, not the current recipe's",
			"recipe_hash", img.RecipeHash, "resolve_error", kerr)
		return img, nil
	}
	if kerr != nil {
		return nil, fmt.Errorf("no guest image in %s (%v): %w", dir, kerr, errdefs.ErrNotFound)
	}
	return nil, fmt.Errorf("no guest image %s in %s: %w", recipeHash(k), dir, errdefs.ErrNotFound)
}

// newest returns the image the "current" link points at: the last one built.
func newest(dir string) (*Image, error) {
	target, err := os.Readlink(filepath.Join(dir, currentLink))
	if err != nil {
		return nil, fmt.Errorf("no guest image in %s: %w", dir, errdefs.ErrNotFound)
	}
	return load(filepath.Join(dir, filepath.Base(target)))
}

// load reads the image in dir, checking that it is complete.
func load(dir string) (*Image, error) {
	data, err := os.ReadFile(filepath.Join(dir, manifestName))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("no image in %s: %w", dir, errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("reading image manifest: %w", err)
	}
	var m manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("reading image manifest in %s: %w", dir, err)
	}
	if m.Format != formatVersion {
		return nil, fmt.Errorf("image in %s has format %q, want %q: %w", dir, m.Format, formatVersion, errdefs.ErrNotFound)
	}
	img := &Image{
		Dir:           dir,
		Kernel:        filepath.Join(dir, kernelName),
		Rootfs:        filepath.Join(dir, rootfsName),
		Layer:         filepath.Join(dir, layerName),
		ModulesDir:    filepath.Join(dir, modulesName),
		KernelVersion: m.KernelRelease,
		RecipeHash:    m.RecipeHash,
	}
	for _, p := range []string{img.Kernel, img.Rootfs, filepath.Join(img.ModulesDir, loadOrderName)} {
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("image in %s is incomplete: %w", dir, err)
		}
	}
	if _, err := os.Stat(img.Layer); err != nil {
		// An image built before the layer still boots, without it.
		img.Layer = ""
	}
	return img, nil
}

// Ensure returns the image for the current recipe, building it first if
// needed. Concurrent callers, in this or other processes, wait for one
// build. A build happens in a temporary directory that is renamed into
// place only when complete, so a crash never leaves an image Lookup accepts.
func Ensure(ctx context.Context, cfg Config) (*Image, error) {
	dir, err := cfg.imagesDir()
	if err != nil {
		return nil, err
	}
	k, err := resolveKernel(ctx)
	if err != nil {
		// Hosts that clean their apt lists (container images do) cannot
		// resolve the kernel; an image built earlier still boots.
		if img, lerr := newest(dir); lerr == nil {
			cfg.logger().Warn("cannot resolve the current kernel; using the newest built guest image",
				"recipe_hash", img.RecipeHash, "error", err)
			return img, nil
		}
		return nil, fmt.Errorf("%w (is the apt index present? try apt-get update)", err)
	}
	hash := recipeHash(k)
	final := filepath.Join(dir, hash)
	if img, err := load(final); err == nil {
		return img, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating image cache: %w", err)
	}
	unlock, err := lockFile(ctx, filepath.Join(dir, hash+".lock"), cfg)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if img, err := load(final); err == nil {
		return img, nil // built by another process while we waited
	}
	img, err := build(ctx, cfg, dir, k)
	if err != nil {
		return nil, fmt.Errorf("building guest image %s: %w", hash[:12], err)
	}
	return img, nil
}

// lockFile takes an exclusive flock on path, polling so ctx can cancel the
// wait. The lock dies with the process, so a crashed build never wedges it.
func lockFile(ctx context.Context, path string, cfg Config) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening lock: %w", err)
	}
	logged := false
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { _ = unix.Flock(int(f.Fd()), unix.LOCK_UN); f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		if !logged {
			logged = true
			cfg.logger().Info("waiting for another process building the guest image", "lock", path)
			if cfg.Progress != nil {
				fmt.Fprintf(cfg.Progress, "waiting for another build of the guest image (%s)\n", path)
			}
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func build(ctx context.Context, cfg Config, dir string, k kernelPackage) (*Image, error) {
	start := time.Now()
	hash := recipeHash(k)
	log := cfg.logger().With("recipe_hash", hash[:12], "kernel", k.Release)
	log.Info("building guest image")

	tmp, err := newBuildDir(dir, hash)
	if tmp != "" {
		defer os.RemoveAll(tmp) // after a successful rename there is nothing left here
	}
	if err != nil {
		return nil, err
	}

	// The log lives outside the build directory so it survives a failure.
	logPath := filepath.Join(dir, "build-"+hash[:12]+".log")
	logw, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logw.Close()
	p := &progress{w: cfg.Progress, total: 5}

	var order []string
	err = p.step("kernel "+k.Release+" (apt-get download)", func() error {
		order, err = fetchKernel(ctx, k, filepath.Join(tmp, "kernel-pkg"), tmp, logw)
		if err == nil {
			err = os.RemoveAll(filepath.Join(tmp, "kernel-pkg"))
		}
		return err
	})
	if err != nil {
		return nil, withLog(err, logPath)
	}
	log.Info("kernel modules resolved", "load_order", order)

	rootDir := filepath.Join(tmp, "rootfs")
	if err := p.step("rootfs (mmdebstrap)", func() error { return buildTree(ctx, rootDir, packages, customizeScript, logw) }); err != nil {
		return nil, withLog(err, logPath)
	}
	var size int64
	err = p.step("ext4 image (mkfs.ext4)", func() error {
		size, err = makeExt4(ctx, rootDir, filepath.Join(tmp, rootfsName), rootfsLabel, logw)
		return err
	})
	if err == nil {
		err = p.step("computer-use layer (mmdebstrap, mkfs.ext4)", func() error { return buildLayer(ctx, tmp, logw) })
	}
	if err != nil {
		return nil, withLog(err, logPath)
	}
	final := filepath.Join(dir, hash)
	err = p.step("install", func() error {
		if err := os.RemoveAll(rootDir); err != nil {
			return fmt.Errorf("removing rootfs tree: %w", err)
		}
		m := manifest{
			Format:        formatVersion,
			RecipeHash:    hash,
			KernelPackage: k.Name,
			KernelVersion: k.Version,
			KernelRelease: k.Release,
			Modules:       order,
			RootfsBytes:   size,
			BuiltAt:       time.Now().UTC(),
			BuildSeconds:  time.Since(start).Seconds(),
		}
		return install(m, tmp, dir, logw, logPath)
	})
	if err != nil {
		return nil, err
	}
	log.Info("guest image built", "dir", final, "rootfs_bytes", size, "seconds", int(time.Since(start).Seconds()))
	return load(final)
}

// newBuildDir clears what crashed builds of the recipe hash left in dir
// (the caller holds its lock) and makes the build's own directory. A
// directory it returns with an error is the caller's to remove.
func newBuildDir(dir, hash string) (string, error) {
	stale, _ := filepath.Glob(filepath.Join(dir, ".build-"+hash+"-*"))
	for _, s := range stale {
		_ = os.RemoveAll(s)
	}
	tmp, err := os.MkdirTemp(dir, ".build-"+hash+"-")
	if err != nil {
		return "", err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return tmp, err
	}
	return tmp, nil
}

// install writes m and the build log (logw, at logPath) into the build
// directory tmp, renames it into dir under the recipe hash and makes it
// current.
func install(m manifest, tmp, dir string, logw *os.File, logPath string) error {
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tmp, manifestName), append(data, '\n'), 0o644); err != nil {
		return err
	}
	if err := logw.Sync(); err != nil {
		return err
	}
	if err := os.Rename(logPath, filepath.Join(tmp, "build.log")); err != nil {
		return err
	}
	if err := syncDir(tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, m.RecipeHash)); err != nil {
		return fmt.Errorf("installing image: %w", err)
	}
	return setCurrent(dir, m.RecipeHash)
}

// setCurrent points CacheDir/images/current at hash, atomically.
func setCurrent(dir, hash string) error {
	tmp := filepath.Join(dir, ".current-"+hash)
	_ = os.Remove(tmp)
	if err := os.Symlink(hash, tmp); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, currentLink))
}

// syncDir flushes the files in dir (not recursively) and dir itself, so the
// rename that publishes the image never points at unwritten data.
func syncDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Type().IsRegular() {
			if err := fsyncPath(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	return fsyncPath(dir)
}

func fsyncPath(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// withLog adds the build log's path and tail to err.
func withLog(err error, logPath string) error {
	data, _ := os.ReadFile(logPath)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return fmt.Errorf("%w (log: %s)\n%s", err, logPath, strings.Join(lines, "\n"))
}

// progress prints numbered phase lines with their elapsed time.
type progress struct {
	w     io.Writer
	n     int
	total int
}

func (p *progress) step(name string, f func() error) error {
	p.n++
	start := time.Now()
	if p.w != nil {
		fmt.Fprintf(p.w, "[%d/%d] %s ... ", p.n, p.total, name)
	}
	err := f()
	if p.w != nil {
		if err != nil {
			fmt.Fprintf(p.w, "failed after %.0fs\n", time.Since(start).Seconds())
		} else {
			fmt.Fprintf(p.w, "%.0fs\n", time.Since(start).Seconds())
		}
	}
	return err
}
