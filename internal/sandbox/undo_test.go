package sandbox

import (
	"slices"
	"testing"
)

func TestUndo(t *testing.T) {
	var got []int
	var u undo
	u.add(func() { got = append(got, 1) })
	u.add(func() { got = append(got, 2) })
	u.run()
	u.run() // runs once
	if want := []int{2, 1}; !slices.Equal(got, want) {
		t.Errorf("run: got %v, want %v", got, want)
	}
	got = nil
	u.add(func() { got = append(got, 3) })
	u.keep()
	u.add(func() { got = append(got, 4) })
	u.run()
	if want := []int{4}; !slices.Equal(got, want) {
		t.Errorf("keep then run: got %v, want %v", got, want)
	}
}
