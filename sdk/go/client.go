package emberbox

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// DefaultURL is the server a Client talks to when given no URL.
const DefaultURL = "http://127.0.0.1:8080"

// Retry policy, as the Python SDK's.
const (
	defaultMaxRetries = 4
	defaultBackoff    = 500 * time.Millisecond
	maxBackoff        = 8 * time.Second
	maxRetryAfter     = 60 * time.Second
	maxErrorBody      = 1 << 20
)

// Client calls an Emberbox server. It is safe for concurrent use.
type Client struct {
	baseURL string
	key     string

	// HTTPClient sends the requests; its Timeout should be zero, since
	// streams (exec, archives) last as long as their commands. Bound calls
	// with their contexts instead.
	HTTPClient *http.Client
	// MaxRetries is how often a failed call is tried again: transport
	// errors and 429/502/503/504 answers. Every call but a GET carries an
	// Idempotency-Key, the same on each try, so a retry does not repeat it.
	MaxRetries int
	// Backoff is the first wait between tries; it doubles up to 8 s, with
	// jitter. A Retry-After of up to 60 s from the server is honoured.
	Backoff time.Duration
	// UserAgent is sent with every request.
	UserAgent string
}

// NewClient returns a client of the server at baseURL (an origin such as
// http://127.0.0.1:8080; "" means DefaultURL) with the API key key.
func NewClient(baseURL, key string) (*Client, error) {
	if baseURL == "" {
		baseURL = DefaultURL
	}
	baseURL = strings.TrimRight(strings.TrimSpace(baseURL), "/")
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("emberbox: server URL must be http(s)://host[:port], got %q", baseURL)
	}
	if u.Path != "" || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("emberbox: server URL must be an origin (the API lives at /v1 on it), got %q", baseURL)
	}
	key = strings.TrimSpace(key)
	if key == "" {
		return nil, errors.New("emberbox: no API key (the server writes its admin key to <data-dir>/admin.key)")
	}
	if strings.ContainsFunc(key, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return nil, errors.New("emberbox: the API key contains whitespace or control characters")
	}
	return &Client{baseURL: baseURL, key: key, HTTPClient: &http.Client{}, MaxRetries: defaultMaxRetries,
		Backoff: defaultBackoff, UserAgent: "emberbox-go"}, nil
}

// BaseURL is the server's origin.
func (c *Client) BaseURL() string { return c.baseURL }

// request is one call. The body is bytes so that a retry can send it again.
type request struct {
	method, path string
	query        url.Values
	body         []byte
	json         bool // body is JSON; else octets, when there is one
	accept       string
	header       http.Header
	idemKey      string // for a call that is not a GET; default a fresh one
}

// jsonRequest makes a request with v as its JSON body.
func jsonRequest(method, path string, v any) (*request, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("emberbox: encoding the %s %s body: %w", method, path, err)
	}
	return &request{method: method, path: path, body: b, json: true}, nil
}

// NewIdempotencyKey returns a random key for a call's Idempotency-Key.
func NewIdempotencyKey() string {
	var b [16]byte
	_, _ = crand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// send makes the call, retrying as the policy says, and returns a 2xx
// answer whose body the caller must close. Every other answer is an
// *APIError.
func (c *Client) send(ctx context.Context, r *request) (*http.Response, error) {
	key := r.idemKey
	if key == "" && r.method != http.MethodGet {
		key = NewIdempotencyKey()
	}
	u := c.baseURL + r.path
	if len(r.query) > 0 {
		u += "?" + r.query.Encode()
	}
	for attempt := 1; ; attempt++ {
		req, err := http.NewRequestWithContext(ctx, r.method, u, bytes.NewReader(r.body))
		if err != nil {
			return nil, fmt.Errorf("emberbox: %s %s: %w", r.method, r.path, err)
		}
		if r.body == nil {
			req.Body, req.ContentLength = http.NoBody, 0
		}
		for k, vs := range r.header {
			req.Header[k] = vs
		}
		req.Header.Set("Authorization", "Bearer "+c.key)
		req.Header.Set("User-Agent", c.UserAgent)
		req.Header.Set("Accept", cmpOr(r.accept, "application/json"))
		switch {
		case r.json:
			req.Header.Set("Content-Type", "application/json")
		case r.body != nil:
			req.Header.Set("Content-Type", "application/octet-stream")
		}
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := c.HTTPClient.Do(req)
		if err != nil {
			if ctx.Err() != nil || attempt > c.MaxRetries {
				return nil, fmt.Errorf("emberbox: %s %s: %w", r.method, r.path, err)
			}
			if err := c.wait(ctx, attempt, 0); err != nil {
				return nil, err
			}
			continue
		}
		if resp.StatusCode >= 200 && resp.StatusCode < 300 {
			return resp, nil
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		resp.Body.Close()
		apiErr := errorFromResponse(resp.StatusCode, resp.Header, body)
		if attempt > c.MaxRetries || !apiErr.retryable() {
			return nil, apiErr
		}
		if err := c.wait(ctx, attempt, apiErr.RetryAfter); err != nil {
			return nil, err
		}
	}
}

// wait sleeps before retry number attempt: the server's Retry-After when
// it gave a sane one, else exponential backoff with jitter.
func (c *Client) wait(ctx context.Context, attempt int, retryAfter time.Duration) error {
	d := retryDelay(attempt, c.Backoff, retryAfter)
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func retryDelay(attempt int, base, retryAfter time.Duration) time.Duration {
	if retryAfter > 0 && retryAfter <= maxRetryAfter {
		return retryAfter
	}
	if base <= 0 {
		return 0
	}
	d := min(maxBackoff, base<<min(attempt-1, 16))
	return time.Duration(float64(d) * (0.75 + rand.Float64()*0.5))
}

// do sends the call and decodes a JSON answer into out (nil: discard it).
func (c *Client) do(ctx context.Context, r *request, out any) error {
	resp, err := c.send(ctx, r)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("emberbox: reading the answer of %s %s: %w", r.method, r.path, err)
	}
	return nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// sandboxPath is the path of a sandbox, and what follows it.
func sandboxPath(id, suffix string) string {
	return "/v1/sandboxes/" + url.PathEscape(id) + suffix
}
