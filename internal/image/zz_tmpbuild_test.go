package image

import (
	"context"
	"log/slog"
	"os"
	"testing"
)

func TestTmpBuild(t *testing.T) {
	img, err := Ensure(context.Background(), Config{Progress: os.Stdout, Logger: slog.New(slog.NewTextHandler(os.Stdout, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", img)
}
