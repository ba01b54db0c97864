package envd

import (
	"encoding/base64"
	"net/http"
	"testing"

	"github.com/emberbox/emberbox/internal/envd/proto/process"
	"github.com/emberbox/emberbox/internal/guest"
)

func TestTableForgetsOldest(t *testing.T) {
	tb := newTable[int](2)
	tb.put("a", "x", 1)
	tb.put("a", "y", 2)
	tb.put("a", "x", 3) // an update keeps its place
	tb.put("b", "z", 4)
	if _, ok := tb.get("a", "x"); ok {
		t.Error("the oldest entry was kept past the bound")
	}
	if v, ok := tb.get("a", "y"); !ok || v != 2 {
		t.Errorf("a/y = %d, %v", v, ok)
	}
	if got := tb.entries("b"); len(got) != 1 || got["z"] != 4 {
		t.Errorf("entries of b: %v", got)
	}
	tb.remove("a", "y")
	if got := tb.entries("a"); len(got) != 0 {
		t.Errorf("after remove: %v", got)
	}
}

func TestUserFrom(t *testing.T) {
	basic := func(s string) string { return "Basic " + base64.StdEncoding.EncodeToString([]byte(s)) }
	for _, tc := range []struct {
		header, want string
		ok           bool
	}{
		{"", "", true},
		{basic("root:"), "root", true},
		{basic("user:"), "user", true},
		{basic("user"), "user", true},
		{"Bearer x", "", false},
		{"Basic !!!", "", false},
	} {
		h := http.Header{}
		if tc.header != "" {
			h.Set("Authorization", tc.header)
		}
		got, err := userFrom(h)
		if got != tc.want || (err == nil) != tc.ok {
			t.Errorf("%q: %q, %v", tc.header, got, err)
		}
	}
}

func TestEndEvent(t *testing.T) {
	code := func(c int) *int { return &c }
	for _, tc := range []struct {
		r      *guest.ExecResult
		code   int32
		exited bool
		status string
	}{
		{&guest.ExecResult{ExitCode: code(0)}, 0, true, "exit status 0"},
		{&guest.ExecResult{ExitCode: code(2)}, 2, true, "exit status 2"},
		{&guest.ExecResult{ExitCode: code(-15)}, -1, false, "signal: terminated"},
		{&guest.ExecResult{State: "timed_out"}, -1, false, "signal: killed"},
		{nil, -1, false, "signal: killed"},
	} {
		end := endEvent(tc.r).GetEvent().(*process.ProcessEvent_End).End
		wantErr := tc.code != 0 || !tc.exited
		if end.GetExitCode() != tc.code || end.GetExited() != tc.exited || end.GetStatus() != tc.status ||
			(end.Error != nil) != wantErr || (wantErr && end.GetError() != tc.status) {
			t.Errorf("%+v: %v", tc.r, end)
		}
	}
}

func TestNames(t *testing.T) {
	for root, cases := range map[string]map[string]string{
		"/w":  {"/w/a": "a", "/w/a/b": "a/b", "/w": "w"},
		"/w/": {"/w/a": "a"},
		"/":   {"/a/b": "a/b"},
	} {
		for p, want := range cases {
			if got := relName(root, p); got != want {
				t.Errorf("relName(%q, %q) = %q, want %q", root, p, got, want)
			}
		}
	}
	for p, want := range map[string]bool{
		"/w/.a.txt.emberbox-0123456789ab": true,
		"/w/a.txt.emberbox-0123456789ab":  false,
		"/w/.a.txt.emberbox-tmp":          false,
		"/w/.a.txt":                       false,
	} {
		if got := isWriteTemp(p); got != want {
			t.Errorf("isWriteTemp(%q) = %v", p, got)
		}
	}
	for v, want := range map[string]bool{"gzip": true, "br, gzip;q=0.5": true, "gzip;q=0": false, "identity": false, "": false} {
		if got := acceptsGzip(v); got != want {
			t.Errorf("acceptsGzip(%q) = %v", v, got)
		}
	}
}
