package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type volumeJSON struct {
	ID           string  `json:"id"`
	State        string  `json:"state"`
	SizeMiB      int     `json:"sizeMiB"`
	SandboxID    *string `json:"sandboxId"`
	AttachmentID *string `json:"attachmentId"`
}

type attachmentJSON struct {
	ID        string `json:"id"`
	VolumeID  string `json:"volumeId"`
	SandboxID string `json:"sandboxId"`
	Path      string `json:"path"`
	State     string `json:"state"`
}

func (c *client) newVolume(t testing.TB, sizeMiB int) volumeJSON {
	t.Helper()
	v, _ := call[volumeJSON](t, c, "POST", "/v1/volumes", map[string]any{"sizeMiB": sizeMiB, "name": "it"}, nil)
	if v.ID == "" || v.State != "ready" || v.SizeMiB != sizeMiB {
		t.Fatalf("created volume: %+v", v)
	}
	return v
}

func (c *client) attach(t testing.TB, vol, sbx, path string) attachmentJSON {
	t.Helper()
	a, _ := call[attachmentJSON](t, c, "POST", "/v1/volumes/"+vol+":attach", map[string]any{"sandboxId": sbx, "path": path}, nil)
	if a.State != "attached" || a.SandboxID != sbx {
		t.Fatalf("attach: %+v", a)
	}
	return a
}

// errCode is the code of an error answer, or "".
func errCode(r *response) string {
	if r.Err == nil {
		return ""
	}
	return r.Err.Code
}

