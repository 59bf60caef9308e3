package hbone

import (
	"net/http"
	"strconv"

	"golang.org/x/net/http/httpguts"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// This file reads header blocks: a HEADERS frame and its CONTINUATION
// frames, decoded as they arrive (not by x/net's Framer, whose
// CONTINUATION loop has no bound on empty frames), and checks them against
// RFC 9113 §8.

// headerBlock is one decoded header block. Fields are valid until the next
// block is read; their strings may be kept.
type headerBlock struct {
	streamID    uint32
	endStream   bool
	hasPriority bool
	priority    http2.PriorityParam

	fields []hpack.HeaderField // pseudo-header fields first
	size   uint32              // RFC 9113 §6.5.2 size of fields
	// truncated: the fields exceeded maxHeaderBytes and the rest were
	// dropped (still decoded, to keep the HPACK context in step).
	truncated bool
	// malformed says why the block breaks RFC 9113 §8.2 or §8.3 (the stream
	// fails with PROTOCOL_ERROR), or is empty.
	malformed             string
	sawRegular, sawPseudo bool
}

// maxBlockBytes bounds the frame bytes of one header block: twice the
// header list limit leaves room for padding and for a sender that exceeded
// the limit and is answered with 431; beyond it the connection ends.
func (cfg *connConfig) maxBlockBytes() int { return 2 * int(cfg.maxHeaderBytes) }

// maxBlockFrames bounds the frames of one header block, so that a flood of
// small or empty CONTINUATION frames (CVE-2024-27316's class) ends the
// connection: a few frames, and one more for each KiB of the byte bound.
func (cfg *connConfig) maxBlockFrames() int { return 16 + cfg.maxBlockBytes()>>10 }

// pseudo returns the value of the pseudo-header field name (with colon).
func (b *headerBlock) pseudo(name string) (string, bool) {
	for _, hf := range b.fields {
		if !hf.IsPseudo() {
			break
		}
		if hf.Name == name {
			return hf.Value, true
		}
	}
	return "", false
}

// regular returns the regular (non-pseudo) fields.
func (b *headerBlock) regular() []hpack.HeaderField {
	for i, hf := range b.fields {
		if !hf.IsPseudo() {
			return b.fields[i:]
		}
	}
	return nil
}

// value returns the first value of a regular field.
func (b *headerBlock) value(name string) (string, bool) {
	for _, hf := range b.regular() {
		if hf.Name == name {
			return hf.Value, true
		}
	}
	return "", false
}

// maxKeptFields bounds the field slice a connection keeps between blocks.
const maxKeptFields = 64

func (b *headerBlock) reset(f *http2.HeadersFrame) {
	fields := b.fields[:0]
	if cap(fields) > maxKeptFields {
		fields = nil
	}
	clear(b.fields)
	*b = headerBlock{
		streamID:    f.StreamID,
		endStream:   f.StreamEnded(),
		hasPriority: f.HasPriority(),
		priority:    f.Priority,
		fields:      fields,
	}
}

// addField is the HPACK decoder's emit function: it checks each field as
// RFC 9113 §8.2 asks and keeps it while the list stays within limit.
func (b *headerBlock) addField(hf hpack.HeaderField, limit uint32) {
	if b.malformed == "" {
		b.malformed = fieldProblem(hf, b.sawRegular)
	}
	if hf.IsPseudo() {
		b.sawPseudo = true
	} else {
		b.sawRegular = true
	}
	if b.truncated || b.malformed != "" {
		return
	}
	size := hf.Size()
	if size > limit-b.size {
		b.truncated = true
		return
	}
	b.size += size
	b.fields = append(b.fields, hf)
}

// fieldProblem says why a field makes its message malformed, or "".
func fieldProblem(hf hpack.HeaderField, afterRegular bool) string {
	v := hf.Value
	if !httpguts.ValidHeaderFieldValue(v) || (v != "" && (isFieldSpace(v[0]) || isFieldSpace(v[len(v)-1]))) {
		// (The value itself is not repeated: it may be a secret.)
		return "invalid value of header field " + strconv.Quote(hf.Name)
	}
	if hf.IsPseudo() {
		if afterRegular {
			return "pseudo-header field " + strconv.Quote(hf.Name) + " after a regular field"
		}
		return ""
	}
	if !validFieldName(hf.Name) {
		return "invalid header field name " + strconv.Quote(hf.Name)
	}
	switch hf.Name {
	case "connection", "proxy-connection", "keep-alive", "transfer-encoding", "upgrade":
		return "connection-specific header field " + strconv.Quote(hf.Name)
	case "te":
		if v != "trailers" {
			return `te header field other than "trailers"`
		}
	}
	return ""
}

func isFieldSpace(b byte) bool { return b == ' ' || b == '\t' }

// validFieldName: a token in lower case (RFC 9113 §8.2.1).
func validFieldName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !httpguts.IsTokenRune(rune(c)) || ('A' <= c && c <= 'Z') {
			return false
		}
	}
	return true
}

