package l7

import (
	"context"
	"io"
	"sync"
	"sync/atomic"
)

// The bodies an exchange wraps: the caller's request body (counted, and
// the unbuffered rest tracked) and upstream response bodies that end their
// attempt when closed.

// requestBody is the request body as the exchange holds it: buffered for
// the policy, retries and mirrors (all of it when bodyDone), and the rest
// streamed.
type requestBody struct {
	body     []byte
	bodyDone bool
	stream   *trackedBody // the unbuffered rest, when !bodyDone
}

// countingBody counts the request body bytes read from the client.
type countingBody struct {
	io.ReadCloser
	n atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

func discard(body io.ReadCloser) {
	_, _ = io.CopyN(io.Discard, body, 64<<10)
	_ = body.Close()
}

// attemptDone ends an attempt once: the endpoint's outstanding count drops
// and the attempt's timer stops.
type attemptDone struct {
	ep     *endpoint
	cancel context.CancelFunc
	once   sync.Once
}

func (d *attemptDone) release() {
	d.once.Do(func() {
		d.ep.outstanding.Add(-1)
		d.cancel()
	})
}

// releaseBody ends an attempt when the response body is closed.
type releaseBody struct {
	io.ReadCloser
	attemptDone
}

func (b *releaseBody) Close() error {
	err := b.ReadCloser.Close()
	b.release()
	return err
}

// releaseRWBody is releaseBody for an upgraded (101) connection, which the
// proxy writes to as well.
type releaseRWBody struct {
	releaseBody
	io.Writer
}

// trackedBody streams a request body that was not buffered, counting what
// the upstream read: after a connect failure with nothing read, it can still
// go to another endpoint. Closing is left to the server.
type trackedBody struct {
	r io.Reader
	n atomic.Int64
}

func (b *trackedBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.n.Add(int64(n))
	return n, err
}

func (b *trackedBody) Close() error { return nil }
