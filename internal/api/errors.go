package api

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
)

// apiError is an answer in the one error shape. Handlers build it directly
// for refusals of their own and get it from toAPIError for errors of the
// manager.
type apiError struct {
	Status       int
	Code         string
	Message      string
	Hint         string
	Details      map[string]any
	RetryAfterMs int64
	// cause is logged for 5xx answers, and for others whose text was
	// replaced (uncoded), and never sent.
	cause   error
	uncoded bool
}

func (e *apiError) Error() string { return e.Code + ": " + e.Message }

// issue is one problem with a request's fields, listed in
// details.issues of an invalid_request answer.
type issue struct {
	Path    string `json:"path"`
	Message string `json:"message"`
}

func newError(status int, code, message string) *apiError {
	return &apiError{Status: status, Code: code, Message: message}
}

func (e *apiError) withHint(h string) *apiError { e.Hint = h; return e }

// invalid returns a 400 invalid_request listing issues.
func invalid(issues []issue) *apiError {
	msg := "The request is not valid."
	if len(issues) == 1 {
		msg = issues[0].Path + ": " + issues[0].Message
		if issues[0].Path == "" {
			msg = issues[0].Message
		}
	}
	return &apiError{
		Status:  http.StatusBadRequest,
		Code:    "invalid_request",
		Message: msg,
		Hint:    "Fix the fields listed in details.issues and send the request again.",
		Details: map[string]any{"issues": issues},
	}
}

// errTooLarge answers a body over limit bytes.
func errTooLarge(what string) *apiError {
	return newError(http.StatusRequestEntityTooLarge, "too_large", what+" is larger than 1 MiB.").
		withHint("Send at most 1 MiB (1048576 bytes) in one request.")
}

// classStatus maps an errdefs class to a status and the generic code used
// when the error carries no code of its own.
var classStatus = []struct {
	class  error
	status int
	code   string
}{
	{errdefs.ErrInvalidArgument, http.StatusBadRequest, "invalid_request"},
	{errdefs.ErrNotFound, http.StatusNotFound, "not_found"},
	{errdefs.ErrConflict, http.StatusConflict, "conflict"},
	{errdefs.ErrPermission, http.StatusForbidden, "permission_denied"},
	{errdefs.ErrUnavailable, http.StatusServiceUnavailable, "unavailable"},
	{errdefs.ErrInternal, http.StatusInternalServerError, "internal"},
}

// codeStatus overrides the class status for codes with a status of their own.
var codeStatus = map[string]int{
	"too_large":      http.StatusRequestEntityTooLarge,
	"rate_limited":   http.StatusTooManyRequests,
	"quota_exceeded": http.StatusTooManyRequests,
}

// toAPIError converts any error into the answer to send.
func toAPIError(err error) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	out := &apiError{Status: http.StatusInternalServerError, Code: "internal", cause: err}
	for _, c := range classStatus {
		if errors.Is(err, c.class) {
			out.Status, out.Code = c.status, c.code
			break
		}
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded) && out.Status == http.StatusInternalServerError:
		out.Status, out.Code = http.StatusGatewayTimeout, "timeout"
	case errors.Is(err, context.Canceled) && out.Status == http.StatusInternalServerError:
		// The client went away; the status is for the log only.
		out.Status, out.Code = statusClientClosed, "canceled"
	}
	var ce *errdefs.CodedError
	if errors.As(err, &ce) {
		if ce.Code != "" {
			out.Code = ce.Code
		}
		if s, ok := codeStatus[ce.Code]; ok {
			out.Status = s
		}
		out.Message, out.Hint, out.Details = ce.Message, ce.Hint, ce.Details
		out.RetryAfterMs = ce.RetryAfter.Milliseconds()
	} else {
		// An error without a code was not written for callers: its text
		// can name host paths or addresses. Say only what class it is.
		out.Message, out.uncoded = classMessage(out.Status), true
	}
	if out.Status >= 500 {
		// Never leak internal detail: a coded 503 says what it is in words
		// made for callers, anything else says only that it failed.
		if ce == nil || out.Status != http.StatusServiceUnavailable {
			out.Message, out.Hint, out.Details = genericMessage(out.Status), "", nil
		}
		if out.Status == http.StatusInternalServerError {
			out.Code = "internal"
		}
	}
	return out
}

// statusClientClosed is logged when the client hung up (nginx's 499).
const statusClientClosed = 499

// classMessage is the message of an uncoded error of a 4xx class.
func classMessage(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "The request is not valid."
	case http.StatusNotFound:
		return "Not found."
	case http.StatusConflict:
		return "The request conflicts with the sandbox's state."
	case http.StatusForbidden:
		return "Permission denied."
	}
	return genericMessage(status)
}

func genericMessage(status int) string {
	switch status {
	case http.StatusServiceUnavailable:
		return "The service is unavailable right now."
	case http.StatusGatewayTimeout:
		return "The operation took too long."
	case statusClientClosed:
		return "The client closed the request."
	default:
		return "Internal error."
	}
}

type errorBody struct {
	Error errorJSON `json:"error"`
}

type errorJSON struct {
	Code         string         `json:"code"`
	Status       int            `json:"status"`
	Message      string         `json:"message"`
	Hint         string         `json:"hint"`
	Details      map[string]any `json:"details,omitempty"`
	RequestID    string         `json:"requestId"`
	RetryAfterMs int64          `json:"retryAfterMs,omitempty"`
}

// writeError sends err in the error shape, logging the cause of a 5xx.
func (s *server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	ae := toAPIError(err)
	rid := requestID(r.Context())
	switch {
	case ae.Status == http.StatusServiceUnavailable && ae.RetryAfterMs > 0:
		// A planned answer (a sandbox moving, a node busy fetching), with
		// when to come back: not a failure of the server.
		s.log.LogAttrs(r.Context(), slog.LevelInfo, "request deferred",
			slog.String("request_id", rid), slog.String("method", r.Method),
			slog.String("path", r.URL.Path), slog.String("code", ae.Code), slog.Int64("retry_after_ms", ae.RetryAfterMs))
	case ae.Status >= 500 && ae.Status != http.StatusNotImplemented: // 501: a feature not built, not a failure
		s.log.LogAttrs(r.Context(), slog.LevelError, "request failed",
			slog.String("request_id", rid), slog.String("method", r.Method),
			slog.String("path", r.URL.Path), slog.Int("status", ae.Status),
			slog.String("code", ae.Code), slog.Any("err", errOr(ae.cause, err)))
	}
	if ae.Status < 500 && ae.uncoded {
		s.log.LogAttrs(r.Context(), slog.LevelInfo, "request refused",
			slog.String("request_id", rid), slog.Int("status", ae.Status), slog.Any("err", ae.cause))
	}
	if !keepable(ae) {
		markTransient(w)
	}
	status := ae.Status
	if status == statusClientClosed {
		status = http.StatusBadRequest // nobody reads it
	}
	if ae.Status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="emberbox"`)
	}
	if ae.RetryAfterMs > 0 {
		// Whole seconds, rounded up, for clients that read only the header.
		secs := (time.Duration(ae.RetryAfterMs)*time.Millisecond + time.Second - 1) / time.Second
		w.Header().Set("Retry-After", strconv.Itoa(int(secs)))
	}
	writeJSON(w, status, errorBody{Error: errorJSON{
		Code: ae.Code, Status: status, Message: ae.Message, Hint: ae.Hint,
		Details: ae.Details, RequestID: rid, RetryAfterMs: ae.RetryAfterMs,
	}})
}

func errOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
