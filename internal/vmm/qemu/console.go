package qemu

import "os"

// boundedLog appends to a file and, past limit bytes, moves it to path+".1"
// and starts again: a chatty guest cannot fill the host's disk.
type boundedLog struct {
	path  string
	limit int64
	f     *os.File
	size  int64
}

func (l *boundedLog) Write(b []byte) {
	if l.f == nil {
		f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			return
		}
		l.f = f
		if st, err := f.Stat(); err == nil {
			l.size = st.Size()
		}
	}
	if l.size+int64(len(b)) > l.limit {
		l.f.Close()
		l.f = nil
		_ = os.Rename(l.path, l.path+".1")
		l.size = 0
		l.Write(b[:min(int64(len(b)), l.limit)])
		return
	}
	n, _ := l.f.Write(b)
	l.size += int64(n)
}

func (l *boundedLog) Close() {
	if l.f != nil {
		l.f.Close()
	}
}
