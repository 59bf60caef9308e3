package xds

import "time"

// Syncz is what a control plane replica says of its xDS clients (its
// admin's /debug/syncz, read by meshctl proxy-status): the configuration
// version it serves and, per client and resource type, where the exchange
// stands, as istiod's syncz does.
type Syncz struct {
	Version string       `json:"version"`
	Clients []ClientSync `json:"clients"`
}

// ClientSync is one connected client.
type ClientSync struct {
	NodeID string     `json:"node_id"`
	Caller string     `json:"caller"`
	Pod    string     `json:"pod,omitempty"` // "<namespace>/<name>" when the credential names it
	Remote string     `json:"remote"`
	Since  time.Time  `json:"connected_since"`
	Types  []TypeSync `json:"types,omitempty"`
}

// Sync states of one type of one stream, as istioctl proxy-status names
// them.
const (
	SyncNotSent = "NOT SENT" // nothing sent yet: no configuration, or the client asked for nothing
	SyncSynced  = "SYNCED"   // the client acknowledged the last response sent
	SyncStale   = "STALE"    // a response is sent and not yet acknowledged
	SyncNACKed  = "NACKED"   // the client rejected the last response sent
)

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
