package hbone

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// ReasonHeader carries the reason of a non-200 answer to a CONNECT. The
// server fills it from the StatusError a Handler returned; the client puts it
// into the StatusError that Dial returns.
const ReasonHeader = "x-causeway-reason"

// maxReasonLen bounds the reason sent to and accepted from a peer.
const maxReasonLen = 256

// StatusError is a non-200 answer to a CONNECT. A Handler returns one (via
// Deny, Unavailable or BadRequest, possibly wrapped with a cause that is
// logged but not sent); Pool.Dial returns one (wrapped) when the peer
// refused the tunnel.
type StatusError struct {
	Code   int    // HTTP status: 400, 401, 503, ...
	Reason string // short, printable, safe to show the peer
}

func (e *StatusError) Error() string {
	if e.Reason == "" {
		return fmt.Sprintf("%d %s", e.Code, http.StatusText(e.Code))
	}
	return fmt.Sprintf("%d %s: %s", e.Code, http.StatusText(e.Code), e.Reason)
}

// Deny refuses a tunnel with 401: the peer is not allowed to reach the destination.
func Deny(reason string) error { return &StatusError{Code: http.StatusUnauthorized, Reason: reason} }

// Unavailable refuses a tunnel with 503: the destination is unknown or unreachable.
func Unavailable(reason string) error {
	return &StatusError{Code: http.StatusServiceUnavailable, Reason: reason}
}

// BadRequest refuses a tunnel with 400: the request itself is malformed.
func BadRequest(reason string) error {
	return &StatusError{Code: http.StatusBadRequest, Reason: reason}
}

// statusOf maps a Handler error to the status and reason sent to the peer.
// Errors that carry no StatusError answer 503 without detail: their text may
// describe internals the peer has no business seeing (it is logged).
func statusOf(err error) (int, string) {
	var se *StatusError
	if errors.As(err, &se) && se.Code >= 400 && se.Code <= 599 {
		return se.Code, se.Reason
	}
	return http.StatusServiceUnavailable, "upstream unavailable"
}

// sanitizeReason makes a reason safe for a header value: printable ASCII,
// at most maxReasonLen bytes.
func sanitizeReason(s string) string {
	if len(s) > maxReasonLen {
		s = s[:maxReasonLen]
	}
	clean := true
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			clean = false
			break
		}
	}
	if clean {
		return strings.TrimSpace(s)
	}
	b := []byte(s)
	for i, c := range b {
		if c < 0x20 || c > 0x7e {
			b[i] = '?'
		}
	}
	return strings.TrimSpace(string(b))
}
