package qemu

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/emberbox/emberbox/internal/vmm"
)

// A saved device state loads only into a QEMU with the same devices, so
// the device set a VM was booted with is recorded beside its state and
// follows it: a pause keeps it, a snapshot and a copy of one carry it, and
// a resume starts QEMU with the recorded set, while a boot always gets the
// newest. A saved state from before the record (no file) is set 1.
//
// Sets:
//
//	1: block, serial console, virtio-serial agent port, rng.
//	2: set 1 and a balloon device with free page reporting: the guest tells
//	   QEMU which pages it has freed and QEMU punches them out of the
//	   sandbox's own memory file (share=on, its own copy; D13), so memory
//	   a guest used and let go goes back to the host, in page cache and on
//	   disk. Never into a file another VM maps: that is what corrupted a
//	   template once (docs/DESIGN.md).
//	3: set 2 and the computer-use layer (guestimage/layer.go) as a second
//	   disk, read-only, the same file for every VM. The layer a VM booted
//	   with is recorded beside the set (layerFile): a resume opens that file
//	   while it exists, the server's current one when it does not (a move
//	   to another node, an image cache cleared).
const (
	devicesFile    = "devices" // the device set of a VM dir's saved state or running VM
	devicesCurrent = 3
	layerFile      = "layer" // the host path of the layer of a set 3 VM
)

// bootDevices is the device set a boot of spec gets: the newest, less the
// layer when there is none.
func bootDevices(spec vmm.Spec) int {
	if spec.Layer == "" {
		return 2
	}
	return devicesCurrent
}

// layerOf is the layer a VM of dir opens, booted with the layer of spec
// or with the one recorded.
func layerOf(dir string, spec vmm.Spec) string {
	b, err := os.ReadFile(filepath.Join(dir, layerFile))
	if p := strings.TrimSpace(string(b)); err == nil && filepath.IsAbs(p) {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return spec.Layer
}

// readDevices returns the device set recorded in dir (1 when none is).
func readDevices(dir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dir, devicesFile))
	if errors.Is(err, fs.ErrNotExist) {
		return 1, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reading the device set: %w", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 1 || n > devicesCurrent {
		return 0, fmt.Errorf("the device set %q in %s is not one this server knows (1 to %d)", strings.TrimSpace(string(b)), dir, devicesCurrent)
	}
	return n, nil
}

// writeDevices records device set n in dir.
func writeDevices(dir string, n int) error {
	if err := os.WriteFile(filepath.Join(dir, devicesFile), []byte(strconv.Itoa(n)+"\n"), 0o600); err != nil {
		return fmt.Errorf("recording the device set: %w", err)
	}
	return nil
}

// copyDevices records in dst the device set recorded in src.
func copyDevices(src, dst string) error {
	n, err := readDevices(src)
	if err != nil {
		return err
	}
	return writeDevices(dst, n)
}

// deviceArgs are the QEMU arguments of the devices set n adds to set 1,
// its files at the paths f.
func deviceArgs(n int, f vmFiles) []string {
	if n < 2 {
		return nil
	}
	args := []string{"-device", "virtio-balloon-device,free-page-reporting=on"}
	if n >= 3 {
		args = append(args,
			"-blockdev", "driver=file,node-name=layer-file,read-only=on,filename="+optEscape(f.Layer),
			"-blockdev", "driver=raw,node-name=layer,file=layer-file,read-only=on",
			"-device", "virtio-blk-device,drive=layer")
	}
	return args
}
