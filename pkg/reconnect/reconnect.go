// Package reconnect holds how the mesh's gRPC clients of the control plane
// (the xDS client, the CA client) come back after it was away: the client
// paces its attempts with a policy of its own, and each attempt it makes
// reaches the control plane at once. A gRPC channel that failed waits out
// a reconnect backoff of its own (1 s growing to 2 minutes by default) and
// stays in TransientFailure meanwhile, failing RPCs without trying; left in
// place, recovery waited out both backoffs. Conn replaces such a channel
// instead: an RPC on a fresh one makes exactly one connection attempt and
// ends with it.
package reconnect

import (
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
)

// Conn is a gRPC connection to one target whose channel is made anew when
// the last one failed.
type Conn struct {
	target string
	opts   []grpc.DialOption

	mu     sync.Mutex
	cc     *grpc.ClientConn
	closed bool
}

// NewConn checks target and opts (grpc.NewClient's errors) and returns a
// Conn; it connects with the first RPC.
func NewConn(target string, opts ...grpc.DialOption) (*Conn, error) {
	cc, err := grpc.NewClient(target, opts...)
	if err != nil {
		return nil, err
	}
	return &Conn{target: target, opts: opts, cc: cc}, nil
}

// Get returns the channel to make an RPC on: the current one, or a new one
// in place of one in TransientFailure (RPCs still on the old one fail, as
// they would have).
func (c *Conn) Get() *grpc.ClientConn {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.cc.GetState() != connectivity.TransientFailure {
		return c.cc
	}
	fresh, err := grpc.NewClient(c.target, c.opts...)
	if err != nil {
		return c.cc // not for options NewConn accepted
	}
	c.cc.Close()
	c.cc = fresh
	return c.cc
}

// Close closes the channel; Get then returns it closed.
func (c *Conn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	return c.cc.Close()
}

// Backoff is a reconnection policy: waits doubling from Initial up to Max,
// each drawn in [b/2, b] ("equal jitter": clients that lost the control
// plane together do not come back together, and none waits less than
// half).
type Backoff struct {
	Initial, Max time.Duration
	next         time.Duration
}

// Next is the wait before the next attempt.
func (b *Backoff) Next() time.Duration {
	if b.next == 0 {
		b.next = b.Initial
	}
	d := b.next
	b.next = min(b.next*2, b.Max)
	return d/2 + rand.N(d/2+1)
}

// Reset starts over at Initial (after a stable connection).
func (b *Backoff) Reset() { b.next = 0 }
