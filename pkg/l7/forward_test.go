package l7

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"testing"
	"time"

	"github.com/causeway-mesh/causeway/pkg/internal/testnet"
	"github.com/causeway-mesh/causeway/pkg/trust"
)

// TestForwardResponses covers what the waypoint does with an upstream's
// response besides passing it on: informational responses, trailers,
// streaming, hop-by-hop fields, a protocol switch nobody asked for, a body
// cut short; and the request fields it normalizes on the way.
func TestForwardResponses(t *testing.T) {
	h := newHarness(t)
	b := h.backend("web", "http", false)
	release := make(chan struct{})
	b.setBehave(func(_ int64, w http.ResponseWriter, r *http.Request) bool {
		switch r.URL.Path {
		case "/early":
			w.Header().Set("Link", "</a.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			w.Header().Del("Link")
			_, _ = io.WriteString(w, "final")
		case "/trailers":
			w.Header().Set("Trailer", "X-Checksum")
			_, _ = io.WriteString(w, "body")
			w.Header().Set("X-Checksum", "abc")
			w.Header().Set(http.TrailerPrefix+"X-Late", "late")
		case "/stream":
			_, _ = io.WriteString(w, "first\n")
			http.NewResponseController(w).Flush()
			select { // the second part only once the client saw the first
			case <-release:
			case <-time.After(20 * time.Second):
			}
			_, _ = io.WriteString(w, "second\n")
		case "/head":
			_, _ = io.WriteString(w, "same for HEAD and GET")
		case "/hop":
			w.Header().Set("Connection", "X-Hop")
			w.Header().Set("X-Hop", "1")
			w.Header().Set("Keep-Alive", "timeout=5")
			w.Header().Set("X-End", "kept")
		case "/switch":
			c, rw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return true
			}
			defer c.Close()
			_, _ = rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: surprise\r\n\r\n")
			_ = rw.Flush()
		case "/short":
			w.Header().Set("Content-Length", "100")
			_, _ = io.WriteString(w, "only ten..")
			http.NewResponseController(w).Flush()
			panic(http.ErrAbortHandler)
		default:
			return false
		}
		return true
	})
	h.update(nil, nil)
	addr := h.front(webInfo(trust.Unauthenticated()))
	c := h1Client(addr)

	// GET goes through the inline transport, a POST with a body through
	// net/http's: both pass the 103 on.
	for _, method := range []string{"GET", "POST"} {
		t.Run("1xx "+method, func(t *testing.T) {
			var got []string
			trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, hdr textproto.MIMEHeader) error {
				got = append(got, fmt.Sprintf("%d %s", code, hdr.Get("Link")))
				return nil
			}}
			var body io.Reader
			if method == "POST" {
				body = strings.NewReader("payload")
			}
			req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), method, "http://web/early", body)
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			final, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if len(got) != 1 || got[0] != "103 </a.css>; rel=preload" || resp.StatusCode != 200 || string(final) != "final" || resp.Header.Get("Link") != "" {
				t.Errorf("1xx %q, final %d %q, Link %q", got, resp.StatusCode, final, resp.Header.Get("Link"))
			}
		})
	}

	t.Run("trailers", func(t *testing.T) {
		resp, err := c.Get("http://web/trailers")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != "body" || resp.Trailer.Get("X-Checksum") != "abc" || resp.Trailer.Get("X-Late") != "late" {
			t.Errorf("body %q, trailers %v", body, resp.Trailer)
		}
	})

	t.Run("streamed", func(t *testing.T) {
		// Without a flush per chunk the head and first line would wait for
		// the second line, which the backend holds back until they arrived.
		type first struct {
			br   *bufio.Reader
			line string
			err  error
		}
		got := make(chan first, 1)
		go func() {
			resp, err := c.Get("http://web/stream")
			if err != nil {
				got <- first{err: err}
				return
			}
			t.Cleanup(func() { resp.Body.Close() })
			br := bufio.NewReader(resp.Body)
			line, err := br.ReadString('\n')
			got <- first{br, line, err}
		}()
		var f first
		select {
		case f = <-got:
		case <-time.After(5 * time.Second):
			close(release)
			t.Fatal("the first chunk was held back")
		}
		close(release)
		if f.line != "first\n" {
			t.Fatalf("first chunk %q, %v", f.line, f.err)
		}
		if line, err := f.br.ReadString('\n'); line != "second\n" {
			t.Fatalf("second chunk %q, %v", line, err)
		}
	})

	t.Run("hop-by-hop", func(t *testing.T) {
		res := get(t, c, "/hop", nil)
		for _, k := range []string{"X-Hop", "Keep-Alive"} {
			if v := res.header.Get(k); v != "" {
				t.Errorf("%s passed on: %q", k, v)
			}
		}
		if res.header.Get("X-End") != "kept" {
			t.Errorf("end-to-end field lost: %v", res.header)
		}
	})

	t.Run("unrequested switch", func(t *testing.T) {
		if res := get(t, c, "/switch", nil); res.status != http.StatusBadGateway {
			t.Errorf("GET: %d", res.status)
		}
		// A request with a body goes through http.Transport instead.
		if res := do(t, c, "POST", "/switch", []byte("x"), nil); res.status != http.StatusBadGateway {
			t.Errorf("POST: %d", res.status)
		}
	})

	t.Run("short body", func(t *testing.T) {
		// The head and the first bytes may still be in the waypoint's
		// buffer when it aborts: either way the client must see a failure.
		if resp, err := c.Get("http://web/short"); err == nil {
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err == nil {
				t.Fatalf("a cut response read whole: %q", body)
			}
		}
		waitFor(t, "the access log line", func() bool {
			for _, e := range h.logs.FilterMessage("request").All() {
				if e.ContextMap()["path"] == "/short" && e.ContextMap()["aborted"] == true {
					return true
				}
			}
			return false
		})
	})

	t.Run("HEAD", func(t *testing.T) {
		// The upstream's length comes back without a body, and the
		// connection's next response is intact.
		conn := dialFront(t, addr)
		fmt.Fprint(conn, "HEAD /head HTTP/1.1\r\nHost: web\r\n\r\nGET /head HTTP/1.1\r\nHost: web\r\n\r\n")
		br := bufio.NewReader(conn)
		head, err := http.ReadResponse(br, &http.Request{Method: "HEAD"})
		if err != nil {
			t.Fatal(err)
		}
		head.Body.Close()
		get, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("the response after HEAD: %v", err)
		}
		body, err := io.ReadAll(get.Body)
		get.Body.Close()
		if err != nil || head.StatusCode != 200 || get.StatusCode != 200 || head.ContentLength != int64(len(body)) || len(body) == 0 {
			t.Errorf("HEAD %d length %d; GET %d body %d bytes (%v)", head.StatusCode, head.ContentLength, get.StatusCode, len(body), err)
		}
	})

	t.Run("request normalized", func(t *testing.T) {
		conn := dialFront(t, addr)
		br := bufio.NewReader(conn)
		send := func(target, extra string) echo {
			t.Helper()
			fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: web\r\n%s\r\n", target, extra)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			return readResult(t, resp).echo
		}
		e := send("/plain", "Te: trailers, deflate\r\n")
		if ua, ok := e.Header["User-Agent"]; ok {
			t.Errorf("User-Agent added: %q", ua)
		}
		if te := e.Header.Get("Te"); te != "trailers" {
			t.Errorf("Te %q, want trailers", te)
		}
		// Parameters that do not parse are dropped rather than read one
		// way by policy and another by the upstream.
		for target, want := range map[string]string{"/q?a=1&b=2": "a=1&b=2", "/q?a=1&b=2;c=3": "a=1", "/q?a=%zz&b=2": "b=2"} {
			if e := send(target, ""); e.Query != want {
				t.Errorf("%s: upstream query %q, want %q", target, e.Query, want)
			}
		}
	})
}

