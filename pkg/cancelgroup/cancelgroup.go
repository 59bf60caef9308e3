// Package cancelgroup holds a cancellable context for many long-lived
// dependants that each register what to do when it ends.
//
// context.WithCancel keeps each registration (context.AfterFunc, a derived
// context) in a Go map, which keeps the room of its largest size: a node
// proxy that relayed 10,000 connections at once under one drain context
// held that map's ~0.5 MB for good (issue 36). A Context keeps its
// registrations in a shrinkmap.Map, which gives a burst's room back, and
// implements AfterFunc, so that context.AfterFunc and derived contexts use
// it instead of a map of their own; a caller that registers through
// Context.AfterFunc directly also spares the context context.AfterFunc
// makes per registration.
package cancelgroup

import (
	"context"
	"sync"
	"time"

	"github.com/causeway-mesh/causeway/pkg/shrinkmap"
)

// Context is done once its cancel function is called.
type Context struct {
	done chan struct{}

	mu    sync.Mutex
	err   error
	next  uint64
	funcs shrinkmap.Map[uint64, func()]
}

var _ interface {
	context.Context
	AfterFunc(func()) func() bool
} = (*Context)(nil)

// New returns a Context and the function that cancels it.
func New() (*Context, context.CancelFunc) {
	c := &Context{done: make(chan struct{})}
	return c, c.cancel
}

func (c *Context) Deadline() (time.Time, bool) { return time.Time{}, false }
func (c *Context) Done() <-chan struct{}       { return c.done }
func (c *Context) Value(any) any               { return nil }

func (c *Context) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// AfterFunc runs f on a goroutine of its own once c is cancelled (at once
// if it is); stop keeps it from running and reports whether it did.
func (c *Context) AfterFunc(f func()) (stop func() bool) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		go f()
		return func() bool { return false }
	}
	c.next++
	id := c.next
	c.funcs.Set(id, f)
	c.mu.Unlock()
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		if _, ok := c.funcs.Get(id); !ok {
			return false
		}
		c.funcs.Delete(id)
		return true
	}
}

func (c *Context) cancel() {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = context.Canceled
	close(c.done)
	var fs []func()
	for id := range c.funcs.Keys() {
		f, _ := c.funcs.Get(id)
		fs = append(fs, f)
	}
	c.funcs = shrinkmap.Map[uint64, func()]{}
	c.mu.Unlock()
	for _, f := range fs {
		go f()
	}
}
