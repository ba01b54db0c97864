package catalog

import "time"

// SweepChunks runs the context chunk sweep with cutoff, for tests.
func (s *Service) SweepChunks(cutoff time.Time) (int, error) { return s.chunks.sweep(cutoff) }
