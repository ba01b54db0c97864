package sandbox_test

import (
	"strings"
	"testing"

	"github.com/emberbox/emberbox/internal/sandbox"
)

func TestHostname(t *testing.T) {
	for _, tt := range []struct{ name, id, want string }{
		{"", "sbx_0123abcd", "sbx-0123abcd"},
		{"My Agent_1", "sbx_1", "my-agent-1"},
		{"--__--", "sbx_2", "sbx-2"},
		{"ünïcode", "sbx_3", "n-code"},
		{strings.Repeat("a", 80), "sbx_4", strings.Repeat("a", 63)},
	} {
		if got := sandbox.Hostname(&sandbox.Sandbox{Name: tt.name, ID: tt.id}); got != tt.want {
			t.Errorf("hostname(%q, %q) = %q, want %q", tt.name, tt.id, got, tt.want)
		}
	}
}
