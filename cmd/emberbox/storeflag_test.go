package main

import (
	"path/filepath"
	"testing"
)

func TestStoreDSN(t *testing.T) {
	const url = "postgres://emberbox@db/emberbox"
	t.Setenv(storeEnv, "")
	if got, want := storeDSN("", "/data"), filepath.Join("/data", dbName); got != want {
		t.Errorf("no flag, no env: %q, want %q", got, want)
	}
	if got := storeDSN(url, "/data"); got != url {
		t.Errorf("flag: %q, want %q", got, url)
	}
	t.Setenv(storeEnv, "postgres://other@db/x")
	if got := storeDSN("", "/data"); got != "postgres://other@db/x" {
		t.Errorf("env: %q", got)
	}
	if got := storeDSN(url, "/data"); got != url {
		t.Errorf("flag over env: %q, want %q", got, url)
	}
}
