package upload

import "golang.org/x/sys/unix"

// FreeSpace returns the bytes of dir's file system available to this
// process (the image catalog's context chunks keep their reserve by it too).
func FreeSpace(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}
