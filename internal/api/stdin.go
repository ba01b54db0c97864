package api

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"

	"github.com/emberbox/emberbox/internal/guest"
)

// maxWriteBody bounds the body of …:write: withruntime sends input in
// chunks of 1 MiB, base64 in JSON.
const maxWriteBody = maxBody*4/3 + 64<<10

// ptyJSON is a terminal's size on the wire.
type ptyJSON struct {
	Cols int `json:"cols"`
	Rows int `json:"rows"`
}

// ptyIssues checks a terminal size at path.
func ptyIssues(path string, p *ptyJSON) []issue {
	if p.Cols < 1 || p.Rows < 1 || p.Cols > guest.MaxPtySide || p.Rows > guest.MaxPtySide {
		return []issue{{Path: path, Message: fmt.Sprintf("cols and rows must be from 1 to %d", guest.MaxPtySide)}}
	}
	return nil
}

// spawnIO validates what a spawn asks of its input and output and fills req.
func spawnIO(body *spawnRequest, req *guest.ExecRequest) []issue {
	var issues []issue
	switch body.OutputEncoding {
	case "", "utf8", "base64":
		req.OutputEncoding = body.OutputEncoding
	default:
		issues = append(issues, issue{Path: "outputEncoding", Message: `must be "utf8" or "base64"`})
	}
	switch body.StdinMode {
	case "":
	case "pipe":
		req.StdinPipe = true
	default:
		issues = append(issues, issue{Path: "stdinMode", Message: `must be "pipe" or left out`})
	}
	if body.Pty != nil {
		issues = append(issues, ptyIssues("pty", body.Pty)...)
		req.Pty = &guest.PtySize{Cols: body.Pty.Cols, Rows: body.Pty.Rows}
		req.StdinPipe = false // a terminal takes input by itself
	}
	if (req.StdinPipe || req.Pty != nil) && (body.Stdin != nil || body.StdinBase64 != nil) {
		issues = append(issues, issue{Path: "stdin", Message: "give input with …:write to a process with stdinMode pipe or a pty"})
	}
	return issues
}

// writeRequest is the body of POST …/processes/{pid}:write.
type writeRequest struct {
	Base64 *string `json:"base64"`
	Data   *string `json:"data"`
	// Offset is the number of input bytes the caller knows were accepted
	// before this data; left out, the data goes after whatever was.
	Offset *int64 `json:"offset"`
	EOF    bool   `json:"eof"`
}

// writeAnswer is the process after a write; offset is how far its input
// was accepted.
type writeAnswer struct {
	processJSON
	Offset int64 `json:"offset"`
}

func (s processes) write(w http.ResponseWriter, r *http.Request, c *call) error {
	var body writeRequest
	if err := decode(c, &body); err != nil {
		return err
	}
	var data []byte
	var issues []issue
	switch {
	case body.Base64 != nil && body.Data != nil:
		issues = append(issues, issue{Path: "data", Message: "give data or base64, not both"})
	case body.Base64 != nil:
		b, err := base64.StdEncoding.DecodeString(*body.Base64)
		if err != nil {
			issues = append(issues, issue{Path: "base64", Message: "must be standard base64"})
		}
		data = b
	case body.Data != nil:
		data = []byte(*body.Data)
	}
	if len(data) > guest.MaxStdinBuffer {
		issues = append(issues, issue{Path: "base64", Message: "must be at most 1 MiB at a time"})
	}
	if body.Offset != nil && *body.Offset < 0 {
		issues = append(issues, issue{Path: "offset", Message: "must be 0 or more"})
	}
	if len(issues) > 0 {
		return invalid(sortIssues(issues))
	}
	return guestJSON(s.server, w, r, c, func(ctx context.Context, g guest.Handle) (*guest.ProcessInfo, error) {
		return g.Write(ctx, r.PathValue("pid"), data, body.Offset, body.EOF)
	}, func(p *guest.ProcessInfo) writeAnswer {
		return writeAnswer{processJSON: toProcessJSON(p), Offset: p.StdinOffset}
	})
}

func (s processes) resize(w http.ResponseWriter, r *http.Request, c *call) error {
	body, err := decodeChecked(c, func(body *ptyJSON) []issue { return ptyIssues("cols", body) })
	if err != nil {
		return err
	}
	return guestJSON(s.server, w, r, c, func(ctx context.Context, g guest.Handle) (*guest.ProcessInfo, error) {
		return g.Resize(ctx, r.PathValue("pid"), guest.PtySize{Cols: body.Cols, Rows: body.Rows})
	}, toProcessJSON)
}
