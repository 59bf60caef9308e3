package h1

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// Fast paths for the common HTTP/1.1 message head. A head that is whole in
// the read buffer and plain — CRLF line ends, no folded lines, token field
// names, valid values, no Pragma (which net/http rewrites), no Trailer, no
// Transfer-Encoding; on a request no CONNECT, a path target and no
// Content-Length; on a response a final status and one Content-Length —
// is turned here into the very request or response net/http builds from
// it, with one string holding all its names and values instead of one per
// value, and without net/http's line reader. Any other head goes to
// http.ReadRequest or http.ReadResponse, from the same unread bytes, so
// what is refused and how is net/http's. FuzzPlainHead holds both paths to
// the same result.

// maxPlainFields bounds the fields a plain head may have; more go to
// net/http.
const maxPlainFields = 64

var endOfHead = []byte("\r\n\r\n")

// plainHead parses the head at the start of buf: its start line and
// fields, and its length through the blank line. h is nil when the head
// is not whole in buf or not plain.
func plainHead(buf []byte) (line string, h http.Header, n int) {
	end := bytes.Index(buf, endOfHead)
	if end < 0 {
		return "", nil, 0
	}
	head := string(buf[:end+2]) // every line with its CRLF
	line, rest, _ := strings.Cut(head, "\r\n")
	fields := strings.Count(rest, "\r\n")
	if fields > maxPlainFields {
		return "", nil, 0
	}
	h = make(http.Header, fields)
	values := make([]string, fields) // one backing array: most fields have one value
	for rest != "" {
		field, more, _ := strings.Cut(rest, "\r\n")
		rest = more
		name, value, ok := strings.Cut(field, ":")
		// A name must be a token: this also refuses a folded line (it
		// starts with a space or tab) and a space before the colon.
		if !ok || !httpguts.ValidHeaderFieldName(name) || !plainValue(value) {
			return "", nil, 0
		}
		value = strings.Trim(value, " \t")
		name = canonicalKey(name)
		if vv := h[name]; vv != nil {
			h[name] = append(vv, value)
			continue
		}
		values[0] = value
		h[name], values = values[:1:1], values[1:]
	}
	return line, h, end + 4
}

// plainValue: every byte of v is one net/http accepts in a field value
// (no control characters but tab; so no CR or LF either).
func plainValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

// canonicalKey is textproto.CanonicalMIMEHeaderKey for a token, which most
// names already are as sent: then it returns name itself.
func canonicalKey(name string) string {
	upper := true
	for i := 0; i < len(name); i++ {
		c := name[i]
		if upper && 'a' <= c && c <= 'z' || !upper && 'A' <= c && c <= 'Z' {
			return http.CanonicalHeaderKey(name)
		}
		upper = c == '-'
	}
	return name
}

// buffered is what r holds, unread.
func buffered(r *bufio.Reader) []byte {
	b, _ := r.Peek(r.Buffered())
	return b
}

// plainRequest parses the request at the start of buf into req as
// http.ReadRequest would, if its head is plain and whole in buf, and
// returns the length of its head; 0 (req untouched) otherwise.
func plainRequest(buf []byte, req *http.Request) int {
	line, h, n := plainHead(buf)
	if h == nil {
		return 0
	}
	method, rest, ok1 := strings.Cut(line, " ")
	target, proto, ok2 := strings.Cut(rest, " ")
	if !ok1 || !ok2 || method == http.MethodConnect || !httpguts.ValidHeaderFieldName(method) ||
		!strings.HasPrefix(target, "/") {
		return 0
	}
	minor := httpMinor(proto)
	if minor < 0 {
		return 0
	}
	if len(h["Host"]) > 1 || has(h, "Content-Length") || has(h, "Transfer-Encoding") || has(h, "Trailer") || has(h, "Pragma") {
		return 0
	}
	u, err := url.ParseRequestURI(target)
	if err != nil {
		return 0
	}
	*req = http.Request{
		Method: method, URL: u, Proto: proto, ProtoMajor: 1, ProtoMinor: minor,
		Header: h, Body: http.NoBody, RequestURI: target,
		Close: closes(minor, h),
	}
	if hosts := h["Host"]; len(hosts) > 0 {
		req.Host = hosts[0]
		delete(h, "Host") // as http.ReadRequest does
	}
	return n
}

// plainResponse parses the response to req at the start of buf as
// http.ReadResponse would, if its head is plain and whole in buf, its
// status is final (not 1xx), it has a body (not to HEAD, not 204 or 304)
// and one Content-Length bounds it. The body reads from r, where buf's
// bytes are buffered.
func plainResponse(buf []byte, r io.Reader, req *http.Request) (*http.Response, int) {
	line, h, n := plainHead(buf)
	if h == nil || req.Method == http.MethodHead {
		return nil, 0
	}
	status, code := plainStatus(line)
	if code == 0 || len(h["Content-Length"]) != 1 || has(h, "Transfer-Encoding") || has(h, "Trailer") || has(h, "Pragma") {
		return nil, 0
	}
	resp := lengthResponse(status, code, h["Content-Length"][0], r, req)
	if resp == nil {
		return nil, 0
	}
	resp.Header = h
	if httpguts.HeaderValuesContainsToken(h["Connection"], "close") {
		resp.Close = true
		delete(h, "Connection") // as net/http does for a response
	}
	return resp, n
}

