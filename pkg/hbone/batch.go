package hbone

import (
	"net"
	"sync"
)

// maxKeptBatch bounds the batch buffer a connection keeps between writes.
const maxKeptBatch = 256 << 10

// recordBatcher sits between a TLS connection and its socket. crypto/tls
// sends every record (at most 16 KiB of payload) with its own write; while a
// batch is open the records are gathered and sent with one write when it
// closes, so a 128 KiB DATA frame costs one syscall instead of eight.
// Outside a batch (the handshake, alerts) writes go straight through.
type recordBatcher struct {
	net.Conn
	mu       sync.Mutex
	batching bool
	buf      []byte
}

func (b *recordBatcher) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.batching {
		return b.Conn.Write(p)
	}
	b.buf = append(b.buf, p...)
	return len(p), nil
}

// begin opens a batch.
func (b *recordBatcher) begin() {
	b.mu.Lock()
	b.batching = true
	b.mu.Unlock()
}

// end closes the batch and sends what it gathered.
func (b *recordBatcher) end() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.batching = false
	if len(b.buf) == 0 {
		return nil
	}
	_, err := b.Conn.Write(b.buf)
	if cap(b.buf) > maxKeptBatch {
		b.buf = nil
	} else {
		b.buf = b.buf[:0]
	}
	return err
}
