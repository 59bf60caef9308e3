package l7

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/causeway-mesh/causeway/pkg/internal/testnet"
	"github.com/causeway-mesh/causeway/pkg/trust"
)

// misbehaviour is what the backend of FuzzNoCrossedAnswers does with a
// request (the first time it arrives; a retry is answered plainly).
type misbehaviour byte

const (
	answerPlainly   misbehaviour = iota
	extraResponse                // a second response in the same write
	extraLater                   // a second response while the connection idles
	bodyAfterHead                // the answer's body even to HEAD (later)
	bytesAfter204                // a 204, then a response (later)
	bodyAfter304                 // a 304 with a length, then that body (later)
	closeUnanswered              // no answer: the connection closes
	shortBody                    // half the body, then the connection closes
	closeThenMore                // Connection: close, then a response anyway
	earlyHints                   // a 103 before the answer
	chunkedAnswer                // the answer chunked, then a stray chunk (later)
	malformed                    // a head that does not parse
	closeDelimited               // HTTP/1.0 without a length: ends with the connection
	numMisbehaviours
)

// late reports whether m sends bytes after its answer, while the waypoint
// holds the connection idle.
func (m misbehaviour) late() bool {
	switch m {
	case extraLater, bodyAfterHead, bytesAfter204, bodyAfter304, chunkedAnswer:
		return true
	}
	return false
}

// misbehavingBackend answers requests whose target is their id as the
// schedule says, putting the id in every response it sends (X-Id, and the
// body), and stale ones under another id.
type misbehavingBackend struct {
	addr netip.AddrPort
	mu   sync.Mutex
	plan map[string]misbehaviour // by id, removed once applied
	late chan string             // the id whose late bytes were sent
}

func startMisbehavingBackend(t *testing.T) *misbehavingBackend {
	b := &misbehavingBackend{plan: map[string]misbehaviour{}, late: make(chan string, 64)}
	ln := testnet.Listen(t, "127.0.0.1:0")
	b.addr = netip.MustParseAddrPort(ln.Addr().String())
	testnet.Serve(t, ln, b.serve)
	return b
}

func answerFor(id, status string, body string, extra ...string) string {
	return "HTTP/1.1 " + status + "\r\nX-Id: " + id + "\r\n" + strings.Join(extra, "") +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}

func (b *misbehavingBackend) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		if _, err := io.Copy(io.Discard, req.Body); err != nil {
			return
		}
		id := req.URL.Path
		b.mu.Lock()
		m, planned := b.plan[id]
		delete(b.plan, id)
		b.mu.Unlock()
		stale := answerFor("stale"+id, "200 OK", "stale"+id)
		body := id
		if req.Method == http.MethodHead {
			body = ""
		}
		answer := answerFor(id, "200 OK", body)
		var later string
		switch m {
		case extraResponse:
			answer += stale
		case extraLater:
			later = stale
		case bodyAfterHead:
			answer = "HTTP/1.1 200 OK\r\nX-Id: " + id + "\r\nContent-Length: " + strconv.Itoa(len(id)) + "\r\n\r\n"
			if req.Method != http.MethodHead {
				answer += id
			}
			later = "stale" + id
		case bytesAfter204:
			answer, later = "HTTP/1.1 204 No Content\r\nX-Id: "+id+"\r\n\r\n", stale
		case bodyAfter304:
			answer, later = "HTTP/1.1 304 Not Modified\r\nX-Id: "+id+"\r\nContent-Length: 8\r\n\r\n", "stale304"
		case closeUnanswered:
			return
		case shortBody:
			io.WriteString(c, "HTTP/1.1 200 OK\r\nX-Id: "+id+"\r\nContent-Length: 100\r\n\r\n"+body[:len(body)/2])
			return
		case closeThenMore:
			answer = answerFor(id, "200 OK", body, "Connection: close\r\n") + stale
		case earlyHints:
			answer = "HTTP/1.1 103 Early Hints\r\nX-Id: " + id + "\r\n\r\n" + answer
		case chunkedAnswer:
			answer = "HTTP/1.1 200 OK\r\nX-Id: " + id + "\r\nTransfer-Encoding: chunked\r\n\r\n"
			if body != "" {
				answer += strconv.FormatInt(int64(len(body)), 16) + "\r\n" + body + "\r\n"
			}
			answer += "0\r\n\r\n"
			later = "5\r\nstale\r\n"
		case malformed:
			answer = "HTTP/1.1 200 OK\r\nX-Id: " + id + "\r\nContent-Length: x\r\n\r\n" + stale
		case closeDelimited:
			io.WriteString(c, "HTTP/1.0 200 OK\r\nX-Id: "+id+"\r\n\r\n"+body)
			return
		}
		if _, err := io.WriteString(c, answer); err != nil {
			return
		}
		if planned && later != "" {
			time.Sleep(5 * time.Millisecond) // the waypoint has read the answer: the connection idles
			io.WriteString(c, later)
			time.Sleep(2 * time.Millisecond) // the bytes reach the waypoint's socket
			b.late <- id
		}
	}
}

