package hbone

import (
	"context"
	"io"
	"net"
	"runtime"
	"testing"
	"time"
)

// BenchmarkSmallExchanges is request/response traffic as a waypoint carries
// it: 32 tunnels (one per goroutine) on one connection, each sending a 100-byte request and
// reading a 200-byte answer, both small writes of their own.
func BenchmarkSmallExchanges(b *testing.B) {
	const tunnels, reqSize, respSize = 32, 100, 200
	m := newMesh(b)
	h := HandlerFunc(func(ctx context.Context, r *Request) (Stream, error) {
		return StreamFunc(func(ctx context.Context, tunnel net.Conn) {
			req, resp := make([]byte, reqSize), make([]byte, respSize)
			for {
				if _, err := io.ReadFull(tunnel, req); err != nil {
					return
				}
				if _, err := tunnel.Write(resp); err != nil {
					return
				}
			}
		}), nil
	})
	_, addr := startServer(b, m, h, nil)
	p := newPool(b, m, nil)
	tg := m.target(addr, "127.0.0.1:80")
	warm, err := p.Dial(ctxTimeout(b, 30*time.Second), tg) // the connection
	if err != nil {
		b.Fatal(err)
	}
	warm.Close()
	b.SetParallelism((tunnels + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		c, err := p.Dial(ctxTimeout(b, 30*time.Second), tg)
		if err != nil {
			b.Error(err)
			return
		}
		defer c.Close()
		req, resp := make([]byte, reqSize), make([]byte, respSize)
		for pb.Next() {
			if _, err := c.Write(req); err != nil {
				b.Error(err)
				return
			}
			if _, err := io.ReadFull(c, resp); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
