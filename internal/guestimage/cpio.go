package guestimage

import (
	"fmt"
	"io"
	"io/fs"
)

// cpioWriter writes the "newc" cpio format the kernel unpacks as an
// initramfs. Entries are written as given: parent directories first. The
// first write error sticks and is returned by close.
type cpioWriter struct {
	w   io.Writer
	ino uint32
	err error
}

// cpioEntry describes one archive member. Mode holds the file type bits
// (unix S_IF*) as well as the permissions.
type cpioEntry struct {
	Name      string // without a leading slash, e.g. "lib/emberbox"
	Mode      uint32
	Data      []byte // regular files only
	RdevMajor uint32 // device nodes only
	RdevMinor uint32
}

// File type bits of the cpio mode field (the same values as Linux S_IF*).
const (
	cpioDir  = 0o040000
	cpioReg  = 0o100000
	cpioChar = 0o020000
)

func (c *cpioWriter) write(e cpioEntry) {
	if c.err != nil {
		return
	}
	c.ino++
	nlink := 1
	if e.Mode&0o170000 == cpioDir {
		nlink = 2
	}
	name := e.Name + "\x00"
	// Fields: magic, ino, mode, uid, gid, nlink, mtime, filesize, devmajor,
	// devminor, rdevmajor, rdevminor, namesize, check. mtime is 0 so the
	// archive depends only on its content.
	hdr := fmt.Sprintf("070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		c.ino, e.Mode, 0, 0, nlink, 0, len(e.Data), 0, 0, e.RdevMajor, e.RdevMinor, len(name), 0)
	c.put([]byte(hdr))
	c.put([]byte(name))
	c.pad(len(hdr) + len(name))
	c.put(e.Data)
	c.pad(len(e.Data))
}

// close writes the trailer entry that ends the archive.
func (c *cpioWriter) close() error {
	c.ino = 0
	c.write(cpioEntry{Name: "TRAILER!!!"})
	return c.err
}

func (c *cpioWriter) put(b []byte) {
	if c.err == nil && len(b) > 0 {
		_, c.err = c.w.Write(b)
	}
}

// pad aligns the stream to 4 bytes after a field of n bytes (the header is
// 110 bytes, so header+name and data are padded separately).
func (c *cpioWriter) pad(n int) {
	if r := n % 4; r != 0 {
		c.put(make([]byte, 4-r))
	}
}

// cpioMode combines a file type and Go permission bits.
func cpioMode(typ uint32, perm fs.FileMode) uint32 { return typ | uint32(perm.Perm()) }
