package logging

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// syncBuffer is a WriteSyncer the test can read while loggers write.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) Sync() error { return nil }

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestBufferedLinesWaitForTheFlush(t *testing.T) {
	var out syncBuffer
	l, err := New(Options{Level: "info", FlushInterval: time.Hour, Output: &out})
	if err != nil {
		t.Fatal(err)
	}
	access := l.Buffered("access", zap.String("node", "node-a"))
	access.Info("connection", zap.String("result", "ok"))
	l.Info("operator line")
	if got := out.String(); strings.Contains(got, "connection") || !strings.Contains(got, "operator line") {
		t.Fatalf("before Sync: %q; want the operator line written and the access line buffered", got)
	}
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{`"logger":"access"`, `"node":"node-a"`, `"result":"ok"`} {
		if !strings.Contains(got, want) {
			t.Errorf("after Sync the output lacks %s: %q", want, got)
		}
	}
	if n := strings.Count(got, `"caller"`); n != 1 {
		t.Errorf("%d lines with a caller, want only the operator line: %q", n, got)
	}
	// The level set at runtime applies to buffered loggers too.
	l.Level.SetLevel(zap.WarnLevel)
	access.Info("dropped")
	l.Sync()
	if strings.Contains(out.String(), "dropped") {
		t.Error("an info access line was written at level warn")
	}
}

func TestBufferedFlushesOnItsInterval(t *testing.T) {
	var out syncBuffer
	l, err := New(Options{FlushInterval: 50 * time.Millisecond, Output: &out})
	if err != nil {
		t.Fatal(err)
	}
	l.Buffered("decisions").Info("decision")
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), "decision") {
		if time.Now().After(deadline) {
			t.Fatal("a buffered line was not written after its flush interval")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestUnbufferedWhenTheIntervalIsZero(t *testing.T) {
	var out syncBuffer
	l, err := New(Options{Output: &out})
	if err != nil {
		t.Fatal(err)
	}
	l.Buffered("access").Info("connection")
	if !strings.Contains(out.String(), "connection") {
		t.Fatal("with no flush interval, a line waited")
	}
}

func TestBadOptions(t *testing.T) {
	for _, o := range []Options{{Format: "xml"}, {Level: "loud"}, {FlushInterval: -time.Second}} {
		if _, err := New(o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
}

// RawJSON is copied into the line as it is, in both formats and on
// buffered loggers; other reflected values are still encoded.
func TestRawJSONIsWrittenVerbatim(t *testing.T) {
	raw := RawJSON(`{"b":[1,2.50,"x"],"a":{}}`)
	for _, format := range []string{"json", "console"} {
		var out syncBuffer
		l, err := New(Options{Format: format, Output: &out})
		if err != nil {
			t.Fatal(err)
		}
		l.Info("m", zap.Reflect("raw", raw), zap.Reflect("other", map[string]int{"k": 1}))
		l.Buffered("decisions").Info("m", zap.Reflect("raw", raw))
		if err := l.Sync(); err != nil {
			t.Fatal(err)
		}
		if got := out.String(); strings.Count(got, string(raw)) != 2 || !strings.Contains(got, `{"k":1}`) {
			t.Errorf("%s: raw JSON not written verbatim:\n%s", format, got)
		}
	}
}

// Through any other zap encoder RawJSON is still JSON (encoding/json
// compacts it), never base64 as a []byte would be.
func TestRawJSONThroughAForeignEncoder(t *testing.T) {
	var out syncBuffer
	core := zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), &out, zap.InfoLevel)
	zap.New(core).Info("m", zap.Reflect("raw", RawJSON(`{"a": [1, 2]}`)))
	if got := out.String(); !strings.Contains(got, `"raw":{"a":[1,2]}`) {
		t.Errorf("raw JSON through zap's own encoder: %s", got)
	}
}
