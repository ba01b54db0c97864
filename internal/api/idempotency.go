package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/emberbox/emberbox/internal/faultpoint"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// Idempotency-Key handling.
//
// A request with a key reserves it with a fingerprint of its method, path
// and query, and body. The JSON answer is stored and replayed, with
// "replayed": true, to a retry with the same fingerprint; a retry with a
// different one is refused with 422. A retry while the first request still
// runs waits for its answer.
//
// Not stored, and the reservation released so that a retry runs again:
//   - 5xx answers (and panics): the work failed or may not have happened, and
//     the SDK retries 502/503/504 with the same key, which must then run.
//   - NDJSON answers (streamed exec): the answer is the live output of a
//     process, unbounded and possibly cut off part way, so no stored copy
//     could be replayed faithfully. The SDK never re-sends a stream that got
//     as far as its "start" event: it follows the process through
//     /processes/{pid}/output from its cursor instead. A retry with the same
//     key therefore only happens when the first try never started, and then
//     running it is right.
//   - Answers that say "not now": the client went away (logged as 499), 429,
//     anything with a retryAfterMs, and the codes of a state that passes
//     (transientCodes). A retry must run again, not get the stale refusal.
//
// An answer over the store's size limit (an exec's large output) is kept
// without its body. Its retry gets 409 idempotency_answer_too_large and is
// not run again: the SDK sends a retry only when it lost the first answer,
// and running a command twice is worse than a clear error, which the SDK
// does not retry. A new key runs it again.

func validIdempotencyKey(key string) bool {
	if len(key) < 1 || len(key) > 128 {
		return false
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9',
			c == '_', c == '.', c == ':', c == '-':
		default:
			return false
		}
	}
	return true
}

