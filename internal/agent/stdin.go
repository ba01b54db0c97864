package agent

import (
	"fmt"
	"os"
	"sync"

	"github.com/emberbox/emberbox/internal/agentproto"
)

// ctrlD is what ends a terminal's input: a terminal cannot be half-closed,
// so EOF on a Pty process is the character its line discipline reads as
// end of file (at the start of a line).
const ctrlD = 0x04

// stdin is the input of a process spawned with StdinPipe or Pty. Writes
// are accepted into a bounded queue at cumulative offsets, and one
// goroutine copies the queue into the pipe or terminal, so a process that
// does not read blocks that goroutine, never a call.
type stdin struct {
	w   *os.File // pipe write end or terminal master; closed by run
	pty bool

	mu       sync.Mutex
	queue    []byte // accepted, not yet taken by run
	inflight int    // taken by run, not yet written
	offset   int64  // bytes accepted so far
	eof      bool   // input ends once the queue is written
	closed   bool   // no more input is accepted
	wake     chan struct{}
}

func newStdin(w *os.File, pty bool) *stdin {
	return &stdin{w: w, pty: pty, wake: make(chan struct{}, 1)}
}

// write accepts data at offset (nil: at the end) and returns the offset
// reached. Only what fits in agentproto.MaxStdinBuffer is accepted; the
// caller sends the rest again from the answered offset. An append (nil
// offset) is accepted whole or refused with CodeStdinFull.
func (s *stdin) write(data []byte, offset *int64, eof bool) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	at := s.offset
	if offset != nil {
		at = *offset
	}
	if at < 0 || at > s.offset {
		return s.offset, &agentproto.Error{Code: agentproto.CodeStdinGap,
			Message: fmt.Sprintf("input offset %d is past the %d bytes accepted", at, s.offset)}
	}
	// Bytes below s.offset were accepted by an earlier try of this write.
	skip := min(s.offset-at, int64(len(data)))
	data = data[skip:]
	if len(data) == 0 && (!eof || s.eof) {
		return s.offset, nil // a retry, or nothing to do
	}
	if s.closed || s.eof {
		return s.offset, &agentproto.Error{Code: agentproto.CodeStdinClosed, Message: "the process's input is closed"}
	}
	room := max(agentproto.MaxStdinBuffer-len(s.queue)-s.inflight, 0)
	if offset == nil && room < len(data) {
		// An append is all or nothing: its writer could not tell
		// which part went in.
		return s.offset, &agentproto.Error{Code: agentproto.CodeStdinFull, Message: "the process's input buffer is full"}
	}
	n := min(len(data), room)
	s.queue = append(s.queue, data[:n]...)
	s.offset += int64(n)
	if eof && n == len(data) {
		s.eof = true
	}
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return s.offset, nil
}

// open reports whether input is still accepted, and the offset reached.
func (s *stdin) state() (open bool, offset int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.closed && !s.eof, s.offset
}

// run copies the queue into w until EOF was asked for and everything was
// written, a write fails (the reader is gone), or stop closes.
func (s *stdin) run(stop <-chan struct{}) {
	defer s.close()
	for {
		s.mu.Lock()
		buf, eof := s.queue, s.eof
		s.queue, s.inflight = nil, len(buf)
		s.mu.Unlock()
		if len(buf) > 0 {
			_, err := s.w.Write(buf)
			s.mu.Lock()
			s.inflight = 0
			s.mu.Unlock()
			if err != nil {
				return
			}
			continue // more may have come meanwhile; eof is read again
		}
		if eof {
			if s.pty {
				_, _ = s.w.Write([]byte{ctrlD})
				// The terminal stays open: its master also carries output.
				<-stop
			}
			return
		}
		select {
		case <-s.wake:
		case <-stop:
			return
		}
	}
}

// close refuses further input and drops what was not written. A pipe's
// write end is closed (the reader sees end of file); a terminal's master
// is closed by the process's supervisor.
func (s *stdin) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.closed = true
	s.queue = nil
	if !s.pty {
		s.w.Close()
	}
}
