// Command inpod is the workload of the in-pod benchmark on Kubernetes
// (bench/inpod-k8s.sh, bench/README.md "In-pod capture on Kubernetes"): a
// server and the clients that run in the benchmark's pods. It is packed as
// a static binary into an image, like Causeway's own commands, because the
// cluster has no registry and iperf3 (a dynamically linked Debian binary)
// cannot be packed as one file.
//
//	inpod serve                      sink on :5201, request/response on :5202
//	inpod idle                       block (a client pod's main process)
//	inpod stream -to HOST -t 10s     bulk throughput of one connection, as iperf3 -t
//	inpod crr -to HOST -t 10s -c 4   connect, 1-byte request/response, close, as netperf TCP_CRR
//	inpod gap -to HOST -rate 100 -t 60s -hold 8
//	                                 new connections at a fixed rate plus held
//	                                 ones pinged every 100 ms; reports failures
//	                                 and the longest time without a success
//
// Results are `bench: <name> <value> <unit>` lines (docs/design.md §9).
package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"sort"
	"sync"
	"syscall"
	"time"
)

const (
	sinkPort = "5201"
	rrPort   = "5202"
	// ioTimeout bounds every single read, write and dial of the clients
	// and the request/response server.
	ioTimeout = 5 * time.Second
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: inpod serve|idle|stream|crr|gap [flags]")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	to := fs.String("to", "", "server address (host, without port)")
	dur := fs.Duration("t", 10*time.Second, "how long to measure")
	conc := fs.Int("c", 4, "crr: concurrent clients")
	rate := fs.Int("rate", 100, "gap: new connections per second")
	hold := fs.Int("hold", 8, "gap: connections held open and pinged")
	name := fs.String("name", "", "prefix of the reported figures")
	_ = fs.Parse(os.Args[2:])
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(ctx)
	case "idle":
		<-ctx.Done()
	case "stream":
		err = stream(ctx, *to, *dur, *name)
	case "crr":
		err = crr(ctx, *to, *dur, *conc, *name)
	case "gap":
		err = gap(ctx, *to, *dur, *rate, *hold, *name)
	default:
		err = fmt.Errorf("unknown mode %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "inpod:", err)
		os.Exit(1)
	}
}

func report(prefix, name string, value float64, unit string) {
	if prefix != "" {
		name = prefix + "_" + name
	}
	fmt.Printf("bench: %s %.3f %s\n", name, value, unit)
}

// serve runs the sink (reads to EOF, answers with the byte count) and the
// request/response server (one byte back for each byte read).
func serve(ctx context.Context) error {
	sink, err := net.Listen("tcp", ":"+sinkPort)
	if err != nil {
		return err
	}
	rr, err := net.Listen("tcp", ":"+rrPort)
	if err != nil {
		return err
	}
	go func() { <-ctx.Done(); sink.Close(); rr.Close() }()
	go acceptLoop(sink, serveSink)
	acceptLoop(rr, serveRR)
	return nil
}

func acceptLoop(ln net.Listener, serve func(net.Conn)) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() { defer c.Close(); serve(c) }()
	}
}

// serveSink counts what arrives until the client half-closes (a stream
// that stalls for ioTimeout is dropped) and writes the count back.
func serveSink(c net.Conn) {
	buf := make([]byte, 256<<10)
	var n int64
	for {
		_ = c.SetReadDeadline(time.Now().Add(ioTimeout))
		k, err := c.Read(buf)
		n += int64(k)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return
		}
	}
	_ = c.SetWriteDeadline(time.Now().Add(ioTimeout))
	_ = binary.Write(c, binary.BigEndian, n)
}

// Request bytes: ping asks for an echo, last for an echo and the close.
const (
	ping = 1
	last = 2
)

// serveRR echoes single bytes until the client closes, stays silent for a
// minute (held connections are pinged every 100 ms) or sends last. The
// server closing first leaves TIME_WAIT on its side, so a client making
// thousands of connections a second does not run out of ports.
func serveRR(c net.Conn) {
	b := make([]byte, 1)
	for {
		_ = c.SetReadDeadline(time.Now().Add(time.Minute))
		if _, err := c.Read(b); err != nil {
			return
		}
		_ = c.SetWriteDeadline(time.Now().Add(ioTimeout))
		if _, err := c.Write(b); err != nil || b[0] == last {
			return
		}
	}
}

// stream sends for d and reports what the sink counted over the time to
// its answer (bytes still in buffers count only once they arrived).
func stream(ctx context.Context, host string, d time.Duration, prefix string) error {
	var dialer net.Dialer
	dctx, cancel := context.WithTimeout(ctx, ioTimeout)
	c, err := dialer.DialContext(dctx, "tcp", net.JoinHostPort(host, sinkPort))
	cancel()
	if err != nil {
		return err
	}
	defer c.Close()
	buf := make([]byte, 256<<10)
	start := time.Now()
	for end := start.Add(d); time.Now().Before(end) && ctx.Err() == nil; {
		_ = c.SetWriteDeadline(time.Now().Add(ioTimeout))
		if _, err := c.Write(buf); err != nil {
			return fmt.Errorf("stream: %w", err)
		}
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return err
	}
	_ = c.SetReadDeadline(time.Now().Add(2 * ioTimeout))
	var n int64
	if err := binary.Read(c, binary.BigEndian, &n); err != nil {
		return fmt.Errorf("stream: the sink's count: %w", err)
	}
	report(prefix, "throughput", float64(n)/time.Since(start).Seconds()/1e6, "MB/s")
	return nil
}

