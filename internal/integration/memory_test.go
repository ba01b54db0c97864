package integration

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// memFileMiB is what sandbox id's guest memory file takes on the host
// (its allocated blocks: holes are memory the guest never used or gave
// back).
func memFileMiB(t testing.TB, dataDir, id string) float64 {
	t.Helper()
	fi, err := os.Stat(filepath.Join(dataDir, "sandboxes", id, "mem"))
	if err != nil {
		t.Fatal(err)
	}
	return float64(fi.Sys().(*syscall.Stat_t).Blocks*512) / (1 << 20)
}

// TestMemoryComesBack: a guest that fills 3 GiB and lets it go gives it
// back to the host (free page reporting punches the freed pages out of the
// sandbox's own memory file), in the file's blocks and in QEMU's Pss; left
// quiet, it trims its page cache, which comes back too; the sandbox goes on
// working, and a pause and wake keep its device set.
func TestMemoryComesBack(t *testing.T) {
	s := startServer(t, t.TempDir())
	c := s.client(s.AdminKey)
	sb := c.createRunning(t, map[string]any{"timeoutSeconds": 900})
	if out := c.sh(t, sb.ID, "ls /sys/bus/virtio/drivers/virtio_balloon/ | grep -c virtio || true"); out != "1\n" {
		t.Fatalf("the guest has %q balloon devices bound, want 1", out)
	}
	pid := vmPID(sb.ID)
	if pid == 0 {
		t.Fatal("no VM process")
	}
	fileBefore, pssBefore := memFileMiB(t, s.DataDir, sb.ID), pssMiB(t, pid)
	p := c.spawn(t, sb.ID, `python3 -c 'import time; b = b"x" * (3 << 30); open("/tmp/held", "w").close(); time.sleep(3600)'`)
	if !waitUntil(5*time.Minute, time.Second, func() bool {
		return c.sh(t, sb.ID, "test -e /tmp/held && echo yes || true") == "yes\n"
	}) {
		t.Fatal("the guest did not fill 3 GiB within 5 min")
	}
	fileHeld, pssHeld := memFileMiB(t, s.DataDir, sb.ID), pssMiB(t, pid)
	if fileHeld < fileBefore+2900 {
		t.Fatalf("with 3 GiB held the memory file takes %.0f MiB (%.0f before): the measure does not see the guest's memory", fileHeld, fileBefore)
	}
	c.sh(t, sb.ID, "kill "+strconv.Itoa(p.PID))
	released := time.Now()
	var fileAfter float64
	if !waitUntil(3*time.Minute, time.Second, func() bool {
		fileAfter = memFileMiB(t, s.DataDir, sb.ID)
		return fileAfter < fileBefore+256
	}) {
		t.Fatalf("3 min after the guest let 3 GiB go its memory file still takes %.0f MiB (%.0f before, %.0f held)", fileAfter, fileBefore, fileHeld)
	}
	back := time.Since(released)
	pssAfter := pssMiB(t, pid)
	t.Logf("memory file: %.0f MiB before, %.0f with 3 GiB held, %.0f after (%.1f s after the release); QEMU Pss %.0f, %.0f, %.0f MiB",
		fileBefore, fileHeld, fileAfter, back.Seconds(), pssBefore, pssHeld, pssAfter)
	if pssAfter > pssHeld-2048 {
		t.Errorf("QEMU's Pss went from %.0f MiB with 3 GiB held to %.0f after the release, want at least 2 GiB less", pssHeld, pssAfter)
	}
	// Left alone, the guest trims its page cache, and that comes back too:
	// write 512 MiB of files (cached in the guest, so in its memory file),
	// then let no call go to the guest; its console says when it trimmed.
	c.sh(t, sb.ID, "dd if=/dev/zero of=/workspace/cached bs=1M count=512 status=none && sync")
	cachedBefore := guestCachedMiB(t, c, sb.ID)
	fileCached := memFileMiB(t, s.DataDir, sb.ID)
	if cachedBefore < 400 {
		t.Fatalf("after writing 512 MiB of files the guest caches %d MiB", cachedBefore)
	}
	quiet := time.Now()
	console := filepath.Join(s.DataDir, "sandboxes", sb.ID, "console.log")
	if !waitUntil(4*time.Minute, time.Second, func() bool {
		b, _ := os.ReadFile(console)
		return strings.Contains(string(b), "trimmed the page cache") && time.Since(quiet) > 5*time.Second
	}) {
		t.Fatal("4 min quiet, the guest has not trimmed its page cache")
	}
	trimmedAfter := time.Since(quiet)
	var fileIdle float64
	waitUntil(30*time.Second, time.Second, func() bool { // reporting runs 2 s after a free
		fileIdle = memFileMiB(t, s.DataDir, sb.ID)
		return fileIdle < fileCached-256
	})
	pssIdle := pssMiB(t, pid)
	cachedAfter := guestCachedMiB(t, c, sb.ID)
	t.Logf("quiet: trimmed after %.0f s; guest page cache %d → %d MiB; memory file %.0f → %.0f MiB; QEMU Pss %.0f MiB",
		trimmedAfter.Seconds(), cachedBefore, cachedAfter, fileCached, fileIdle, pssIdle)
	if cachedAfter > cachedBefore-256 || fileIdle > fileCached-256 {
		t.Errorf("with the trim the guest's page cache went from %d to %d MiB and its memory file from %.0f to %.0f MiB, want both 256 MiB less or more",
			cachedBefore, cachedAfter, fileCached, fileIdle)
	}
	// The device set survives a pause: the wake loads the saved state
	// into a QEMU with the same devices, and the balloon is still there.
	c.lifecycle(t, sb.ID, "pause", nil)
	c.lifecycle(t, sb.ID, "wake", nil)
	if out := c.sh(t, sb.ID, "ls /sys/bus/virtio/drivers/virtio_balloon/ | grep -c virtio || true"); out != "1\n" {
		t.Errorf("after a pause and wake the guest has %q balloon devices bound, want 1", out)
	}
}

// guestCachedMiB is the guest kernel's page cache (Cached in /proc/meminfo).
func guestCachedMiB(t testing.TB, c *client, id string) int {
	t.Helper()
	out := c.sh(t, id, "awk '/^Cached:/ {print int($2 / 1024)}' /proc/meminfo")
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("guest Cached: %q", out)
	}
	return n
}
