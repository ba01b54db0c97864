package qemu

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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
const (
	devicesFile    = "devices" // the device set of a VM dir's saved state or running VM
	devicesCurrent = 2
)

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

// deviceArgs are the QEMU arguments of the devices set n adds to set 1.
func deviceArgs(n int) []string {
	if n < 2 {
		return nil
	}
	return []string{"-device", "virtio-balloon-device,free-page-reporting=on"}
}
