package l7

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/causeway-mesh/causeway/pkg/internal/testnet"
	"github.com/causeway-mesh/causeway/pkg/trust"
)

// drainHarness is a harness whose web backend answers /slow with
// slowBody once the test releases it, and a front whose ServeConn calls
// the test can wait for.
type drainHarness struct {
	*harness
	addr    string
	arrived chan string   // the path of each /slow request, as it arrives
	release chan struct{} // closed (answer): /slow answers
	once    sync.Once
	serving sync.WaitGroup
}

// answer lets /slow answer.
func (h *drainHarness) answer() { h.once.Do(func() { close(h.release) }) }

var slowBody = bytes.Repeat([]byte("0123456789abcdef"), 16<<10) // 256 KiB

func newDrainHarness(t *testing.T) *drainHarness {
	h := &drainHarness{harness: newHarness(t), arrived: make(chan string, 4), release: make(chan struct{})}
	h.backend("web", "http", true).setBehave(func(_ int64, w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path != "/slow" {
			return false
		}
		h.arrived <- r.URL.Path
		<-h.release
		w.Header().Set("Content-Length", strconv.Itoa(len(slowBody)))
		w.Write(slowBody)
		return true
	})
	t.Cleanup(h.answer) // before the backend closes, which waits for its handlers
	h.update(nil, nil)
	ln := testnet.Listen(t, "127.0.0.1:0")
	info := webInfo(trust.Unauthenticated())
	testnet.Serve(t, ln, func(c net.Conn) {
		h.serving.Add(1)
		defer h.serving.Done()
		_ = h.engine.ServeConn(h.ctx, c, info)
	})
	h.addr = ln.Addr().String()
	return h
}

// servedAll waits (a few seconds at most) for every ServeConn to return.
func (h *drainHarness) servedAll(t *testing.T) {
	t.Helper()
	done := make(chan struct{})
	go func() { h.serving.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("connections still served 5 s after the drain began")
	}
}

func TestDrainHTTP1(t *testing.T) {
	h := newDrainHarness(t)
	idle := testnet.Dial(t, h.addr)
	idleR := bufio.NewReader(idle)
	io.WriteString(idle, "GET / HTTP/1.1\r\nHost: web\r\n\r\n")
	if resp, err := http.ReadResponse(idleR, nil); err != nil || resp.Close {
		t.Fatalf("before the drain: %v, close %v", err, resp != nil && resp.Close)
	} else if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatal(err)
	}
	busy := testnet.Dial(t, h.addr)
	busyR := bufio.NewReader(busy)
	io.WriteString(busy, "POST /slow HTTP/1.1\r\nHost: web\r\nContent-Length: 5\r\n\r\norder")
	<-h.arrived

	h.engine.Drain()
	// The idle connection is closed at once, the other only once its
	// answer is written whole, with Connection: close.
	testnet.ExpectClosed(t, idle, idleR)
	h.answer()
	resp, err := http.ReadResponse(busyR, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil || !bytes.Equal(body, slowBody) || !resp.Close {
		t.Fatalf("in-flight answer: %d of %d bytes (%v), Connection: close %v", len(body), len(slowBody), err, resp.Close)
	}
	testnet.ExpectClosed(t, busy, busyR)
	h.servedAll(t)
}

func TestDrainH2C(t *testing.T) {
	for _, after := range []bool{false, true} {
		// after: the connection starts being served as the drain has begun.
		t.Run("connection after drain "+strconv.FormatBool(after), func(t *testing.T) {
			h := newDrainHarness(t)
			c := testnet.Dial(t, h.addr)
			if after {
				h.engine.Drain()
			}
			fr := http2.NewFramer(c, c)
			io.WriteString(c, http2.ClientPreface)
			fr.WriteSettings()
			var hb bytes.Buffer
			enc := hpack.NewEncoder(&hb)
			for _, f := range [][2]string{{":method", "GET"}, {":scheme", "http"}, {":authority", "web"}, {":path", "/slow"}} {
				enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
			}
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndStream: true, EndHeaders: true})
			if after {
				h.answer()
			} else {
				<-h.arrived
				h.engine.Drain()
			}
			// GOAWAY names stream 1 the last it serves; stream 1 then ends
			// whole, and the server closes the connection. (A connection
			// that began after the drain may be told GOAWAY before its
			// first stream was read: last stream 0, the stream refused,
			// which the client may send again elsewhere.)
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			var goAway *http2.GoAwayFrame
			var status string
			var data int
			ended := false
			dec := hpack.NewDecoder(4096, func(f hpack.HeaderField) {
				if f.Name == ":status" {
					status = f.Value
				}
			})
			for {
				f, err := fr.ReadFrame()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatalf("reading frames: %v (GOAWAY %v, stream 1 ended %v)", err, goAway != nil, ended)
				}
				switch f := f.(type) {
				case *http2.SettingsFrame:
					if !f.IsAck() {
						fr.WriteSettingsAck()
					}
				case *http2.GoAwayFrame:
					goAway = f
					if !after {
						h.answer()
					}
				case *http2.HeadersFrame:
					dec.Write(f.HeaderBlockFragment())
					ended = ended || f.StreamEnded()
				case *http2.DataFrame:
					data += len(f.Data())
					if len(f.Data()) > 0 {
						fr.WriteWindowUpdate(0, uint32(len(f.Data())))
						fr.WriteWindowUpdate(1, uint32(len(f.Data())))
					}
					ended = ended || f.StreamEnded()
				case *http2.RSTStreamFrame:
					t.Fatalf("stream %d reset: %v", f.StreamID, f.ErrCode)
				}
			}
			if goAway == nil || goAway.ErrCode != http2.ErrCodeNo || goAway.LastStreamID != 1 && !(after && goAway.LastStreamID == 0) {
				t.Fatalf("GOAWAY %+v, want NO_ERROR with last stream 1", goAway)
			}
			if goAway.LastStreamID == 0 {
				if status != "" {
					t.Fatalf("stream 1 answered %s after GOAWAY refused it", status)
				}
			} else if !ended || status != "200" || data != len(slowBody) {
				t.Fatalf("stream 1: status %q, %d of %d bytes, ended %v", status, data, len(slowBody), ended)
			}
			h.servedAll(t)
		})
	}
}