// TestVolumes: a volume written in one sandbox, detached, attached to
// another with its data intact; a second attach refused; create-time
// volumes; a volume (and writes made while the server was down) surviving
// a server kill -9; keys' volumes invisible to each other; snapshots and
// deletes of what holds or is held refused.
func TestVolumes(t *testing.T) {
	needVMs(t)
	dataDir := t.TempDir()
	s1 := startServer(t, dataDir)
	keyA, keyB := s1.createKey(t, "vol-a"), s1.createKey(t, "vol-b")
	a, b := s1.client(keyA), s1.client(keyB)
	shape := map[string]any{"vcpu": 1, "memoryMiB": 512}

	v1 := a.newVolume(t, 256)
	// Key B sees nothing of key A's volume.
	if r := b.raw(t, "GET", "/v1/volumes/"+v1.ID, nil, nil, requestTimeout); r.Status != http.StatusNotFound || errCode(r) != "volume_not_found" {
		t.Errorf("key B reading key A's volume: %v", r)
	}
	if l, _ := call[struct{ Data []volumeJSON }](t, b, "GET", "/v1/volumes", nil, nil); len(l.Data) != 0 {
		t.Errorf("key B lists %d volumes, want 0", len(l.Data))
	}
	if l, _ := call[struct{ Data []volumeJSON }](t, a, "GET", "/v1/volumes", nil, nil); len(l.Data) != 1 || l.Data[0].ID != v1.ID {
		t.Errorf("key A lists %+v", l.Data)
	}
	if r := b.raw(t, "POST", "/v1/volumes/"+v1.ID+":delete", map[string]any{}, nil, requestTimeout); r.Status != http.StatusNotFound {
		t.Errorf("key B deleting key A's volume: %v", r)
	}

	// 1. Written in one sandbox.
	sb1 := a.createRunning(t, shape)
	att1 := a.attach(t, v1.ID, sb1.ID, "/data")
	if out := a.sh(t, sb1.ID, "stat -c %U /data && findmnt -n -o FSTYPE,OPTIONS /data"); !strings.HasPrefix(out, "user\next4 ") || !strings.Contains(out, "nosuid") || !strings.Contains(out, "nodev") {
		t.Errorf("the mount: %q", out)
	}
	sum := a.sh(t, sb1.ID, "head -c 12582912 /dev/urandom > /data/blob && echo hello > /data/note && sync && md5sum /data/blob | cut -d' ' -f1")
	// Key B cannot attach it, nor to its own sandbox a volume it does not own.
	if r := b.raw(t, "POST", "/v1/volumes/"+v1.ID+":attach", map[string]any{"sandboxId": sb1.ID, "path": "/x"}, nil, requestTimeout); r.Status != http.StatusNotFound {
		t.Errorf("key B attaching key A's volume: %v", r)
	}
	// Held: delete refused; a snapshot of the holder refused.
	if r := a.raw(t, "POST", "/v1/volumes/"+v1.ID+":delete", map[string]any{}, nil, requestTimeout); r.Status != http.StatusConflict || errCode(r) != "volume_attached" {
		t.Errorf("deleting an attached volume: %v", r)
	}
	if r := a.raw(t, "POST", "/v1/sandboxes/"+sb1.ID+":snapshot", map[string]any{}, nil, requestTimeout); r.Status != http.StatusConflict || errCode(r) != "volumes_attached" {
		t.Errorf("snapshot of a sandbox with a volume: %v", r)
	}

	// 2. A second attach, and a create asking for it, are refused.
	sb2 := a.createRunning(t, shape)
	r := a.raw(t, "POST", "/v1/volumes/"+v1.ID+":attach", map[string]any{"sandboxId": sb2.ID, "path": "/data"}, nil, requestTimeout)
	if r.Status != http.StatusConflict || errCode(r) != "volume_attached" || !strings.Contains(r.Err.Message, sb1.ID) {
		t.Errorf("second attach: %v", r)
	}
	r = a.raw(t, "POST", "/v1/sandboxes", map[string]any{"vcpu": 1, "memoryMiB": 512,
		"volumes": []map[string]any{{"volumeId": v1.ID, "path": "/data"}}}, nil, requestTimeout)
	if r.Status != http.StatusConflict || errCode(r) != "volume_attached" {
		t.Errorf("create with a held volume: %v", r)
	}

	// 3. A busy mount is not detached; then it is.
	proc := a.spawn(t, sb1.ID, "cd /data && exec sleep 100000")
	if !waitUntil(30*time.Second, 200*time.Millisecond, func() bool {
		res, _ := a.exec(t, sb1.ID, execReq{Command: "for p in $(pgrep -x sleep); do readlink /proc/$p/cwd; done | grep -qx /data"})
		return res.exit() == "0"
	}) {
		t.Fatalf("the process in /data never started")
	}
	r = a.raw(t, "POST", "/v1/volumes/"+v1.ID+"/attachments/"+att1.ID+":detach", map[string]any{}, nil, requestTimeout)
	if r.Status != http.StatusConflict || errCode(r) != "volume_busy" {
		t.Errorf("detach of a busy mount: %v", r)
	}
	a.raw(t, "POST", "/v1/sandboxes/"+sb1.ID+"/processes/"+proc.ID+":signal", map[string]any{"signal": "SIGKILL"}, nil, requestTimeout)
	dev := strings.TrimSpace(a.sh(t, sb1.ID, "findmnt -n -o SOURCE /data"))
	if !strings.HasPrefix(dev, "/dev/nbd") {
		t.Fatalf("/data is mounted from %q, want an NBD device", dev)
	}
	var det attachmentJSON
	detachStart := time.Now()
	if !waitUntil(30*time.Second, 200*time.Millisecond, func() bool {
		r := a.raw(t, "POST", "/v1/volumes/"+v1.ID+"/attachments/"+att1.ID+":detach", map[string]any{}, nil, requestTimeout)
		return r.Status == http.StatusOK && decodeInto(r, &det) && det.State == "detached"
	}) {
		t.Fatalf("detach did not succeed")
	}
	t.Logf("detached in %s", time.Since(detachStart).Round(time.Millisecond))
	if res, _ := a.exec(t, sb1.ID, execReq{Command: "mountpoint -q /data"}); res.exit() == "0" {
		t.Errorf("/data is still a mount point after the detach")
	}
	// Root in the old holder writes to the device the volume was on: it
	// fails, and nothing reaches the volume's file.
	marker := fmt.Sprintf("after-detach-%d", time.Now().UnixNano())
	res, _ := a.exec(t, sb1.ID, execReq{Command: "printf " + marker + " | sudo dd of=" + dev + " bs=4096 conv=sync,fsync oflag=direct"})
	if res.exit() == "0" {
		t.Errorf("root wrote to %s after the detach: %s", dev, res.Stderr)
	}
	if raw, err := os.ReadFile(filepath.Join(dataDir, "volumes", v1.ID, "disk.raw")); err != nil || bytes.Contains(raw, []byte(marker)) {
		t.Errorf("the detached volume's file: err %v, holds the old holder's write: %v", err, err == nil)
	}
	if v, _ := call[volumeJSON](t, a, "GET", "/v1/volumes/"+v1.ID, nil, nil); v.State != "ready" || v.SandboxID != nil {
		t.Errorf("volume after detach: %+v", v)
	}

	// 4. Attached to another sandbox: the data is intact.
	a.attach(t, v1.ID, sb2.ID, "/mnt/vol")
	if got := a.sh(t, sb2.ID, "md5sum /mnt/vol/blob | cut -d' ' -f1; cat /mnt/vol/note"); got != sum+"hello\n" {
		t.Errorf("in the second sandbox: %q, want %q", got, sum+"hello\n")
	}
	a.sh(t, sb2.ID, "echo from-user > /mnt/vol/by-user") // the sandbox user writes it
	a.delete(t, sb1.ID)

	// 5. Create-time volumes; grown while detached, grown online at attach.
	v2 := a.newVolume(t, 128)
	if g, _ := call[volumeJSON](t, a, "POST", "/v1/volumes/"+v2.ID+":resize", map[string]any{"sizeMiB": 512}, nil); g.SizeMiB != 512 {
		t.Errorf("resize: %+v", g)
	}
	sb3 := a.createRunning(t, map[string]any{"vcpu": 1, "memoryMiB": 512,
		"volumes": []map[string]any{{"volumeId": v2.ID, "path": "/data", "mode": "rw"}}})
	if out := a.sh(t, sb3.ID, "df -m --output=size /data | tail -1"); atoiOr(strings.TrimSpace(out)) < 400 {
		t.Errorf("filesystem of a volume grown to 512 MiB: %q MiB", out)
	}
	a.sh(t, sb3.ID, "echo before > /data/before && sync")
	// A write made while the server is down waits in the guest and lands
	// once the restarted server serves the volume again.
	spawned := time.Now()
	a.spawn(t, sb3.ID, "sleep 1; head -c 4194304 /dev/urandom > /data/during; md5sum /data/during > /data/during.md5; sync; touch /data/done")

	// 6. kill -9 and restart. The server stays down until 4 s after the
	// spawn, an outage the guest's write and sync fall into.
	s1.kill9(t)
	time.Sleep(time.Until(spawned.Add(4 * time.Second)))
	s2 := startServer(t, dataDir)
	a, b = s2.client(keyA), s2.client(keyB)
	waitAgent(t, a, sb3.ID)
	if !waitUntil(3*time.Minute, time.Second, func() bool {
		res, _ := a.exec(t, sb3.ID, execReq{Command: "test -e /data/done"})
		return res.exit() == "0"
	}) {
		t.Fatalf("the write made across the restart never finished")
	}
	if b, err := os.ReadFile(filepath.Join(dataDir, "sandboxes", sb3.ID, "console.log")); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, "volume stream reopened") {
				t.Logf("guest: %s", l)
			}
		}
	}
	if out := a.sh(t, sb3.ID, "cat /data/before && md5sum -c /data/during.md5 >/dev/null && echo ok"); out != "before\nok\n" {
		t.Errorf("volume after the restart: %q", out)
	}
	// Read back from the host, not the page cache.
	a.raw(t, "POST", "/v1/sandboxes/"+sb3.ID+":exec", execReq{Command: "sync; echo 3 > /proc/sys/vm/drop_caches", User: "root"}, nil, requestTimeout)
	if out := a.sh(t, sb3.ID, "md5sum -c /data/during.md5 >/dev/null && echo ok"); out != "ok\n" {
		t.Errorf("volume re-read after the restart: %q", out)
	}
	if v, _ := call[volumeJSON](t, a, "GET", "/v1/volumes/"+v2.ID, nil, nil); v.State != "attached" || v.SandboxID == nil || *v.SandboxID != sb3.ID {
		t.Errorf("volume after restart: %+v", v)
	}
	if r := b.raw(t, "GET", "/v1/volumes/"+v2.ID, nil, nil, requestTimeout); r.Status != http.StatusNotFound {
		t.Errorf("key B after restart: %v", r)
	}

	// 7. Deleting the sandbox frees its volume, with what it had written
	// and not yet flushed; then the volume goes.
	a.sh(t, sb3.ID, "echo unflushed > /data/unflushed")
	a.delete(t, sb3.ID)
	if v, _ := call[volumeJSON](t, a, "GET", "/v1/volumes/"+v2.ID, nil, nil); v.State != "ready" {
		t.Errorf("volume of a deleted sandbox: %+v", v)
	}
	att2 := a.attach(t, v2.ID, sb2.ID, "/again")
	if got := a.sh(t, sb2.ID, "cat /again/unflushed /again/before"); got != "unflushed\nbefore\n" {
		t.Errorf("the volume after its sandbox was deleted: %q", got)
	}
	a.raw(t, "POST", "/v1/volumes/"+v2.ID+"/attachments/"+att2.ID+":detach", map[string]any{}, nil, requestTimeout)
	if v, _ := call[volumeJSON](t, a, "POST", "/v1/volumes/"+v2.ID+":delete", map[string]any{}, nil); v.State != "deleted" {
		t.Errorf("deleted volume: %+v", v)
	}
	a.delete(t, sb2.ID)
}