// checkPseudo reports a pseudo-header field not in allowed or repeated.
func (b *headerBlock) checkPseudo(allowed ...string) string {
	for i, hf := range b.fields {
		if !hf.IsPseudo() {
			break
		}
		known := false
		for _, a := range allowed {
			known = known || hf.Name == a
		}
		if !known {
			return "pseudo-header field " + strconv.Quote(hf.Name) + " not allowed here"
		}
		for _, prev := range b.fields[:i] {
			if prev.Name == hf.Name {
				return "repeated pseudo-header field " + strconv.Quote(hf.Name)
			}
		}
	}
	return ""
}

// checkRequest returns why a request's header block is malformed (RFC 9113
// §8.3.1, §8.1.1), and the content-length it declares (-1: none, or a
// CONNECT, which has no content).
func (b *headerBlock) checkRequest() (contentLength int64, problem string) {
	if b.malformed != "" {
		return -1, b.malformed
	}
	if p := b.checkPseudo(":method", ":scheme", ":authority", ":path", ":protocol"); p != "" {
		return -1, p
	}
	method, ok := b.pseudo(":method")
	if !ok || method == "" {
		return -1, "missing :method"
	}
	_, hasScheme := b.pseudo(":scheme")
	path, hasPath := b.pseudo(":path")
	if _, ok := b.pseudo(":protocol"); ok {
		// Extended CONNECT (RFC 8441) needs SETTINGS_ENABLE_CONNECT_PROTOCOL,
		// which the server does not send.
		return -1, ":protocol without SETTINGS_ENABLE_CONNECT_PROTOCOL"
	}
	if method == http.MethodConnect {
		if hasScheme || hasPath {
			return -1, "CONNECT with :scheme or :path"
		}
		if a, _ := b.pseudo(":authority"); a == "" {
			return -1, "CONNECT without :authority"
		}
		return -1, ""
	}
	switch {
	case !hasScheme:
		return -1, "missing :scheme"
	case !hasPath:
		return -1, "missing :path"
	case path == "":
		return -1, "empty :path"
	}
	contentLength = -1
	for _, hf := range b.regular() {
		if hf.Name != "content-length" {
			continue
		}
		n, err := strconv.ParseUint(hf.Value, 10, 63)
		if err != nil {
			return -1, "invalid content-length"
		}
		if contentLength >= 0 && int64(n) != contentLength {
			return -1, "conflicting content-length fields"
		}
		contentLength = int64(n)
	}
	return contentLength, ""
}

// checkTrailers returns why a trailer block is malformed (RFC 9113 §8.1).
func (b *headerBlock) checkTrailers() string {
	switch {
	case b.malformed != "":
		return b.malformed
	case !b.endStream:
		return "second HEADERS without END_STREAM"
	case b.sawPseudo:
		return "pseudo-header field in trailers"
	}
	return ""
}
