package e2b

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/emberbox/emberbox/internal/errdefs"
)

// apiError is E2B's one error shape, {code, message}, where code repeats
// the HTTP status. It is used on E2B's routes only; the Runtime API keeps
// its own shape.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	// ErrorCode is the stable code of the failure (Emberbox's errdefs
	// code), which E2B's SDKs read for a few conditions.
	ErrorCode  string `json:"error_code,omitempty"`
	retryAfter int
}

func (e *apiError) Error() string { return e.Message }

func newError(status int, format string) *apiError {
	return &apiError{Code: status, Message: format}
}

// toAPIError maps an errdefs-classed error to E2B's status and message.
func toAPIError(err error) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	status := http.StatusInternalServerError
	switch {
	case errors.Is(err, errdefs.ErrInvalidArgument):
		status = http.StatusBadRequest
	case errors.Is(err, errdefs.ErrNotFound):
		status = http.StatusNotFound
	case errors.Is(err, errdefs.ErrConflict):
		status = http.StatusConflict
	case errors.Is(err, errdefs.ErrPermission):
		status = http.StatusForbidden
	case errors.Is(err, errdefs.ErrUnavailable):
		status = http.StatusServiceUnavailable
	}
	e := &apiError{Code: status, Message: "Internal error.", ErrorCode: errdefs.Code(err)}
	var ce *errdefs.CodedError
	if errors.As(err, &ce) {
		if ce.Code == "no_capacity" || ce.Code == "quota_exceeded" || ce.Code == "rate_limited" {
			e.Code = http.StatusTooManyRequests
		}
		if ce.RetryAfter > 0 {
			e.retryAfter = int(ce.RetryAfter.Seconds() + 0.999)
		}
	}
	if status != http.StatusInternalServerError {
		e.Message = err.Error()
	}
	return e
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, err error) {
	e := toAPIError(err)
	if e.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(e.retryAfter))
	}
	writeJSON(w, e.Code, e)
}
