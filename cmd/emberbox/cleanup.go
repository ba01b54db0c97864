package main

import (
	"context"
	"sync"
)

// cleanupStack undoes what serve built, in reverse: each subsystem pushes
// what takes it down once it is up, so that an error part way and a
// shutdown both take down exactly what is up, last made first.
type cleanupStack struct {
	fns []func()
}

// push adds f, to run before everything pushed earlier.
func (c *cleanupStack) push(f func()) {
	c.fns = append(c.fns, f)
}

// run runs what was pushed, last first, and empties the stack.
func (c *cleanupStack) run() {
	for i := len(c.fns) - 1; i >= 0; i-- {
		c.fns[i]()
	}
	c.fns = nil
}

// background runs the server's loops until its context is cancelled; the
// cleanup stack cancels it and waits for them.
type background struct {
	ctx context.Context
	wg  sync.WaitGroup
}

// run starts f in a goroutine of its own, with the loops' context.
func (b *background) run(f func(context.Context)) {
	b.wg.Go(func() { f(b.ctx) })
}
