package hbone

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
)

// Splice returns a Stream that joins the tunnel with upstream (see Join).
func Splice(upstream net.Conn) Stream {
	return StreamFunc(func(ctx context.Context, tunnel net.Conn) {
		Join(ctx, tunnel, upstream)
	})
}

// Join copies between a and b in both directions until both are done, then
// closes both. When one side ends its direction (EOF) the other side's
// write direction is closed (CloseWrite) and the opposite direction keeps
// flowing. An error in either direction, or ctx ending, aborts both: a
// tunnel is reset, a TCP connection is closed with RST. It returns the
// bytes copied each way and the first error (nil when both ended cleanly).
// Tunnels are copied from their receive buffers and TCP sockets are read
// only when readable, so an idle pair holds no copy buffer.
func Join(ctx context.Context, a, b net.Conn) (aToB, bToA int64, err error) {
	var (
		once     sync.Once
		firstErr error
	)
	abort := func(cause error) {
		once.Do(func() {
			firstErr = cause
			abortConn(a)
			abortConn(b)
		})
	}
	stop := context.AfterFunc(ctx, func() { abort(ctx.Err()) })
	defer stop()

	done := make(chan struct{})
	go func() {
		defer close(done)
		aToB = copyHalf(b, a, abort)
	}()
	bToA = copyHalf(a, b, abort)
	<-done
	once.Do(func() {
		// Both directions ended cleanly.
		a.Close()
		b.Close()
	})
	return aToB, bToA, firstErr
}

// copyHalf copies src to dst; at EOF it closes dst's write direction. On
// error it aborts both connections.
func copyHalf(dst, src net.Conn, abort func(error)) int64 {
	var (
		n   int64
		err error
	)
	switch {
	case isStream(src):
		n, err = src.(io.WriterTo).WriteTo(dst)
	case isStream(dst):
		n, err = dst.(io.ReaderFrom).ReadFrom(src)
	default:
		n, err = io.Copy(dst, src)
	}
	if err != nil {
		abort(err)
		return n
	}
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		if err := cw.CloseWrite(); err != nil && !errors.Is(err, net.ErrClosed) {
			abort(err)
		}
	}
	return n
}

func isStream(c net.Conn) bool {
	_, ok := c.(*stream)
	return ok
}

// abortConn closes c so that the peer sees a failure, not a clean end.
func abortConn(c net.Conn) {
	switch c := c.(type) {
	case *net.TCPConn:
		c.SetLinger(0)
	case *stream:
		c.abort()
		return
	}
	c.Close()
}
