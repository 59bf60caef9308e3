package logging

import (
	"time"

	"go.uber.org/zap/buffer"
	"go.uber.org/zap/zapcore"
)

// fastJSON is zap's JSON encoder (the production configuration New uses)
// with a quicker way to write the fields of the lines that traffic makes:
// when every field of a line is a string, integer, boolean or duration and
// no key or string needs escaping, zap's encoder writes the line without
// them (level, time, logger, message and the logger's context, which it
// encoded once) and the fields are appended here, each string in one copy;
// zap's encoder passes every byte of a key or string through its escaping
// loop. Any other line is zap's. FuzzFastJSON holds the two to
// byte-identical lines.
type fastJSON struct {
	zapcore.Encoder // zap's JSON encoder, holding the context fields
	ending          string
	// namespace: a context field opened a namespace, which the fields would
	// go into; such lines are left to zap.
	namespace bool
}

var fastBufs = buffer.NewPool()

func newFastJSON(cfg zapcore.EncoderConfig) *fastJSON {
	ending := cfg.LineEnding
	if ending == "" {
		ending = zapcore.DefaultLineEnding // as zap's encoder does
	}
	return &fastJSON{Encoder: zapcore.NewJSONEncoder(cfg), ending: ending}
}

func (e *fastJSON) Clone() zapcore.Encoder {
	return &fastJSON{Encoder: e.Encoder.Clone(), ending: e.ending, namespace: e.namespace}
}

func (e *fastJSON) OpenNamespace(key string) {
	e.namespace = true
	e.Encoder.OpenNamespace(key)
}

func (e *fastJSON) EncodeEntry(ent zapcore.Entry, fields []zapcore.Field) (*buffer.Buffer, error) {
	if out, ok := e.encodePlain(ent, fields); ok {
		return out, nil
	}
	return e.Encoder.EncodeEntry(ent, fields)
}

// encodePlain encodes a line whose fields plainFields accepts; false for
// any other (or if zap's line does not end as expected).
func (e *fastJSON) encodePlain(ent zapcore.Entry, fields []zapcore.Field) (*buffer.Buffer, bool) {
	if e.namespace || ent.Stack != "" || !plainFields(fields) {
		return nil, false
	}
	head, err := e.Encoder.EncodeEntry(ent, nil)
	if err != nil {
		return nil, false
	}
	b := head.Bytes()
	end := len(b) - len(e.ending) - 1 // where the closing brace is
	if end < 0 || b[end] != '}' || string(b[end+1:]) != e.ending {
		head.Free()
		return nil, false
	}
	out := fastBufs.Get()
	out.Write(b[:end])
	head.Free()
	for i := range fields {
		appendPlainField(out, &fields[i])
	}
	out.AppendByte('}')
	out.AppendString(e.ending)
	return out, true
}

// plainFields reports whether appendPlainField writes every field as zap's
// JSON encoder would.
func plainFields(fields []zapcore.Field) bool {
	for i := range fields {
		f := &fields[i]
		if !plainString(f.Key) {
			return false
		}
		switch f.Type {
		case zapcore.StringType:
			if !plainString(f.String) {
				return false
			}
		case zapcore.Int64Type, zapcore.Int32Type, zapcore.Int16Type, zapcore.Int8Type,
			zapcore.BoolType, zapcore.DurationType:
		default:
			return false
		}
	}
	return true
}

// plainString: printable ASCII without quote or backslash, which zap's
// encoder copies as it is.
func plainString(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x80 || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// appendPlainField writes a field that plainFields accepted, after a comma
// unless it opens the object (zap's element separator).
func appendPlainField(b *buffer.Buffer, f *zapcore.Field) {
	if n := b.Len(); n > 0 {
		switch b.Bytes()[n-1] {
		case '{', '[', ':', ',', ' ':
		default:
			b.AppendByte(',')
		}
	}
	b.AppendByte('"')
	b.AppendString(f.Key)
	b.AppendString(`":`)
	switch f.Type {
	case zapcore.StringType:
		b.AppendByte('"')
		b.AppendString(f.String)
		b.AppendByte('"')
	case zapcore.BoolType:
		b.AppendBool(f.Integer == 1)
	case zapcore.DurationType:
		// zapcore.SecondsDurationEncoder, the production configuration's
		// (never NaN or infinite, which zap would quote).
		b.AppendFloat(float64(time.Duration(f.Integer))/float64(time.Second), 64)
	default: // the integer types
		b.AppendInt(f.Integer)
	}
}