// TestClientGoneCancelsUpstream: a caller that goes away while its request
// waits on the upstream cancels the upstream request (the upstream sees its
// request end), and the access log says so (499), over HTTP/1.1 (the
// connection reset) and HTTP/2 (the stream reset).
func TestClientGoneCancelsUpstream(t *testing.T) {
	h := newHarness(t)
	b := h.backend("web", "http", true)
	arrived := make(chan struct{}, 1)
	ended := make(chan struct{}, 1)
	b.setBehave(func(_ int64, w http.ResponseWriter, r *http.Request) bool {
		arrived <- struct{}{}
		select {
		case <-r.Context().Done():
			ended <- struct{}{}
		case <-time.After(20 * time.Second):
		}
		return true
	})
	h.update(nil, nil)
	addr := h.front(webInfo(trust.Unauthenticated()))
	wait := func(what string, ch chan struct{}) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: timed out", what)
		}
	}
	logged := func(path string) {
		t.Helper()
		waitFor(t, path+"'s access log line", func() bool {
			for _, e := range h.logs.FilterMessage("request").All() {
				if m := e.ContextMap(); m["path"] == path && m["status"] == int64(499) && m["reason"] == "client cancelled" {
					return true
				}
			}
			return false
		})
	}

	conn := dialFront(t, addr)
	fmt.Fprint(conn, "GET /h1-gone HTTP/1.1\r\nHost: web\r\n\r\n")
	wait("HTTP/1.1 request upstream", arrived)
	conn.(*net.TCPConn).SetLinger(0) // a reset
	conn.Close()
	wait("HTTP/1.1 upstream request cancelled", ended)
	logged("/h1-gone")

	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		wait("HTTP/2 request upstream", arrived)
		cancel()
	}()
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://web/h2-gone", nil)
	if resp, err := h2cClient(addr).Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("HTTP/2 request answered %d after its cancellation", resp.StatusCode)
	}
	wait("HTTP/2 upstream request cancelled", ended)
	logged("/h2-gone")
}

