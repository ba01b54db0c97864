package catalog

import (
	"context"
	"strings"
	"sync"
	"time"
)

// Bounds of a build's log: lines past them are dropped with a note.
const (
	MaxLogLines     = 10000
	MaxLogLineBytes = 16 << 10
)

// notifier wakes those following an image's log when a line is written or
// its state changes.
type notifier struct {
	mu sync.Mutex
	m  map[string]chan struct{}
}

// wait returns a channel closed at the image's next change.
func (n *notifier) wait(id string) <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.m == nil {
		n.m = map[string]chan struct{}{}
	}
	ch, ok := n.m[id]
	if !ok {
		ch = make(chan struct{})
		n.m[id] = ch
	}
	return ch
}

func (n *notifier) notify(id string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if ch, ok := n.m[id]; ok {
		close(ch)
		delete(n.m, id)
	}
}

// logLines appends lines to an image's log and wakes its followers.
func (s *Service) logLines(ctx context.Context, id string, lines []LogLine) {
	if _, err := s.st.AppendImageLog(context.WithoutCancel(ctx), id, lines); err != nil {
		s.log.Warn("writing an image build log", "image_id", id, "err", err)
	}
	s.notes.notify(id)
}

// sink is a build's LogSink: bounded, UTF-8, one row per line.
type sink struct {
	s       *Service
	ctx     context.Context
	id      string
	mu      sync.Mutex
	n       int
	dropped bool
}

// Line implements LogSink.
func (k *sink) Line(stream, text string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	var lines []LogLine
	for _, t := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
		if k.n >= MaxLogLines {
			if !k.dropped {
				k.dropped = true
				lines = append(lines, LogLine{At: k.s.now(), Stream: "build",
					Text: "(the log is full: later lines are dropped)"})
			}
			break
		}
		t = strings.ToValidUTF8(t, "\uFFFD")
		if len(t) > MaxLogLineBytes {
			t = strings.ToValidUTF8(t[:MaxLogLineBytes], "") + " (line cut)"
		}
		k.n++
		lines = append(lines, LogLine{At: k.s.now(), Stream: stream, Text: t})
	}
	if len(lines) > 0 {
		k.s.logLines(k.ctx, k.id, lines)
	}
}

// LogPage is a page of a build's log.
type LogPage struct {
	Lines     []LogLine
	NextAfter int64
	Done      bool // the build is over and every line was read
}

// Logs returns up to limit lines after seq after.
func (s *Service) Logs(ctx context.Context, owner, id string, after int64, limit int) (*LogPage, error) {
	img, err := s.Get(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	lines, err := s.st.ImageLog(ctx, id, after, limit+1)
	if err != nil {
		return nil, err
	}
	more := len(lines) > limit
	if more {
		lines = lines[:limit]
	}
	p := &LogPage{Lines: lines, NextAfter: after}
	if len(lines) > 0 {
		p.NextAfter = lines[len(lines)-1].Seq
	}
	p.Done = !more && !building(img.State)
	return p, nil
}

func building(state string) bool { return state == StateQueued || state == StateBuilding }

// Follow sends the log's lines after seq after to emit as they are
// written, until the build is over (it returns the image) or maxWait
// passes (it returns nil and the seq to resume from).
func (s *Service) Follow(ctx context.Context, owner, id string, after int64, maxWait time.Duration,
	emit func(LogLine) error) (*Image, int64, error) {
	if _, err := s.Get(ctx, owner, id); err != nil {
		return nil, after, err
	}
	deadline := time.NewTimer(maxWait)
	defer deadline.Stop()
	for {
		// Take the wake-up channel before reading, so a line written
		// between the read and the wait is not missed.
		changed := s.notes.wait(id)
		img, err := s.st.GetImage(ctx, id)
		if err != nil {
			return nil, after, err
		}
		for {
			lines, err := s.st.ImageLog(ctx, id, after, 500)
			if err != nil {
				return nil, after, err
			}
			for _, l := range lines {
				if err := emit(l); err != nil {
					return nil, after, err
				}
				after = l.Seq
			}
			if len(lines) < 500 {
				break
			}
		}
		if !building(img.State) {
			return img, after, nil
		}
		select {
		case <-ctx.Done():
			return nil, after, ctx.Err()
		case <-deadline.C:
			return nil, after, nil
		case <-changed:
		}
	}
}
