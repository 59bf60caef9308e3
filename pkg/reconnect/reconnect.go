// Package reconnect holds how the mesh's gRPC clients of the control plane
// (the xDS client, the CA client) come back after it was away: the client
// paces its attempts with a policy of its own, and each attempt it makes
// reaches the control plane at once. gRPC's channel has its own reconnect
// backoff (1 s growing to 2 minutes by default); left in place, an
// attempt made while that backoff runs fails without trying, so recovery
// waited out both.
package reconnect

import (
	"context"
	"math/rand/v2"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
)

// Wait bounds how long Now waits for the connection attempt it starts.
const Wait = 2 * time.Second

// Now makes a connection that failed (TransientFailure) try again now,
// and waits, at most Wait, for the attempt to end. A connection in any
// other state is left alone: an RPC on an idle one connects by itself.
func Now(ctx context.Context, conn *grpc.ClientConn) {
	if conn.GetState() != connectivity.TransientFailure {
		return
	}
	conn.ResetConnectBackoff()
	wctx, cancel := context.WithTimeout(ctx, Wait)
	defer cancel()
	for s := conn.GetState(); s != connectivity.Ready; s = conn.GetState() {
		if !conn.WaitForStateChange(wctx, s) {
			return
		}
		if s == connectivity.Connecting && conn.GetState() == connectivity.TransientFailure {
			return // the attempt failed: still away
		}
	}
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
