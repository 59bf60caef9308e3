package h1

import "io"

// framingScan notes whether a request head names Transfer-Encoding and
// Content-Length, from the head's bytes as they are read. http.ReadRequest
// takes both out of the header it returns (and ignores Transfer-Encoding
// on HTTP/1.0), so the request it returns cannot tell; RFC 9112 §6.1 wants
// a message with both, or HTTP/1.0 with Transfer-Encoding, treated as
// faulty framing. Lines are split as net/textproto splits them (at LF),
// and the name is what precedes the colon; the first line is the request
// line, an empty one ends the head.
type framingScan struct {
	r      io.Reader // the connection
	active bool      // a head is being scanned
	first  bool      // still in the request line
	skip   bool      // the rest of this line is not a name
	name   []byte    // the current line's name so far (lower case)
	buf    [len("transfer-encoding")]byte
	te, cl bool
}

func (s *framingScan) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if s.active {
		s.feed(p[:n])
	}
	return n, err
}

// start scans a new head whose first bytes (maybe all of it) are buf.
func (s *framingScan) start(buf []byte) {
	*s = framingScan{r: s.r, active: true, first: true}
	s.name = s.buf[:0]
	s.feed(buf)
}

// stop ends the scan (the head was read, or could not be).
func (s *framingScan) stop() { s.active = false }

func (s *framingScan) feed(b []byte) {
	for _, c := range b {
		if !s.active {
			return
		}
		switch {
		case c == '\n':
			if !s.first && !s.skip && (len(s.name) == 0 || string(s.name) == "\r") {
				s.active = false // the empty line: the head ends
				return
			}
			s.first, s.skip, s.name = false, false, s.buf[:0]
		case s.first || s.skip:
		case c == ':':
			switch string(s.name) {
			case "transfer-encoding":
				s.te = true
			case "content-length":
				s.cl = true
			}
			s.skip = true
		case len(s.name) == len(s.buf):
			s.skip = true // longer than either name
		default:
			s.name = append(s.name, lower(c))
		}
	}
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// faultyFraming is why a request head read with s is refused, "" if not:
// both Transfer-Encoding and Content-Length, or Transfer-Encoding in
// HTTP/1.0 (whose length rules predate it). Either could make the
// upstream and the waypoint see different requests (smuggling); the
// request is answered 400 and the connection closed, as nginx does.
func (s *framingScan) faultyFraming(protoMinor int) string {
	switch {
	case s.te && s.cl:
		return "Transfer-Encoding with Content-Length"
	case s.te && protoMinor == 0:
		return "Transfer-Encoding in HTTP/1.0"
	}
	return ""
}