func decodeInto(r *response, v any) bool {
	return r.err == nil && json.Unmarshal(r.Body, v) == nil
}

func atoiOr(s string) int {
	n := 0
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0
		}
		n = n*10 + int(c-'0')
	}
	return n
}

// TestVolumesPauseWake: a volume stays attached across a pause and a wake;
// the guest's relay reopens its stream and the data is read back from the
// host.
func TestVolumesPauseWake(t *testing.T) {
	needVMs(t)
	s := startServer(t, t.TempDir())
	c := s.client(s.AdminKey)
	v := c.newVolume(t, 128)
	sb := c.createRunning(t, map[string]any{"vcpu": 1, "memoryMiB": 512,
		"volumes": []map[string]any{{"volumeId": v.ID, "path": "/data"}}})
	sum := c.sh(t, sb.ID, "cd /data && head -c 2097152 /dev/urandom > blob && md5sum blob | tee blob.md5 | cut -d' ' -f1")
	if r := c.raw(t, "POST", "/v1/sandboxes/"+sb.ID+":pause", map[string]any{}, http.Header{"Prefer": {"wait=120"}}, requestTimeout); r.Status != http.StatusOK {
		t.Fatalf("pause: %v", r)
	}
	c.waitState(t, sb.ID, "paused")
	if r := c.raw(t, "POST", "/v1/sandboxes/"+sb.ID+":wake", map[string]any{}, http.Header{"Prefer": {"wait=120"}}, requestTimeout); r.Status != http.StatusOK {
		t.Fatalf("wake: %v", r)
	}
	c.waitState(t, sb.ID, "running")
	c.raw(t, "POST", "/v1/sandboxes/"+sb.ID+":exec", execReq{Command: "sync; echo 3 > /proc/sys/vm/drop_caches", User: "root"}, nil, requestTimeout)
	if got := c.sh(t, sb.ID, "cd /data && md5sum -c blob.md5 >/dev/null && echo after > after && sync && cat after && md5sum blob | cut -d' ' -f1"); got != "after\n"+sum {
		t.Errorf("after the wake: %q, want %q", got, "after\n"+sum)
	}
	if got, _ := call[volumeJSON](t, c, "GET", "/v1/volumes/"+v.ID, nil, nil); got.State != "attached" {
		t.Errorf("volume after the wake: %+v", got)
	}

	// A backup of the attached volume (frozen for the copy), then a
	// change, then the backup restored as a new volume: it has what was
	// there at the backup and not the change.
	var bk struct{ ID, State, Consistent, Method string }
	if bk, _ = call[struct{ ID, State, Consistent, Method string }](t, c, "POST", "/v1/volumes/"+v.ID+":backup", map[string]any{"name": "it"}, nil); bk.State != "ready" || bk.Consistent != "frozen" {
		t.Fatalf("backup: %+v", bk)
	}
	t.Logf("backup %s by %s", bk.ID, bk.Method)
	c.sh(t, sb.ID, "echo later > /data/later && sync")
	rv, _ := call[volumeJSON](t, c, "POST", "/v1/volumes", map[string]any{"fromBackup": bk.ID}, nil)
	if rv.SizeMiB != 128 || rv.State != "ready" {
		t.Fatalf("restored volume: %+v", rv)
	}
	c.attach(t, rv.ID, sb.ID, "/restored")
	if got := c.sh(t, sb.ID, "cd /restored && md5sum -c blob.md5 >/dev/null && cat after && ls"); got != "after\nafter\nblob\nblob.md5\nlost+found\n" {
		t.Errorf("restored volume: %q", got)
	}
	c.delete(t, sb.ID)
}