// exchange opens a connection, sends one byte, reads it back and the
// server's close, and closes.
func exchange(ctx context.Context, addr string) error {
	var dialer net.Dialer
	dctx, cancel := context.WithTimeout(ctx, ioTimeout)
	defer cancel()
	c, err := dialer.DialContext(dctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := request(c, last); err != nil {
		return err
	}
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		return fmt.Errorf("want the server's close, got %v", err)
	}
	return nil
}

// request sends one request byte and reads its echo.
func request(c net.Conn, kind byte) error {
	_ = c.SetDeadline(time.Now().Add(ioTimeout))
	if _, err := c.Write([]byte{kind}); err != nil {
		return err
	}
	b := make([]byte, 1)
	if _, err := io.ReadFull(c, b); err != nil {
		return err
	}
	if b[0] != kind {
		return fmt.Errorf("echo %d, want %d", b[0], kind)
	}
	return nil
}

// crr runs c clients that each connect, exchange one byte and close, for d.
func crr(ctx context.Context, host string, d time.Duration, c int, prefix string) error {
	addr := net.JoinHostPort(host, rrPort)
	var mu sync.Mutex
	var done, failed int
	var firstErr error
	end := time.Now().Add(d)
	start := time.Now()
	var wg sync.WaitGroup
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) && ctx.Err() == nil {
				err := exchange(ctx, addr)
				mu.Lock()
				if err != nil {
					failed++
					if firstErr == nil {
						firstErr = err
					}
				} else {
					done++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return fmt.Errorf("crr: %d of %d connections failed, first: %w", failed, failed+done, firstErr)
	}
	report(prefix, "connections", float64(done)/time.Since(start).Seconds(), "conn/s")
	return nil
}

// gap measures availability during a disruption: a new connection with
// one exchange every 1/rate seconds, and hold connections opened at the
// start and pinged every 100 ms until they fail. It reports the failed new
// connections, the longest time between two successful ones, when the
// failures started and ended (seconds from the start), and how long each
// held connection lived.
func gap(ctx context.Context, host string, d time.Duration, rate, hold int, prefix string) error {
	addr := net.JoinHostPort(host, rrPort)
	start := time.Now()
	held := make([]time.Duration, hold)
	var hwg sync.WaitGroup
	for i := range hold {
		var dialer net.Dialer
		c, err := dialer.DialContext(ctx, "tcp", addr)
		if err != nil {
			return fmt.Errorf("gap: held connection: %w", err)
		}
		hwg.Add(1)
		go func() {
			defer hwg.Done()
			defer c.Close()
			t := time.NewTicker(100 * time.Millisecond)
			defer t.Stop()
			for time.Since(start) < d {
				if request(c, ping) != nil {
					break
				}
				<-t.C
			}
			held[i] = time.Since(start)
		}()
	}

	type outcome struct {
		at time.Duration // when the attempt started
		ok bool
	}
	var mu sync.Mutex
	var outcomes []outcome
	var wg sync.WaitGroup
	t := time.NewTicker(time.Second / time.Duration(rate))
	for time.Since(start) < d && ctx.Err() == nil {
		<-t.C
		wg.Add(1)
		go func(at time.Duration) {
			defer wg.Done()
			err := exchange(ctx, addr)
			mu.Lock()
			outcomes = append(outcomes, outcome{at, err == nil})
			mu.Unlock()
		}(time.Since(start))
	}
	t.Stop()
	wg.Wait()
	hwg.Wait()

	sort.Slice(outcomes, func(i, j int) bool { return outcomes[i].at < outcomes[j].at })
	var failed int
	var longest, last time.Duration
	firstFail, lastFail := time.Duration(-1), time.Duration(-1)
	for _, o := range outcomes {
		if !o.ok {
			failed++
			if firstFail < 0 {
				firstFail = o.at
			}
			lastFail = o.at
			continue
		}
		longest = max(longest, o.at-last)
		last = o.at
	}
	longest = max(longest, d-last)
	report(prefix, "sent", float64(len(outcomes)), "conn")
	report(prefix, "failed", float64(failed), "conn")
	report(prefix, "longest_gap", longest.Seconds(), "s")
	if failed > 0 {
		report(prefix, "first_failure_at", firstFail.Seconds(), "s")
		report(prefix, "last_failure_at", lastFail.Seconds(), "s")
	}
	sort.Slice(held, func(i, j int) bool { return held[i] < held[j] })
	for i, h := range held {
		report(prefix, fmt.Sprintf("held_%d_lived", i), h.Seconds(), "s")
	}
	return nil
}