// A caller that sends its request and ends its direction (`nc -N`,
// shutdown(SHUT_WR)) is still reading: it gets the upstream's own answer,
// and the access log has that answer's status.
func TestHalfClosedClientGetsTheUpstreamsAnswer(t *testing.T) {
	h := newHarness(t)
	b := h.backend("web", "http", false)
	b.setBehave(func(_ int64, w http.ResponseWriter, r *http.Request) bool {
		time.Sleep(100 * time.Millisecond) // the caller's end arrives first
		w.Header().Set("X-Real", "yes")
		_, _ = io.WriteString(w, "the backend's body")
		return true
	})
	h.update(nil, nil)
	addr := h.front(webInfo(trust.Unauthenticated()))
	out := testnet.Exchange(t, addr, "GET /half HTTP/1.1\r\nHost: web\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(out)), nil)
	if err != nil {
		t.Fatalf("%q: %v", out, err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || resp.Header.Get("X-Real") != "yes" || string(body) != "the backend's body" {
		t.Fatalf("half-closed caller got %q", out)
	}
	waitFor(t, "the access log line", func() bool {
		for _, e := range h.logs.FilterMessage("request").All() {
			if m := e.ContextMap(); m["path"] == "/half" {
				if m["status"] != int64(200) {
					t.Fatalf("logged %v", m)
				}
				return true
			}
		}
		return false
	})
}

// A caller that goes away while its request is being authorized: the
// denial the cut-short evaluation gives is not the policy's answer; the
// access log says the client cancelled, and nothing is answered.
func TestClientGoneDuringAuthorization(t *testing.T) {
	h := newHarness(t)
	h.backend("web", "http", false)
	h.update(nil, nil)
	deciding := make(chan struct{}, 1)
	h.setAuthz(AuthorizerFunc(func(ctx context.Context, _ *AuthzRequest) Decision {
		deciding <- struct{}{}
		<-ctx.Done()
		return Decision{Status: http.StatusInternalServerError, Reason: "policy evaluation cancelled: " + ctx.Err().Error()}
	}))
	addr := h.front(webInfo(trust.Unauthenticated()))
	conn := dialFront(t, addr)
	fmt.Fprint(conn, "GET /deciding HTTP/1.1\r\nHost: web\r\n\r\n")
	select {
	case <-deciding:
	case <-time.After(10 * time.Second):
		t.Fatal("no authorization")
	}
	conn.(*net.TCPConn).SetLinger(0)
	conn.Close()
	waitFor(t, "the access log line", func() bool {
		for _, e := range h.logs.FilterMessage("request").All() {
			if m := e.ContextMap(); m["path"] == "/deciding" {
				if m["status"] != int64(499) || m["reason"] != "client cancelled during authorization" {
					t.Fatalf("logged %v", m)
				}
				return true
			}
		}
		return false
	})
}
