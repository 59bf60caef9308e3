package logging

import (
	"errors"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// productionConfig is the encoder configuration New uses for "json".
func productionConfig() zapcore.EncoderConfig {
	cfg := zap.NewProductionEncoderConfig()
	cfg.EncodeTime = zapcore.RFC3339NanoTimeEncoder
	cfg.NewReflectedEncoder = newReflectedEncoder
	return cfg
}

// encodeLine encodes ent and fields with enc after adding ctx as a
// logger's With would.
func encodeLine(t testing.TB, enc zapcore.Encoder, ctx []zapcore.Field, ent zapcore.Entry, fields []zapcore.Field) string {
	t.Helper()
	c := enc.Clone()
	for _, f := range ctx {
		f.AddTo(c)
	}
	buf, err := c.EncodeEntry(ent, fields)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	return buf.String()
}

// accessLine has the field types of the access log's request line.
func accessLine(method, path, reason string, status int64, d time.Duration, aborted bool) []zapcore.Field {
	return []zapcore.Field{
		zap.String("method", method), zap.String("path", path), zap.String("protocol", "HTTP/1.1"),
		zap.String("route", "bench/backend"), zap.String("reason", reason), zap.Int64("status", status),
		zap.Int("attempts", 1), zap.Int32("small", int32(status)), zap.Int16("smaller", int16(status)),
		zap.Int8("smallest", int8(status)), zap.Duration("duration", d), zap.Bool("aborted", aborted),
	}
}

// FuzzFastJSON: fastJSON writes every line byte for byte as zap's JSON
// encoder does, whether it writes the fields itself or leaves the line to
// zap.
func FuzzFastJSON(f *testing.F) {
	f.Add("request", "access", "GET", "/bench/item", "allowed", "127.0.0.1:40000", int64(200), int64(123456789), false, false)
	f.Add("msg \"quoted\"", "", "a\x00b", "\xff\xfe", "é\n", "\\", int64(-1), int64(-5), true, true)
	f.Add("", "x", "", "", "", "", int64(0), int64(0), false, false)
	f.Fuzz(func(t *testing.T, msg, name, method, path, reason, ctxValue string, status, nanos int64, aborted, namespace bool) {
		cfg := productionConfig()
		ctx := []zapcore.Field{zap.String("source", ctxValue), zap.Int("port", 15008)}
		if namespace {
			ctx = append(ctx, zap.Namespace("inner"))
		}
		ent := zapcore.Entry{Level: zap.InfoLevel, Time: time.Unix(1700000000, nanos%1e9).UTC(), LoggerName: name, Message: msg}
		fields := accessLine(method, path, reason, status, time.Duration(nanos), aborted)
		fields = append(fields, zap.String(reason, "keyed by a fuzzed name"))
		want := encodeLine(t, zapcore.NewJSONEncoder(cfg), ctx, ent, fields)
		got := encodeLine(t, newFastJSON(cfg), ctx, ent, fields)
		if got != want {
			t.Fatalf("fastJSON wrote\n%s\nzap writes\n%s", got, want)
		}
	})
}

// TestFastJSONWritesPlainLines: the lines traffic makes take fastJSON's
// own path (FuzzFastJSON alone would pass if it never did); others are
// zap's.
func TestFastJSONWritesPlainLines(t *testing.T) {
	enc := newFastJSON(productionConfig())
	ent := zapcore.Entry{Level: zap.InfoLevel, Time: time.Now(), LoggerName: "access", Message: "request"}
	for _, tc := range []struct {
		name   string
		fields []zapcore.Field
		own    bool
	}{
		{"access line", accessLine("GET", "/bench/item", "allowed", 200, time.Millisecond, false), true},
		{"no fields", nil, true},
		{"quote in a value", accessLine("GET", `/a"b`, "", 200, 0, false), false},
		{"control character", accessLine("GET", "/a", "bad\nline", 200, 0, false), false},
		{"non-ASCII", accessLine("GET", "/é", "", 200, 0, false), false},
		{"float field", []zapcore.Field{zap.Float64("f", 1.5)}, false},
		{"error field", []zapcore.Field{zap.Error(errors.New("e"))}, false},
	} {
		buf, ok := enc.encodePlain(ent, tc.fields)
		if ok != tc.own {
			t.Errorf("%s: own path %v, want %v", tc.name, ok, tc.own)
		}
		if buf != nil {
			buf.Free()
		}
	}
	ns := enc.Clone().(*fastJSON)
	ns.OpenNamespace("inner")
	if _, ok := ns.encodePlain(ent, accessLine("GET", "/", "", 200, 0, false)); ok {
		t.Error("a line inside a namespace took the own path")
	}
}

// BenchmarkAccessLine: an access log line through zap's JSON encoder and
// through fastJSON, in the same run (ratio < 1: fastJSON is cheaper).
func BenchmarkAccessLine(b *testing.B) {
	cfg := productionConfig()
	ctx := []zapcore.Field{zap.String("source", "127.0.0.1:40000"), zap.String("identity", "spiffe://cluster.local/ns/load/sa/loadgen")}
	ent := zapcore.Entry{Level: zap.InfoLevel, Time: time.Now(), LoggerName: "access", Message: "request"}
	fields := accessLine("GET", "/bench/item", "allowed", 200, 1234567*time.Nanosecond, false)
	run := func(enc zapcore.Encoder) time.Duration {
		c := enc.Clone()
		for _, f := range ctx {
			f.AddTo(c)
		}
		start := time.Now()
		for range b.N {
			buf, _ := c.EncodeEntry(ent, fields)
			buf.Free()
		}
		return time.Since(start)
	}
	zapTime := run(zapcore.NewJSONEncoder(cfg))
	fastTime := run(newFastJSON(cfg))
	b.ReportMetric(float64(zapTime.Nanoseconds())/float64(b.N), "zap_ns/line")
	b.ReportMetric(float64(fastTime.Nanoseconds())/float64(b.N), "fast_ns/line")
	b.ReportMetric(fastTime.Seconds()/zapTime.Seconds(), "fast_vs_zap_ratio")
}
