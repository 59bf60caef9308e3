package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/causeway-mesh/causeway/bench/internal/peers"
)

// Pod B's app runs in a child process (this program with -app): the
// server ends of the idle connections need file descriptors of their own,
// and a separate process is what pod B is. The child says "ready", then
// one "bulk <bytes> <unix-nanoseconds> <error or ->" line per bulk stream.

type bulkResult struct {
	bytes int64
	at    time.Time // when the end of the stream arrived
	err   error
}

// appProcess is the running child.
type appProcess struct {
	cmd      *exec.Cmd
	bulkDone chan bulkResult
	exited   chan struct{}
	stdin    io.WriteCloser
}

// startApp starts pod B's app; with tlsDir (the peers' PKI) it also serves
// the three ports with TLS on tlsAppIP.
func startApp(ctx context.Context, tlsDir string) (*appProcess, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, self, "-app", "-app-tls", tlsDir)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("pod B app: %w", err)
	}
	a := &appProcess{cmd: cmd, bulkDone: make(chan bulkResult, 1), exited: make(chan struct{}), stdin: stdin}
	ready := make(chan error, 1)
	go func() {
		defer close(a.exited)
		sc := bufio.NewScanner(out)
		first := true
		for sc.Scan() {
			line := sc.Text()
			if first {
				first = false
				if line != "ready" {
					ready <- fmt.Errorf("pod B app: %s", line)
					continue
				}
				ready <- nil
				continue
			}
			r, err := parseBulkLine(line)
			if err != nil {
				r = bulkResult{err: err}
			}
			select {
			case a.bulkDone <- r:
			default: // nobody measuring (a stray connection)
			}
		}
		if first {
			ready <- errors.New("pod B app exited before it was ready")
		}
		cmd.Wait()
	}()
	select {
	case err := <-ready:
		if err != nil {
			a.stop()
			return nil, err
		}
		return a, nil
	case <-time.After(30 * time.Second):
		a.stop()
		return nil, errors.New("pod B app not ready in 30s")
	}
}

func parseBulkLine(line string) (bulkResult, error) {
	f := strings.SplitN(line, " ", 4)
	if len(f) != 4 || f[0] != "bulk" {
		return bulkResult{}, fmt.Errorf("pod B app said %q", line)
	}
	n, err1 := strconv.ParseInt(f[1], 10, 64)
	ns, err2 := strconv.ParseInt(f[2], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return bulkResult{}, fmt.Errorf("pod B app said %q: %w", line, err)
	}
	r := bulkResult{bytes: n, at: time.Unix(0, ns)}
	if f[3] != "-" {
		r.err = fmt.Errorf("pod B: bulk stream ended after %d bytes: %s", n, f[3])
	}
	return r, nil
}

// stop ends the child: closing its stdin asks it to exit.
func (a *appProcess) stop() {
	a.stdin.Close()
	select {
	case <-a.exited:
	case <-time.After(10 * time.Second):
		a.cmd.Process.Kill()
		<-a.exited
	}
}

// runApp is the child: pod B's three servers until stdin closes, in plain
// TCP on appIP and, with tlsDir, in TLS on tlsAppIP.
func runApp(tlsDir string) error {
	var outMu sync.Mutex
	say := func(format string, args ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Fprintf(os.Stdout, format+"\n", args...)
	}
	s := &servers{conns: map[net.Conn]struct{}{}, report: func(r bulkResult) {
		msg := "-"
		if r.err != nil {
			msg = strings.ReplaceAll(r.err.Error(), "\n", " ")
		}
		say("bulk %d %d %s", r.bytes, r.at.UnixNano(), msg)
	}}
	var conf *tls.Config
	if tlsDir != "" {
		var err error
		if conf, err = peers.ServerTLS(tlsDir); err != nil {
			say("TLS: %v", err)
			return err
		}
	}
	for port, serve := range map[string]func(net.Conn){bulkPort: s.serveBulk, rrPort: serveRR, holdPort: serveHold} {
		for _, l := range []struct {
			ip   string
			conf *tls.Config
		}{{appIP, nil}, {tlsAppIP, conf}} {
			if l.ip == tlsAppIP && conf == nil {
				continue
			}
			ln, err := net.Listen("tcp", net.JoinHostPort(l.ip, port))
			if err != nil {
				s.close()
				say("listen: %v", err)
				return err
			}
			if l.conf != nil {
				ln = tls.NewListener(ln, l.conf)
			}
			s.lns = append(s.lns, ln)
			s.wg.Go(func() { s.accept(ln, serve) })
		}
	}
	say("ready")
	io.Copy(io.Discard, os.Stdin) // the parent closes it, or dies
	s.close()
	return nil
}

// servers are pod B's listeners and the connections they accepted.
type servers struct {
	lns    []net.Listener
	wg     sync.WaitGroup
	report func(bulkResult)

	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

func (s *servers) accept(ln net.Listener, serve func(net.Conn)) {
	for {
		c, err := ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		s.mu.Lock()
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Go(func() {
			defer func() {
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
				c.Close()
			}()
			serve(c)
		})
	}
}

// close stops the listeners and every open connection, and waits for the
// handlers.
func (s *servers) close() {
	for _, ln := range s.lns {
		ln.Close()
	}
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// serveBulk reads until the end of the stream and reports the count.
func (s *servers) serveBulk(c net.Conn) {
	buf := make([]byte, 256<<10)
	var n int64
	var err error
	for {
		// Bounded in time: a stalled sender ends the measurement.
		if err = c.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
			break
		}
		var k int
		k, err = c.Read(buf)
		n += int64(k)
		if err != nil {
			break
		}
	}
	r := bulkResult{bytes: n, at: time.Now()}
	if err != io.EOF {
		r.err = err
	}
	s.report(r)
}

// serveRR answers one request of rrSize bytes and closes first, as an
// HTTP/1.0 server would, so that TIME_WAIT stays on the server side.
func serveRR(c net.Conn) {
	if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return
	}
	buf := make([]byte, rrSize)
	if _, err := io.ReadFull(c, buf); err != nil {
		return
	}
	c.Write(buf)
}

// serveHold echoes one byte, then keeps the connection until the client
// closes it.
func serveHold(c net.Conn) {
	var b [1]byte
	if err := c.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
		return
	}
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return
	}
	if _, err := c.Write(b[:]); err != nil {
		return
	}
	if err := c.SetReadDeadline(time.Time{}); err != nil {
		return
	}
	io.Copy(io.Discard, c) // until the client (or close) ends it
}
