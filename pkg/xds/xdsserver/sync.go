package xdsserver

import (
	"strconv"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"

	"github.com/causeway-mesh/causeway/pkg/xds"
)

// maxNACKMessage bounds the part of a rejection's message kept per stream.
const maxNACKMessage = 1024

// sent records a response about to be sent. Must hold the server's mu.
func (i *streamInfo) sent(resp *discovery.DeltaDiscoveryResponse, now time.Time) {
	ts := i.typeSync(resp.GetTypeUrl())
	ts.SentVersion, ts.SentNonce, ts.SentAt = resp.GetSystemVersionInfo(), resp.GetNonce(), now
}

// answered records a request's acknowledgement or rejection of a
// response. Must hold the server's mu.
func (i *streamInfo) answered(req *discovery.DeltaDiscoveryRequest, now time.Time) {
	nonce := req.GetResponseNonce()
	if nonce == "" {
		i.typeSync(req.GetTypeUrl()) // a first request: the type is asked for
		return
	}
	ts := i.typeSync(req.GetTypeUrl())
	version := ""
	if nonce == ts.SentNonce {
		version = ts.SentVersion
	}
	if ed := req.GetErrorDetail(); ed != nil {
		ts.NACK = &xds.NACK{Nonce: nonce, Version: version, Message: truncate(ed.GetMessage(), maxNACKMessage), At: now}
		return
	}
	// Nonces count up per stream (go-control-plane's delta server): an
	// acknowledgement of an older response than one already acknowledged
	// changes nothing.
	if newerNonce(nonce, ts.AckedNonce) {
		ts.AckedVersion, ts.AckedNonce, ts.AckedAt = version, nonce, now
		if ts.NACK != nil && !newerNonce(ts.NACK.Nonce, nonce) {
			ts.NACK = nil
		}
	}
}

func (i *streamInfo) typeSync(typeURL string) *xds.TypeSync {
	ts := i.sync[typeURL]
	if ts == nil {
		ts = &xds.TypeSync{Type: xds.TypeName(typeURL)}
		i.sync[typeURL] = ts
	}
	return ts
}

// snapshot is a copy of ts with its status.
func snapshot(ts *xds.TypeSync) xds.TypeSync {
	out := *ts
	if ts.NACK != nil {
		n := *ts.NACK
		out.NACK = &n
	}
	switch {
	case ts.SentNonce == "":
		out.Status = xds.SyncNotSent
	case ts.AckedNonce == ts.SentNonce:
		out.Status = xds.SyncSynced
	case ts.NACK != nil && ts.NACK.Nonce == ts.SentNonce:
		out.Status = xds.SyncNACKed
	default:
		out.Status = xds.SyncStale
	}
	return out
}

// newerNonce reports whether nonce a was sent after b ("" is before all).
func newerNonce(a, b string) bool {
	if b == "" {
		return true
	}
	na, errA := strconv.ParseUint(a, 10, 64)
	nb, errB := strconv.ParseUint(b, 10, 64)
	if errA != nil || errB != nil {
		return a != b
	}
	return na > nb
}
