package capture

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"golang.org/x/net/proxy"
)

// echoHandler answers Connected for port 7 and relays an echo; other ports
// are refused; hostnames other than "svc.shop" are unknown.
type echoHandler struct{ seen chan Conn }

func (h echoHandler) HandleOutbound(_ context.Context, c Conn) {
	defer c.Close()
	h.seen <- c
	d := c.Destination()
	switch {
	case d.Host != "" && d.Host != "svc.shop":
		c.Answer(HostUnknown)
	case d.Host == "" && d.Addr.Port() != 7, d.Host != "" && d.Port != 7:
		c.Answer(Refused)
	default:
		c.Answer(Connected)
		io.Copy(c, c)
	}
}

func startSOCKS(t *testing.T) (string, chan Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	seen := make(chan Conn, 10)
	s := &SOCKS5{Handler: echoHandler{seen}, Logger: zaptest.NewLogger(t), HandshakeTimeout: 2 * time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return ln.Addr().String(), seen
}

func dialVia(t *testing.T, socks, src, dst string) (net.Conn, error) {
	t.Helper()
	fwd := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	d, err := proxy.SOCKS5("tcp", socks, nil, fwd)
	if err != nil {
		t.Fatal(err)
	}
	return d.Dial("tcp", dst)
}

func TestSOCKS5ConnectAddressAndHost(t *testing.T) {
	socks, seen := startSOCKS(t)
	for _, tc := range []struct {
		dst  string
		want Destination
	}{
		{"127.0.20.1:7", Destination{Addr: netip.MustParseAddrPort("127.0.20.1:7")}},
		{"[::1]:7", Destination{Addr: netip.MustParseAddrPort("[::1]:7")}},
		{"svc.shop:7", Destination{Host: "svc.shop", Port: 7}},
	} {
		c, err := dialVia(t, socks, "127.0.10.1", tc.dst)
		if err != nil {
			t.Fatalf("%s: %v", tc.dst, err)
		}
		got := <-seen
		if got.Destination() != tc.want {
			t.Errorf("destination = %+v, want %+v", got.Destination(), tc.want)
		}
		if got.Source().Addr() != netip.MustParseAddr("127.0.10.1") {
			t.Errorf("source = %v, want 127.0.10.1", got.Source())
		}
		msg := []byte("hello " + tc.dst)
		c.Write(msg)
		buf := make([]byte, len(msg))
		if _, err := io.ReadFull(c, buf); err != nil || !bytes.Equal(buf, msg) {
			t.Errorf("echo = %q, %v", buf, err)
		}
		c.Close()
	}
}

func TestSOCKS5Refusals(t *testing.T) {
	socks, seen := startSOCKS(t)
	if _, err := dialVia(t, socks, "127.0.10.1", "127.0.20.1:8"); err == nil {
		t.Fatal("refused destination connected")
	}
	<-seen
	if _, err := dialVia(t, socks, "127.0.10.1", "nowhere.shop:7"); err == nil {
		t.Fatal("unknown host connected")
	}
	<-seen

	// Protocol errors never reach the handler.
	for name, raw := range map[string][]byte{
		"socks4":       {4, 1, 0, 80, 127, 0, 0, 1, 0},
		"auth only":    {5, 1, 2},
		"bind command": {5, 1, 0, 5, 2, 0, 1, 127, 0, 0, 1, 0, 80},
		"bad atyp":     {5, 1, 0, 5, 1, 0, 9, 1, 2},
		"port zero":    {5, 1, 0, 5, 1, 0, 1, 127, 0, 0, 1, 0, 0},
		"truncated":    {5, 1, 0, 5, 1, 0, 4, 0, 0},
	} {
		c, err := net.Dial("tcp", socks)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(raw)
		if cw, ok := c.(*net.TCPConn); ok {
			cw.CloseWrite()
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		reply, _ := io.ReadAll(c)
		c.Close()
		// A success is the method choice (5,0) followed by reply code 0.
		if bytes.HasPrefix(reply, []byte{5, 0, 5, repSucceeded}) {
			t.Errorf("%s: request succeeded: %v", name, reply)
		}
		select {
		case c := <-seen:
			t.Errorf("%s: reached handler with %v", name, c.Destination())
		default:
		}
	}
}

func FuzzSOCKS5Handshake(f *testing.F) {
	f.Add([]byte{5, 1, 0, 5, 1, 0, 1, 127, 0, 0, 1, 0, 80})
	f.Add([]byte{5, 1, 0, 5, 1, 0, 3, 8, 's', 'v', 'c', '.', 's', 'h', 'o', 'p', 0, 80})
	f.Add([]byte{5, 1, 0, 5, 1, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 80})
	f.Fuzz(func(t *testing.T, in []byte) {
		a, b := net.Pipe()
		defer a.Close()
		go func() {
			a.Write(in)
			a.Close()
		}()
		go io.Copy(io.Discard, a)
		b.SetDeadline(time.Now().Add(time.Second))
		d, _, err := handshake(b)
		b.Close()
		if err == nil && d.Host == "" && !d.Addr.IsValid() {
			t.Fatalf("accepted invalid destination %+v", d)
		}
	})
}

// outcomeHandler answers every request with one outcome.
type outcomeHandler struct {
	o    Outcome
	seen chan Destination
}

func (h outcomeHandler) HandleOutbound(_ context.Context, c Conn) {
	h.seen <- c.Destination()
	c.Answer(h.o)
	c.Close()
}

// scriptedConn is a client that sends a fixed script and then half-closes,
// recording what the server writes.
type scriptedConn struct {
	net.Conn // only the methods below are called
	in       *bytes.Reader
	out      bytes.Buffer
}

func (c *scriptedConn) Read(b []byte) (int, error)  { return c.in.Read(b) }
func (c *scriptedConn) Write(b []byte) (int, error) { return c.out.Write(b) }
func (c *scriptedConn) Close() error                { return nil }
func (c *scriptedConn) RemoteAddr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}
}
func (c *scriptedConn) SetDeadline(time.Time) error      { return nil }
func (c *scriptedConn) SetWriteDeadline(time.Time) error { return nil }

