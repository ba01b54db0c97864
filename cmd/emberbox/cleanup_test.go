package main

import (
	"slices"
	"testing"
)

func TestCleanupStackRunsInReverse(t *testing.T) {
	var c cleanupStack
	var got []int
	for i := range 3 {
		c.push(func() { got = append(got, i) })
	}
	c.run()
	if want := []int{2, 1, 0}; !slices.Equal(got, want) {
		t.Errorf("ran %v, want %v", got, want)
	}
	c.run() // emptied: nothing runs twice
	if len(got) != 3 {
		t.Errorf("a second run ran %v again", got[3:])
	}
}
