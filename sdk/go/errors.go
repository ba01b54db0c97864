package emberbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// APIError is an error answer of the server, in its one error shape
// {"error":{code,status,message,hint,details,requestId,retryAfterMs}}.
// Use errors.As to reach it.
type APIError struct {
	Code       string
	Status     int
	Message    string
	Hint       string
	Details    map[string]any
	RequestID  string
	RetryAfter time.Duration // how long the server asked to wait; 0: not said
	// Retryable is the server's own word on retrying, when it gave one.
	Retryable *bool
}

func (e *APIError) Error() string {
	s := fmt.Sprintf("%s (HTTP %d): %s", e.Code, e.Status, e.Message)
	if e.Hint != "" {
		s += " " + e.Hint
	}
	return s
}

// IsNotFound reports whether err is an API error with status 404.
func IsNotFound(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Status == http.StatusNotFound
}

// deliberateCodes are refusals that no retry can change.
var deliberateCodes = map[string]bool{
	"unavailable": true, "unsupported": true, "not_implemented": true, "fork_unavailable": true,
	"previews_unavailable": true, "resize_unavailable": true, "snapshots_unavailable": true,
	"checkpoints_unavailable": true, "webhooks_unavailable": true, "events_unavailable": true,
	"egress_secrets_unavailable": true, "apps_unavailable": true,
}

// retryable is the retry rule of the Python SDK: 429/502/503/504 unless
// the answer says otherwise, never a deliberate refusal.
func (e *APIError) retryable() bool {
	if deliberateCodes[e.Code] {
		return false
	}
	if e.Retryable != nil {
		return *e.Retryable
	}
	switch e.Status {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// errorPayload is the JSON inside "error".
type errorPayload struct {
	Code         string         `json:"code"`
	Status       int            `json:"status"`
	Message      string         `json:"message"`
	Hint         string         `json:"hint"`
	Details      map[string]any `json:"details"`
	RequestID    string         `json:"requestId"`
	RetryAfterMs *int64         `json:"retryAfterMs"`
	Retryable    *bool          `json:"retryable"`
}

func (p *errorPayload) toError(status int, requestID string) *APIError {
	e := &APIError{Code: p.Code, Status: p.Status, Message: p.Message, Hint: p.Hint, Details: p.Details,
		RequestID: p.RequestID, Retryable: p.Retryable}
	if e.Status == 0 {
		e.Status = status
	}
	if e.RequestID == "" {
		e.RequestID = requestID
	}
	if e.Code == "" {
		e.Code = "http_" + strconv.Itoa(e.Status)
	}
	if e.Message == "" {
		e.Message = http.StatusText(e.Status)
	}
	if p.RetryAfterMs != nil && *p.RetryAfterMs >= 0 {
		e.RetryAfter = time.Duration(*p.RetryAfterMs) * time.Millisecond
	}
	return e
}

// errorFromResponse reads an error answer; a body that is not the error
// shape still gives an APIError with the status.
func errorFromResponse(status int, header http.Header, body []byte) *APIError {
	var wrap struct {
		Error errorPayload `json:"error"`
	}
	_ = json.Unmarshal(body, &wrap)
	e := wrap.Error.toError(status, header.Get("X-Request-Id"))
	if e.RetryAfter == 0 {
		if secs, err := strconv.ParseFloat(header.Get("Retry-After"), 64); err == nil && secs >= 0 {
			e.RetryAfter = time.Duration(secs * float64(time.Second))
		}
	}
	return e
}
