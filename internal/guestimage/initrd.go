package guestimage

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/emberbox/emberbox/internal/guestinit"
)

// initrdFormat is mixed into the initrd hash; bump it when the layout changes.
const initrdFormat = "emberbox-initrd-v1"

// BuildInitrd packs agentBinary as /init together with img's boot modules
// and their load order into an uncompressed newc cpio archive in outDir. The
// file is named after the hash of its content, so an unchanged agent and
// image reuse the archive already there.
func BuildInitrd(img *Image, agentBinary string, outDir string) (string, error) {
	agent, err := os.ReadFile(agentBinary)
	if err != nil {
		return "", fmt.Errorf("building initrd: reading agent: %w", err)
	}
	modules, err := readModules(img.ModulesDir)
	if err != nil {
		return "", err
	}
	out := filepath.Join(outDir, "initrd-"+initrdSum(agent, modules)+".cpio")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	data, err := packInitrd(agent, modules)
	if err != nil {
		return "", err
	}
	if err := writeInitrd(outDir, out, data); err != nil {
		return "", err
	}
	return out, nil
}

// An initrdModule is a kernel module the initrd loads at boot.
type initrdModule struct {
	name string
	data []byte
}

// readModules reads the boot modules in dir, in their load order.
func readModules(dir string) ([]initrdModule, error) {
	orderData, err := os.ReadFile(filepath.Join(dir, loadOrderName))
	if err != nil {
		return nil, fmt.Errorf("building initrd: %w", err)
	}
	var modules []initrdModule
	for _, name := range strings.Fields(string(orderData)) {
		if strings.Contains(name, "/") {
			return nil, fmt.Errorf("building initrd: bad module name %q in load order", name)
		}
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("building initrd: %w", err)
		}
		modules = append(modules, initrdModule{name, data})
	}
	return modules, nil
}

// initrdSum names an initrd by what goes into it.
func initrdSum(agent []byte, modules []initrdModule) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\nagent %d\n", initrdFormat, len(agent))
	h.Write(agent)
	for _, m := range modules {
		fmt.Fprintf(h, "module %s %d\n", m.name, len(m.data))
		h.Write(m.data)
	}
	return hex.EncodeToString(h.Sum(nil))[:32]
}

// packInitrd makes the cpio archive: the directories init mounts on, a
// console node, the agent as /init, and the modules with their load order.
func packInitrd(agent []byte, modules []initrdModule) ([]byte, error) {
	var buf bytes.Buffer
	bw := bufio.NewWriter(&buf)
	cw := &cpioWriter{w: bw}
	rel := func(p string) string { return strings.TrimPrefix(p, "/") }
	dirs := []string{"dev", "proc", "sys", "run", "newroot", "lib", "lib/emberbox", rel(guestinit.ModulesDir)}
	for _, d := range dirs {
		cw.write(cpioEntry{Name: d, Mode: cpioMode(cpioDir, 0o755)})
	}
	// The kernel opens /dev/console for init's stdio before devtmpfs is
	// mounted; without this node init starts with no console at all.
	cw.write(cpioEntry{Name: "dev/console", Mode: cpioMode(cpioChar, 0o600), RdevMajor: 5, RdevMinor: 1})
	cw.write(cpioEntry{Name: "init", Mode: cpioMode(cpioReg, 0o755), Data: agent})
	var order strings.Builder
	for _, m := range modules {
		cw.write(cpioEntry{Name: rel(path.Join(guestinit.ModulesDir, m.name)), Mode: cpioMode(cpioReg, 0o644), Data: m.data})
		order.WriteString(m.name + "\n")
	}
	cw.write(cpioEntry{Name: rel(guestinit.LoadOrderFile), Mode: cpioMode(cpioReg, 0o644), Data: []byte(order.String())})
	if err := cw.close(); err != nil {
		return nil, fmt.Errorf("building initrd: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return nil, fmt.Errorf("building initrd: %w", err)
	}
	return buf.Bytes(), nil
}

// writeInitrd puts data at out, in outDir, whole or not at all.
func writeInitrd(outDir, out string, data []byte) error {
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return fmt.Errorf("building initrd: %w", err)
	}
	tmp, err := os.CreateTemp(outDir, ".initrd-*")
	if err != nil {
		return fmt.Errorf("building initrd: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("building initrd: %w", err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("building initrd: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("building initrd: %w", err)
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return fmt.Errorf("building initrd: %w", err)
	}
	return nil
}
