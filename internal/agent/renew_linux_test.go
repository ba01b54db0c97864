package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// TestKernelBootIDBind checks, with the real kernel, what renewBootID
// relies on: a file bound read-only over /proc/sys/kernel/random/boot_id
// is what it reads, binds stack and come off one unmount at a time, and
// unmounting the kernel's own file fails with EINVAL. It mounts only in a
// mount namespace of its own, on a thread that dies with it, whose mounts
// propagate nowhere; it is skipped where that cannot be had.
func TestKernelBootIDBind(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	dir := t.TempDir()
	var skip string
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Never unlocked: the thread, in its own namespace, ends with
		// this goroutine and runs nothing else.
		runtime.LockOSThread()
		if e := unix.Unshare(unix.CLONE_NEWNS); e != nil {
			skip = fmt.Sprintf("unshare(CLONE_NEWNS): %v", e)
			return
		}
		if e := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); e != nil {
			skip = fmt.Sprintf("making mounts private: %v", e)
			return
		}
		err = checkBootIDBinds(dir)
	}()
	<-done
	if skip != "" {
		t.Skip(skip)
	}
	if err != nil {
		t.Fatal(err)
	}
}

func checkBootIDBinds(dir string) error {
	var sys kernelSystem
	kernelID, err := os.ReadFile(bootIDPath)
	if err != nil {
		return err
	}
	if err := sys.Unmount(bootIDPath); !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("unmounting the kernel's boot_id: %v, want EINVAL", err)
	}
	ids := []string{"3f2504e0-4f89-11d3-9a0c-0305e82c3301\n", "c0ffee00-0000-4000-8000-0000000000ff\n"}
	for i, id := range ids {
		f := filepath.Join(dir, fmt.Sprint("boot_id", i))
		if err := os.WriteFile(f, []byte(id), 0o444); err != nil {
			return err
		}
		if err := sys.BindReadOnly(f, bootIDPath); err != nil {
			return err
		}
		defer func() { _ = sys.Unmount(bootIDPath) }() // gone with the namespace anyway
		if b, err := os.ReadFile(bootIDPath); err != nil || string(b) != id {
			return fmt.Errorf("boot_id reads %q %v, want %q", b, err, id)
		}
		if err := os.WriteFile(bootIDPath, []byte("x\n"), 0); err == nil {
			return errors.New("the bound boot_id is writable")
		}
	}
	for _, want := range []string{ids[0], string(kernelID)} {
		if err := sys.Unmount(bootIDPath); err != nil {
			return err
		}
		if b, _ := os.ReadFile(bootIDPath); string(b) != want {
			return fmt.Errorf("after an unmount boot_id reads %q, want %q", b, want)
		}
	}
	if err := sys.Unmount(bootIDPath); !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("unmounting with no bind left: %v, want EINVAL", err)
	}
	return nil
}