// FuzzSOCKS5Exchange runs a whole exchange, request bytes in and the
// server's method selection and reply out, and checks what the server
// writes: a well-formed method selection, then at most one well-formed
// reply whose code is the handler's outcome, or a refusal code when the
// request never reached the handler.
func FuzzSOCKS5Exchange(f *testing.F) {
	f.Add([]byte{5, 1, 0, 5, 1, 0, 1, 127, 0, 0, 1, 0, 80}, byte(Connected))
	f.Add([]byte{5, 1, 0, 5, 1, 0, 3, 8, 's', 'v', 'c', '.', 's', 'h', 'o', 'p', 0, 80}, byte(HostUnknown))
	f.Add([]byte{5, 2, 2, 0, 5, 2, 0, 1, 127, 0, 0, 1, 0, 80}, byte(Refused))
	f.Add([]byte{5, 1, 0, 5, 1, 0, 9}, byte(Unreachable))
	f.Add([]byte{5, 1, 2}, byte(Connected))
	f.Fuzz(func(t *testing.T, in []byte, outcome byte) {
		seen := make(chan Destination, 1)
		s := &SOCKS5{Handler: outcomeHandler{Outcome(outcome % 8), seen}, Logger: zap.NewNop(), HandshakeTimeout: time.Second}
		conn := &scriptedConn{in: bytes.NewReader(in)}
		s.serveConn(context.Background(), conn)
		got := conn.out.Bytes()
		var dest *Destination
		select {
		case d := <-seen:
			dest = &d
		default:
		}
		if len(got) == 0 {
			if dest != nil {
				t.Fatal("handler reached without a method selection")
			}
			return
		}
		if len(got) < 2 || got[0] != 5 || (got[1] != methodNoAuth && got[1] != methodNoAcceptable) {
			t.Fatalf("bad method selection % x", got)
		}
		reply := got[2:]
		if len(reply) == 0 {
			if dest != nil {
				t.Fatal("handler answered but no reply was written")
			}
			return
		}
		if got[1] == methodNoAcceptable {
			t.Fatalf("reply % x after refusing every method", reply)
		}
		if len(reply) != 10 || reply[0] != 5 || reply[2] != 0 || reply[3] != atypIPv4 {
			t.Fatalf("malformed reply % x", reply)
		}
		switch {
		case dest == nil && reply[1] == repSucceeded:
			t.Fatal("success reply for a request the handler never saw")
		case dest != nil && (dest.Host == "" && !dest.Addr.IsValid() || dest.Host == "" && dest.Addr.Port() == 0 || dest.Host != "" && dest.Port == 0):
			t.Fatalf("handler got invalid destination %+v", *dest)
		case dest != nil && (reply[1] == repSucceeded) != (Outcome(outcome%8) == Connected):
			t.Fatalf("outcome %d answered with code %d", outcome%8, reply[1])
		}
	})
}