// plainStatus parses an HTTP/1.1 status line of a final response with a
// body (not 1xx, 204 or 304); code is 0 for any other line.
func plainStatus(line string) (status string, code int) {
	proto, status, _ := strings.Cut(line, " ")
	status = strings.TrimLeft(status, " ")
	if proto != "HTTP/1.1" || !plainValue(status) || len(status) > 3 && status[3] != ' ' {
		return "", 0
	}
	code, err := strconv.Atoi(status[:min(3, len(status))])
	if err != nil || code < 200 || code == http.StatusNoContent || code == http.StatusNotModified {
		return "", 0
	}
	return status, code
}

// lengthResponse is the response (without header) whose body is the
// Content-Length cl bytes read from r; nil if cl is not a length.
func lengthResponse(status string, code int, cl string, r io.Reader, req *http.Request) *http.Response {
	length, err := strconv.ParseUint(cl, 10, 63)
	if err != nil {
		return nil
	}
	resp := &http.Response{
		Status: status, StatusCode: code, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Body: http.NoBody, ContentLength: int64(length), Request: req,
	}
	if length > 0 {
		resp.Body = &lengthBody{io.LimitedReader{R: r, N: int64(length)}}
	}
	return resp
}

// RawFields are a response's field lines as the upstream sent them, to be
// passed on as they are (ResponseWriter.WriteRaw): every line is "Name: value"
// with a valid name (in the upstream's case: names are case-insensitive)
// and a trimmed plain value, as writeFields would write it, and none is
// hop-by-hop or one net/http would rewrite.
// Passing them on spares a header map, its copy and its sorted writing.
type RawFields struct {
	OK          bool   // the last response read was raw
	ContentType string // the first Content-Type field's value
	lines       string // each with its CRLF
	date        bool   // a Date field is among them
}

// rawResponse is plainResponse for a head whose fields can be passed on as
// they are: the response, without a header map, and the length of its
// head; the fields go to raw. A Connection field of just keep-alive or
// close and a Keep-Alive field are left out of raw (hop-by-hop; close ends
// the upstream connection, as with plainResponse); any other hop-by-hop
// field, or a field not in raw form, and the answer is nil.
func rawResponse(buf []byte, r io.Reader, req *http.Request, raw *RawFields) (*http.Response, int) {
	end := bytes.Index(buf, endOfHead)
	if end < 0 || req.Method == http.MethodHead {
		return nil, 0
	}
	line, lines, _ := strings.Cut(string(buf[:end+2]), "\r\n")
	status, code := plainStatus(line)
	if code == 0 {
		return nil, 0
	}
	var cl, contentType string
	var kept []byte // lines without those left out, once one is
	lengths, date, closes := 0, false, false
	for off, n := 0, 0; off < len(lines); n++ {
		next := off + strings.Index(lines[off:], "\r\n") + 2
		name, value, ok := strings.Cut(lines[off:next-2], ": ")
		if !ok || n == maxPlainFields || !httpguts.ValidHeaderFieldName(name) ||
			!plainValue(value) || strings.Trim(value, " \t") != value {
			return nil, 0
		}
		leave := false
		switch key := canonicalKey(name); key {
		case "Content-Length":
			cl = value
			lengths++
		case "Date":
			date = true
		case "Content-Type":
			if contentType == "" {
				contentType = value // the first counts, as with Header.Get
			}
		case "Pragma":
			return nil, 0 // net/http adds a Cache-Control for it
		case "Connection":
			c := strings.EqualFold(value, "close")
			if !c && !strings.EqualFold(value, "keep-alive") {
				return nil, 0
			}
			closes, leave = closes || c, true
		case "Keep-Alive":
			leave = true
		default:
			if IsHopByHop(key) {
				return nil, 0
			}
		}
		switch {
		case leave && kept == nil:
			kept = []byte(lines[:off])
		case !leave && kept != nil:
			kept = append(kept, lines[off:next]...)
		}
		off = next
	}
	if lengths != 1 {
		return nil, 0
	}
	resp := lengthResponse(status, code, cl, r, req)
	if resp == nil {
		return nil, 0
	}
	resp.Close = closes
	if kept != nil {
		lines = string(kept)
	}
	*raw = RawFields{OK: true, ContentType: contentType, lines: lines, date: date}
	return resp, end + 4
}

// Header is the Header map of the raw fields, as plainHead builds it.
func (raw *RawFields) Header() http.Header {
	_, h, _ := plainHead([]byte("\r\n" + raw.lines + "\r\n"))
	return h
}

// httpMinor is the minor version of HTTP/1.1 or HTTP/1.0, else -1.
func httpMinor(proto string) int {
	switch proto {
	case "HTTP/1.1":
		return 1
	case "HTTP/1.0":
		return 0
	}
	return -1
}

// closes: the request asks to end the connection after it, as net/http
// reads its Connection field.
func closes(minor int, h http.Header) bool {
	closing := httpguts.HeaderValuesContainsToken(h["Connection"], "close")
	if minor == 0 {
		return closing || !httpguts.HeaderValuesContainsToken(h["Connection"], "keep-alive")
	}
	return closing
}

func has(h http.Header, key string) bool {
	_, ok := h[key]
	return ok
}

// lengthBody is a body of N bytes read from R, ending as net/http's ends:
// io.EOF with its last bytes, io.ErrUnexpectedEOF when R ends first.
type lengthBody struct{ io.LimitedReader }

func (b *lengthBody) Read(p []byte) (int, error) {
	n, err := b.LimitedReader.Read(p)
	switch {
	case b.N == 0:
		return n, io.EOF
	case err == io.EOF:
		return n, io.ErrUnexpectedEOF
	}
	return n, err
}

// Close does nothing: whoever closes a body early closes its connection.
func (b *lengthBody) Close() error { return nil }
