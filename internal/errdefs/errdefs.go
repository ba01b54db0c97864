// Package errdefs defines the small set of error classes shared by the
// sandbox manager, the guest client and the API layer. Errors are wrapped with
// %w and classified with errors.Is; only internal/api maps a class to an HTTP
// status and a wire code.
package errdefs

import (
	"errors"
	"fmt"
	"time"
)

// Error classes. Wrap one of these (fmt.Errorf("...: %w", errdefs.ErrNotFound))
// so callers can classify the failure without matching on text.
var (
	ErrInvalidArgument = errors.New("invalid argument")
	ErrNotFound        = errors.New("not found")
	ErrConflict        = errors.New("conflict")
	ErrPermission      = errors.New("permission denied")
	ErrUnavailable     = errors.New("unavailable")
	ErrInternal        = errors.New("internal error")
)

// CodedError carries a stable wire code (such as "file_not_found" or
// "not_running") alongside its class, so the API can answer with the precise
// code while generic code still classifies it with errors.Is.
type CodedError struct {
	Class   error  // one of the Err* classes above
	Code    string // stable snake_case code for the API error shape
	Message string // human-readable, safe to show to API callers
	Hint    string // optional: what the caller can do about it
	Details map[string]any
	// RetryAfter, when positive, is how long the caller should wait before
	// trying again (a server out of room, a quota, a rate limit).
	RetryAfter time.Duration
}

func (e *CodedError) Error() string { return e.Message }

// Unwrap returns the error class so errors.Is works.
func (e *CodedError) Unwrap() error { return e.Class }

// New returns a CodedError of class with the given code and message.
func New(class error, code, format string, args ...any) *CodedError {
	return &CodedError{Class: class, Code: code, Message: fmt.Sprintf(format, args...)}
}

// WithHint returns e with its hint set.
func (e *CodedError) WithHint(hint string) *CodedError {
	e.Hint = hint
	return e
}

// Code returns the wire code of the first CodedError in err's chain, or "".
func Code(err error) string {
	var ce *CodedError
	if errors.As(err, &ce) {
		return ce.Code
	}
	return ""
}

// IsNotFound reports whether err is of the not-found class.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// IsConflict reports whether err is of the conflict class.
func IsConflict(err error) bool { return errors.Is(err, ErrConflict) }

// IsInvalidArgument reports whether err is of the invalid-argument class.
func IsInvalidArgument(err error) bool { return errors.Is(err, ErrInvalidArgument) }
