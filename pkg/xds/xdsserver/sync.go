package xdsserver

import (
	"strconv"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"

	"github.com/causeway-mesh/causeway/pkg/xds"
)

// Sync states of one type of one stream, as istioctl proxy-status names
// them.
const (
	SyncNotSent = "NOT SENT" // nothing sent yet: no configuration, or the client asked for nothing
	SyncSynced  = "SYNCED"   // the client acknowledged the last response sent
	SyncStale   = "STALE"    // a response is sent and not yet acknowledged
	SyncNACKed  = "NACKED"   // the client rejected the last response sent
)

// maxNACKMessage bounds the part of a rejection's message kept per stream.
const maxNACKMessage = 1024

// TypeSync is the exchange of one resource type on one stream: the last
// response sent, the last one the client acknowledged, and its last
// rejection. Versions are the server's configuration versions
// (system_version_info): a type that did not change is not sent again, so
// its version may lag the server's while it is in sync.
type TypeSync struct {
	Type         string    `json:"type"`
	Status       string    `json:"status"`
	SentVersion  string    `json:"sent_version,omitempty"`
	SentNonce    string    `json:"sent_nonce,omitempty"`
	SentAt       time.Time `json:"sent_at,omitzero"`
	AckedVersion string    `json:"acked_version,omitempty"`
	AckedNonce   string    `json:"acked_nonce,omitempty"`
	AckedAt      time.Time `json:"acked_at,omitzero"`
	// NACK is the client's last rejection, until it acknowledges a
	// later response.
	NACK *NACK `json:"nack,omitempty"`
}

// NACK is a rejected response.
type NACK struct {
	Nonce   string    `json:"nonce"`
	Version string    `json:"version,omitempty"`
	Message string    `json:"message"`
	At      time.Time `json:"at"`
}

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
		ts.NACK = &NACK{Nonce: nonce, Version: version, Message: truncate(ed.GetMessage(), maxNACKMessage), At: now}
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

func (i *streamInfo) typeSync(typeURL string) *TypeSync {
	ts := i.sync[typeURL]
	if ts == nil {
		ts = &TypeSync{Type: xds.TypeName(typeURL)}
		i.sync[typeURL] = ts
	}
	return ts
}

// snapshot is a copy of ts with its status.
func (ts *TypeSync) snapshot() TypeSync {
	out := *ts
	if ts.NACK != nil {
		n := *ts.NACK
		out.NACK = &n
	}
	switch {
	case ts.SentNonce == "":
		out.Status = SyncNotSent
	case ts.AckedNonce == ts.SentNonce:
		out.Status = SyncSynced
	case ts.NACK != nil && ts.NACK.Nonce == ts.SentNonce:
		out.Status = SyncNACKed
	default:
		out.Status = SyncStale
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
