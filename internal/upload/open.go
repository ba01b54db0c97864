package upload

import (
	"context"
	"fmt"

	"github.com/emberbox/emberbox/internal/errdefs"
)

// Append writes the next chunk of an open-ended upload: off must be the
// bytes received so far, or the offset of the last chunk again (a retry,
// which replaces it and what followed). Chunks are 1 to ChunkSize bytes,
// one at a time.
func (s *Store[E]) Append(owner, sandboxID, id string, off int64, data []byte) (*Progress, error) {
	s.sweepExpired()
	s.mu.Lock()
	u, err := s.usableLocked(owner, sandboxID, id, true)
	if err != nil {
		s.mu.Unlock()
		return nil, err
	}
	if u.writing > 0 {
		s.mu.Unlock()
		return nil, errBusy(id)
	}
	retry := u.lastOff >= 0 && off == u.lastOff
	switch {
	case off != u.size && !retry:
		s.mu.Unlock()
		return nil, invalid(Issue{"offset", fmt.Sprintf("must be %d, the bytes received so far: chunks of an archive upload come in sequence", u.size)})
	case len(data) == 0 || len(data) > ChunkSize:
		s.mu.Unlock()
		return nil, invalid(Issue{"body", fmt.Sprintf("must be 1 to %d bytes", ChunkSize)})
	case off+int64(len(data)) > MaxSize:
		s.mu.Unlock()
		return nil, errTooLarge(off+int64(len(data)), MaxSize)
	}
	grow := off + int64(len(data)) - u.size
	if err := s.roomLocked(u.owner, grow); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	// Count the bytes before writing them, so that the bounds hold for
	// uploads of the same owner growing at once.
	before := u.size
	u.size += grow
	u.writing++
	u.lastUsed = s.now()
	f := u.file
	s.mu.Unlock()

	_, werr := f.WriteAt(data, off)
	if werr == nil {
		werr = f.Truncate(off + int64(len(data))) // a retry shorter than what it replaces
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	u.writing--
	s.cond.Broadcast()
	u.lastUsed = s.now()
	if werr != nil {
		u.size = before
		return nil, fmt.Errorf("staging chunk: %w: %w", werr, errdefs.ErrInternal)
	}
	if !retry {
		u.received++
	}
	u.lastOff = off
	return &Progress{ID: id, Offset: off, Bytes: len(data), ChunksReceived: u.received, Chunks: u.received, Received: u.size}, nil
}

// roomLocked checks that owner may stage grow more bytes: its quota, the
// server's, and the free-space reserve.
func (s *Store[E]) roomLocked(owner string, grow int64) error {
	if grow <= 0 {
		return nil
	}
	var owned, all, pending int64
	for _, o := range s.byID {
		if !o.staged() {
			continue
		}
		all += o.size
		pending += o.unwritten()
		if o.owner == owner {
			owned += o.size
		}
	}
	switch {
	case owned+grow > s.cfg.MaxBytesPerOwner:
		return errOwnerBytes(s.cfg.MaxBytesPerOwner)
	case all+grow > s.cfg.MaxBytes:
		return errStagingFull()
	}
	avail, err := s.cfg.FreeSpace(s.dir)
	if err != nil {
		return fmt.Errorf("staging upload: free space: %w: %w", err, errdefs.ErrInternal)
	}
	if avail-pending-grow < s.cfg.FreeReserve/2 {
		return errStagingFull()
	}
	return nil
}

// CommitOpen streams what an open-ended upload received to write and ends
// the upload. A repeated commit answers what the first one wrote; if the
// write fails the upload stays open.
func (s *Store[E]) CommitOpen(ctx context.Context, owner, sandboxID, id string, write OpenWriteFunc[E]) (E, error) {
	return s.commit(ctx, owner, sandboxID, id, true, write)
}

func errBusy(id string) *errdefs.CodedError {
	return errdefs.New(errdefs.ErrConflict, CodeBusy, "A chunk of upload %s is being written.", id).
		WithHint("Send an archive upload's chunks one after another, each once the one before was answered.")
}
