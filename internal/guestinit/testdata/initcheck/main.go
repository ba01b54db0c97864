// Command initcheck is a stand-in for the guest agent used by the boot test
// in internal/guestimage: as /init in the initramfs it switches to the root disk
// exactly as the agent does, and then, as PID 1 of the real rootfs, prints
// one marker line describing what it found and powers the VM off.
package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/emberbox/emberbox/internal/guestinit"
)

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
}

func main() {
	if guestinit.IsInitramfs() {
		err := guestinit.SwitchRoot(logf)
		logf("EMBERBOX-INITCHECK fail switchroot: %v", err)
		powerOff()
	}
	if os.Getpid() != 1 {
		logf("initcheck: not PID 1, nothing to do")
		os.Exit(2)
	}
	fmt.Printf("EMBERBOX-INITCHECK ok uid-user=%s python=%q sudo-as-user=%s exe=%s ports=%s uptime=%s\n",
		run("/usr/bin/id", "-u", "user"), run("/usr/bin/python3", "--version"),
		asUser("/usr/bin/sudo", "-n", "/usr/bin/id", "-u"), self(), ports(), uptime())
	powerOff()
}

// run returns a command's trimmed output, or the error in brackets. There
// is no PATH in init's environment, hence absolute paths.
func run(name string, args ...string) string {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("[%v: %s]", err, strings.TrimSpace(string(out)))
	}
	return strings.TrimSpace(string(out))
}

// asUser runs a command as the sandbox user (uid 1000), as the agent will.
func asUser(name string, args ...string) string {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1000, Gid: 1000, Groups: []uint32{27}}}
	cmd.Env = []string{"HOME=/workspace", "USER=user", "PATH=/usr/local/bin:/usr/bin:/bin"}
	cmd.Dir = "/workspace"
	out, err := cmd.CombinedOutput()
	// One line: the marker must stay on a single console line.
	text := strings.ReplaceAll(strings.TrimSpace(string(out)), "\n", " | ")
	if err != nil {
		return fmt.Sprintf("[%v: %s]", err, text)
	}
	return text
}

func self() string {
	p, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return "[" + err.Error() + "]"
	}
	return p
}

// ports lists the virtio-serial port names the guest sees.
func ports() string {
	names, _ := filepath.Glob("/sys/class/virtio-ports/vport*p*/name")
	var out []string
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err == nil {
			out = append(out, strings.TrimSpace(string(b)))
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ",")
}

func uptime() string {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}

func powerOff() {
	unix.Sync()
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF); err != nil {
		logf("initcheck: power off: %v", err)
	}
	select {} // PID 1 must not exit: that panics the kernel
}
