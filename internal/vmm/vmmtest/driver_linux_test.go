package vmmtest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/vmm"
	"github.com/emberbox/emberbox/internal/vmm/vmmtest"
)

func TestFakeDriver(t *testing.T) {
	n := 0
	vmmtest.TestDriver(t, vmmtest.NewDriver(t), func(t *testing.T) vmm.Spec {
		n++
		return vmm.Spec{ID: fmt.Sprintf("sbx_fake%d", n), Dir: t.TempDir()}
	})
}

func TestHangStarts(t *testing.T) {
	d := vmmtest.NewDriver(t)
	ctx := t.Context()
	spec := vmm.Spec{ID: "sbx_hang", Dir: t.TempDir()}
	d.HangStarts(1)

	hung, err := d.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := hung.DialGuest(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("DialGuest of a hung machine: %v, want the context's deadline", err)
	}
	// Stopping a hung machine ends a dial that waits for it.
	dialed := make(chan error, 1)
	go func() {
		_, err := hung.DialGuest(ctx)
		dialed <- err
	}()
	time.Sleep(10 * time.Millisecond)
	hung.Stop(ctx)
	select {
	case err := <-dialed:
		if !errors.Is(err, vmm.ErrGone) {
			t.Errorf("DialGuest of a hung machine that stopped: %v, want vmm.ErrGone", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("DialGuest still waits after Stop")
	}

	m, err := d.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := m.DialGuest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c, err := guest.Handshake(ctx, conn)
	if err != nil {
		t.Fatalf("the start after the hung one: %v", err)
	}
	c.Close()
	if got := d.Starts(); got != 2 {
		t.Errorf("Starts() = %d, want 2", got)
	}
	if d.Machine(spec.ID) != m || d.Machine("sbx_other") != nil {
		t.Error("Machine does not return the newest machine of a sandbox")
	}
}

func TestStopClosesGuestConnections(t *testing.T) {
	d := vmmtest.NewDriver(t)
	ctx := t.Context()
	m, err := d.Start(ctx, vmm.Spec{ID: "sbx_conn", Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := m.DialGuest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c, err := guest.Handshake(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m.Stop(ctx)
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the guest session outlived its machine")
	}
	if !d.Machine("sbx_conn").Stopped() {
		t.Error("Stopped() = false after Stop")
	}
}
