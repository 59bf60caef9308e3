package policy

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode/utf8"

	"github.com/open-policy-agent/opa/v1/ast"
)

// appendJSON appends v as ast.JSON would render it (sets as arrays,
// non-string keys as their JSON text), applying r, straight from the ast
// value: no intermediate Go maps, no reflection, no value per node. Values
// that are not ground (never produced by evaluation or BuildInput) are
// written as their Rego text.
func appendJSON(b []byte, v ast.Value, r *redaction) []byte {
	w := jsonWriter{b: b}
	w.value(v, r)
	return w.b
}

// jsonWriter holds the buffer by pointer so that the callbacks of ast
// iteration can append to it without moving every call's buffer to the heap.
type jsonWriter struct {
	b    []byte
	memo termJSON // nil: render every term
}

func (w *jsonWriter) value(v ast.Value, r *redaction) {
	if r != nil && r.mask {
		if _, null := v.(ast.Null); !null {
			w.b = appendJSONString(w.b, Masked)
			return
		}
	}
	switch v := v.(type) {
	case ast.String:
		w.b = appendJSONString(w.b, string(v))
	case ast.Boolean:
		w.b = strconv.AppendBool(w.b, bool(v))
	case ast.Null:
		w.b = append(w.b, "null"...)
	case ast.Number:
		if i, ok := v.Int64(); ok {
			w.b = strconv.AppendInt(w.b, i, 10)
		} else if json.Valid([]byte(v)) {
			w.b = append(w.b, v...)
		} else {
			w.b = appendJSONString(w.b, string(v))
		}
	case ast.Object:
		w.object(v, r)
	case *ast.Array:
		w.b = append(w.b, '[')
		for i := range v.Len() {
			if i > 0 {
				w.b = append(w.b, ',')
			}
			w.value(v.Elem(i).Value, r)
		}
		w.b = append(w.b, ']')
	case ast.Set:
		w.b = append(w.b, '[')
		first := true
		v.Foreach(func(t *ast.Term) {
			if !first {
				w.b = append(w.b, ',')
			}
			first = false
			w.value(t.Value, r)
		})
		w.b = append(w.b, ']')
	default:
		w.b = appendJSONString(w.b, v.String())
	}
}

func (w *jsonWriter) object(obj ast.Object, r *redaction) {
	w.b = append(w.b, '{')
	first := true
	obj.Foreach(func(k, val *ast.Term) {
		name, ok := k.Value.(ast.String)
		if !ok {
			name = ast.String(jsonKey(k.Value))
		}
		w.key(first, string(name))
		first = false
		w.value(val.Value, r.member(string(name)))
	})
	w.b = append(w.b, '}')
}

// key starts an object member: a comma unless it is the first, the name
// and a colon.
func (w *jsonWriter) key(first bool, name string) {
	if !first {
		w.b = append(w.b, ',')
	}
	w.b = appendJSONString(w.b, name)
	w.b = append(w.b, ':')
}

// appendJSONString appends s as a JSON string, escaped as zap escapes its
// own strings: quote, backslash and control characters escaped, invalid
// UTF-8 replaced by U+FFFD, everything else as it is.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if jsonPlain[c] {
			i++
			continue
		}
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				b = append(b, s[start:i]...)
				b = append(b, `\ufffd`...)
				start = i + 1
			}
			i += size
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		default:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		i++
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// jsonPlain marks the ASCII bytes a JSON string holds as they are.
var jsonPlain = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// jsonKey is the member name ast.JSON gives a non-string key: its JSON text.
func jsonKey(k ast.Value) string {
	if x, err := ast.JSON(k); err == nil {
		if b, err := json.Marshal(x); err == nil {
			return string(b)
		}
	}
	return k.String()
}

// termJSON remembers the JSON of terms: a term never changes, so neither
// does its JSON. It holds at most maxTermJSON terms (emptied when full)
// and belongs to one goroutine (the decision logger's).
type termJSON map[*ast.Term][]byte

const maxTermJSON = 1024

func (m termJSON) append(b []byte, t *ast.Term) []byte {
	if j, ok := m[t]; ok {
		return append(b, j...)
	}
	start := len(b)
	b = appendJSON(b, t.Value, nil)
	if len(m) >= maxTermJSON {
		clear(m)
	}
	m[t] = bytes.Clone(b[start:])
	return b
}