// FuzzNoCrossedAnswers drives the waypoint's HTTP/1.1 server and its
// upstream clients (the inline one for GET and HEAD, net/http's for
// requests with a body) with three keep-alive clients taking turns,
// against a backend that misbehaves as the input says: whatever it sends,
// no client may ever receive an answer, or part of one, that another
// request produced. Each pair of input bytes is a step: the client and
// method (first byte), what the backend does (second).
func FuzzNoCrossedAnswers(f *testing.F) {
	for _, seed := range [][]byte{
		{0, byte(answerPlainly), 1, byte(answerPlainly), 2, byte(answerPlainly)},
		{0, byte(extraResponse), 1, 0, 2, 0},
		{0, byte(extraLater), 1, 0, 0, 0},
		{0x80, byte(bodyAfterHead), 1, 0, 2, 0},
		{0, byte(bytesAfter204), 1, 0},
		{0, byte(bodyAfter304), 1, 0},
		{0, byte(closeUnanswered), 1, 0, 0, 0},
		{0, byte(shortBody), 1, 0},
		{0, byte(closeThenMore), 1, 0},
		{0, byte(earlyHints), 1, 0},
		{0, byte(chunkedAnswer), 1, 0},
		{0, byte(malformed), 1, 0},
		{0, byte(closeDelimited), 1, 0},
		{0x40, byte(extraLater), 1, 0, 0x41, byte(extraResponse), 2, 0},
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, steps []byte) {
		if len(steps) > 24 {
			steps = steps[:24]
		}
		b := startMisbehavingBackend(t)
		h := newHarness(t)
		h.addService("web", "http", b.addr)
		h.update(nil, nil)
		front := h.front(webInfo(trust.Unauthenticated()))
		var clients [3]*bufio.ReadWriter
		var conns [3]net.Conn
		for i := 0; i+1 < len(steps); i += 2 {
			n := int(steps[i]&0x3f) % len(clients)
			method := http.MethodGet
			switch {
			case steps[i]&0x80 != 0:
				method = http.MethodHead
			case steps[i]&0x40 != 0:
				method = http.MethodPost
			}
			m := misbehaviour(steps[i+1]) % numMisbehaviours
			id := fmt.Sprintf("/c%d/r%d", n, i/2)
			b.mu.Lock()
			b.plan[id] = m
			b.mu.Unlock()
			if clients[n] == nil {
				conns[n] = dialFront(t, front)
				clients[n] = bufio.NewReadWriter(bufio.NewReader(conns[n]), bufio.NewWriter(conns[n]))
			}
			c := clients[n]
			c.WriteString(method + " " + id + " HTTP/1.1\r\nHost: web\r\n")
			if method == http.MethodPost {
				c.WriteString("Content-Length: 4\r\n\r\nbody")
			} else {
				c.WriteString("\r\n")
			}
			c.Flush()
			var resp *http.Response
			var err error
			for { // informational responses first: they must be this request's too
				resp, err = http.ReadResponse(c.Reader, &http.Request{Method: method})
				if err != nil || resp.StatusCode >= 200 {
					break
				}
				if got := resp.Header.Get("X-Id"); got != id {
					t.Fatalf("step %d (%s %s, backend %d): an informational response of %q", i/2, method, id, m, got)
				}
			}
			var body []byte
			if err == nil {
				body, err = io.ReadAll(resp.Body)
			}
			if err != nil || resp.Close {
				// Aborted or closed by the waypoint (the upstream failed
				// midway): the client connects again.
				conns[n].Close()
				clients[n] = nil
			}
			if err == nil {
				if got := resp.Header.Get("X-Id"); got != "" && got != id {
					t.Fatalf("step %d (%s %s, backend %d): the answer of %s: %d %q", i/2, method, id, m, got, resp.StatusCode, body)
				}
				if resp.Header.Get("X-Id") == id && resp.StatusCode == 200 && method != http.MethodHead && string(body) != id {
					t.Fatalf("step %d (%s %s, backend %d): body %q", i/2, method, id, m, body)
				}
				if strings.Contains(string(body), "/r") && !strings.Contains(string(body), id) || strings.Contains(string(body), "stale") {
					t.Fatalf("step %d (%s %s, backend %d): another exchange's bytes: %d %q", i/2, method, id, m, resp.StatusCode, body)
				}
			}
			if m.late() {
				select {
				case <-b.late: // sent while the connection idles in the waypoint's pool
				case <-time.After(2 * time.Second): // the request never reached the backend
				}
			}
		}
	})
}
