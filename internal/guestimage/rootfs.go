package guestimage

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// buildTree runs mmdebstrap into dir (which must not exist yet) with pkgs,
// and customize written next to it as its customize hook. Its output goes
// to logw.
func buildTree(ctx context.Context, dir string, pkgs []string, customize string, logw *os.File) error {
	script := dir + ".customize.sh"
	if err := os.WriteFile(script, []byte(customize), 0o755); err != nil {
		return err
	}
	defer os.Remove(script)

	args := append([]string{}, mmdebstrapOptions...)
	args = append(args,
		"--mode=root", // mkfs.ext4 -d needs real ownership in the tree
		"--include="+strings.Join(pkgs, ","),
		"--customize-hook=sh "+strconv.Quote(script)+` "$1"`,
		suite, dir)
	args = append(args, mirrors...)
	if err := runLogged(ctx, logw, filepath.Dir(dir), "mmdebstrap", args...); err != nil {
		return fmt.Errorf("mmdebstrap: %w", err)
	}
	return nil
}

// makeExt4 writes a raw ext4 image of dir labelled label to img and
// returns its size. The image gets about 25% slack over the content;
// per-sandbox overlays grow it further with resize2fs.
func makeExt4(ctx context.Context, dir, img, label string, logw *os.File) (int64, error) {
	used, inodes, err := treeUsage(dir)
	if err != nil {
		return 0, fmt.Errorf("measuring %s: %w", dir, err)
	}
	const mib = 1 << 20
	// Content, plus 25%, plus room for inode tables (256 bytes per inode,
	// twice the count in use) and the journal.
	size := used + used/4 + 2*inodes*256 + 64*mib
	for attempt := 0; attempt < 3; attempt++ {
		size = (size + 64*mib - 1) / (64 * mib) * (64 * mib)
		err = mkfs(ctx, dir, img, label, size, 2*inodes+16384, logw)
		if err == nil {
			return size, nil
		}
		// Estimates can fall short on trees with many tiny files: grow and
		// retry rather than fail the whole build.
		size += size / 2
	}
	return 0, err
}

func mkfs(ctx context.Context, dir, img, label string, size, inodes int64, logw *os.File) error {
	_ = os.Remove(img)
	f, err := os.Create(img)
	if err != nil {
		return err
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	err = runLogged(ctx, logw, filepath.Dir(img), "mkfs.ext4", "-F", "-q",
		"-L", label,
		"-m", "0", // no blocks reserved for root: the sandbox user owns the disk
		"-N", strconv.FormatInt(inodes, 10),
		"-d", dir, img)
	if err != nil {
		return fmt.Errorf("mkfs.ext4 (%d MiB): %w", size>>20, err)
	}
	return nil
}

// treeUsage returns the bytes allocated by the files under dir and the
// number of inodes they need.
func treeUsage(dir string) (used, inodes int64, err error) {
	seen := make(map[uint64]bool) // hard links count once
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok {
			return errors.New("no stat data")
		}
		if st.Nlink > 1 && !d.IsDir() {
			if seen[st.Ino] {
				return nil
			}
			seen[st.Ino] = true
		}
		inodes++
		used += st.Blocks * 512
		return nil
	})
	return used, inodes, err
}