// fingerprint identifies a request's content: method, path with query, and
// body, each length-prefixed so no two requests run together.
func fingerprint(method, target string, body []byte) string {
	h := sha256.New()
	for _, part := range [][]byte{[]byte(method), []byte(target), body} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		h.Write(n[:])
		h.Write(part)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func (s *server) idempotent(w http.ResponseWriter, r *http.Request, c *call, key string, run func(http.ResponseWriter)) {
	if !validIdempotencyKey(key) {
		s.writeError(w, r, invalid([]issue{{Path: "Idempotency-Key",
			Message: "must be 1 to 128 characters from A-Z a-z 0-9 _ . : -"}}))
		return
	}
	if s.idem == nil {
		run(w)
		return
	}
	ctx := r.Context()
	fp := fingerprint(r.Method, r.URL.RequestURI(), c.body)
	deadline := s.now().Add(s.idemPollMax)
	for {
		rec, reserved, err := s.idem.Reserve(ctx, c.owner, key, fp)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		if reserved {
			s.runReserved(w, r, c.owner, key, run)
			return
		}
		if rec.Fingerprint != fp {
			s.writeError(w, r, newError(http.StatusUnprocessableEntity, "idempotency_key_reused",
				"This Idempotency-Key was used with a different request.").
				withHint("Use a new key for a new request; reuse a key only to retry the same request."))
			return
		}
		if rec.Status != 0 && rec.Omitted > 0 {
			e := newError(http.StatusConflict, "idempotency_answer_too_large",
				"The request with this Idempotency-Key ran, but its answer was too large to keep for a replay.").
				withHint("It is not run again with this key. Send it with a new Idempotency-Key to run it again, " +
					"or stream its output (stream: true).")
			e.Details = map[string]any{"status": rec.Status, "answerBytes": rec.Omitted}
			s.writeError(w, r, e)
			return
		}
		if rec.Status != 0 && rec.SandboxID != "" && len(rec.Body) == 0 {
			s.replaySandbox(w, r, c, rec)
			return
		}
		if rec.Status != 0 {
			replay(w, rec)
			return
		}
		if !s.now().Before(deadline) {
			e := newError(http.StatusConflict, "idempotency_in_progress",
				"A request with this Idempotency-Key is still running.").
				withHint("Retry later with the same key to get its answer.")
			e.RetryAfterMs = 1000
			s.writeError(w, r, e)
			return
		}
		t := time.NewTimer(s.idemPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// runReserved runs the handler, then stores or releases the reservation.
func (s *server) runReserved(w http.ResponseWriter, r *http.Request, owner, key string, run func(http.ResponseWriter)) {
	faultpoint.Hit("idempotency.reserved")
	rec := &recorder{ResponseWriter: w}
	// The outcome is recorded even if the client has gone.
	ctx := context.WithoutCancel(r.Context())
	release := func() {
		if err := s.idem.Release(ctx, owner, key); err != nil {
			s.log.LogAttrs(ctx, slog.LevelError, "releasing idempotency key",
				slog.String("request_id", requestID(ctx)), slog.Any("err", err))
		}
	}
	finished := false
	defer func() {
		if !finished { // a panic: let it reach the recovery after releasing
			release()
		}
	}()
	run(rec)
	finished = true
	// An error answered to a client that has gone is the cancellation,
	// whatever status it took: the retry must run.
	gone := r.Context().Err() != nil && rec.status >= 400
	if !rec.wrote || rec.streaming || rec.status >= 500 || rec.transient || gone || rec.Header().Get("Retry-After") != "" {
		release()
		return
	}
	faultpoint.Hit("idempotency.answered")
	if err := s.idem.Complete(ctx, owner, key, rec.status, rec.Header().Get("Content-Type"), rec.buf.Bytes()); err != nil {
		s.log.LogAttrs(ctx, slog.LevelError, "storing idempotent answer",
			slog.String("request_id", requestID(ctx)), slog.Any("err", err))
		release()
	}
}

// replay sends a stored answer with "replayed": true added to its top-level
// JSON object.
func replay(w http.ResponseWriter, rec *IdempotentResult) {
	body := rec.Body
	if isJSON(rec.ContentType) {
		body = markReplayed(body)
	}
	if rec.ContentType != "" {
		w.Header().Set("Content-Type", rec.ContentType)
	}
	w.Header().Set("Idempotency-Replayed", "true")
	w.WriteHeader(rec.Status)
	_, _ = w.Write(body)
}

// replaySandbox answers the retry of a create that a crash cut short after
// the sandbox was recorded: the answer is that sandbox as it is now, waited
// for as the request's Prefer header asks, never a second sandbox.
func (s *server) replaySandbox(w http.ResponseWriter, r *http.Request, c *call, rec *IdempotentResult) {
	sb, err := s.mgr.Get(r.Context(), c.owner, rec.SandboxID)
	if err == nil {
		sb, err = s.settle(r.Context(), c.owner, sb, preferWait(r), sandbox.StateRunning)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	body, err := json.Marshal(s.sandboxJSON(sb))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	replay(w, &IdempotentResult{Status: rec.Status, ContentType: "application/json", Body: append(body, '\n')})
}

func markReplayed(body []byte) []byte {
	trimmed := bytes.TrimRight(body, " \t\r\n")
	if len(trimmed) < 2 || trimmed[len(trimmed)-1] != '}' || bytes.TrimLeft(trimmed, " \t\r\n")[0] != '{' {
		return body
	}
	head := bytes.TrimRight(trimmed[:len(trimmed)-1], " \t\r\n")
	out := make([]byte, 0, len(body)+20)
	out = append(out, head...)
	if head[len(head)-1] != '{' {
		out = append(out, ',')
	}
	out = append(out, `"replayed":true}`...)
	return append(out, '\n')
}

func isJSON(contentType string) bool {
	return strings.HasPrefix(strings.ToLower(contentType), "application/json")
}

// recorder passes an answer through while keeping a copy of a JSON one.
type recorder struct {
	http.ResponseWriter
	status    int
	wrote     bool
	streaming bool // not JSON: passed through, not kept
	transient bool // an answer for now only (see keepable); not kept
	buf       bytes.Buffer
}

// transientCodes are refusals of a state that passes: a retry later may
// well succeed, so they are never replayed.
var transientCodes = map[string]bool{
	"idempotency_in_progress": true,
	"sandbox_not_ready":       true,
	"upload_committing":       true,
	"guest_busy":              true,
	"rate_limited":            true,
	"no_capacity":             true,
	"quota_exceeded":          true,
}

// keepable reports whether an error answer may be stored for replay.
func keepable(ae *apiError) bool {
	return ae.Status != statusClientClosed && ae.Status != http.StatusTooManyRequests &&
		ae.RetryAfterMs == 0 && !transientCodes[ae.Code]
}

// markTransient flags the recorder under w, if any, so that the answer
// being written is not kept.
func markTransient(w http.ResponseWriter) {
	for w != nil {
		if rec, ok := w.(*recorder); ok {
			rec.transient = true
			return
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return
		}
		w = u.Unwrap()
	}
}

func (w *recorder) WriteHeader(code int) {
	if w.wrote {
		return
	}
	w.wrote, w.status = true, code
	w.streaming = !isJSON(w.Header().Get("Content-Type"))
	w.ResponseWriter.WriteHeader(code)
}

func (w *recorder) Write(p []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	if !w.streaming {
		w.buf.Write(p)
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController flush through the recorder.
func (w *recorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Written reports whether the status line has gone out.
func (w *recorder) Written() bool { return w.wrote }
