// Package handoff carries pods' network namespaces from the node agent to
// the node proxy (docs/design.md §10): a unix SOCK_SEQPACKET socket on the node,
// one JSON message per packet, the namespace as an SCM_RIGHTS descriptor.
//
// The agent serves the socket; a node proxy connects and says hello. The
// agent then replays every captured pod (one add each) and sends
// snapshot_complete; after that it sends an add or remove as pods come and
// go. The proxy acknowledges every message, in order, with an ack that
// carries an error when it could not act on it. A proxy drops the pods the
// replay did not name: they left while it was away.
//
// Rules of the wire, checked on every packet before anything else:
//   - a packet is at most MaxMessage bytes; a longer one is refused;
//   - only add carries a descriptor, exactly one; descriptors on any other
//     message, and extra ones on add, are closed before the message is read.
package handoff

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// Version is the protocol version a proxy says hello with.
const Version = 1

// MaxMessage bounds a packet; no valid message comes near it.
const MaxMessage = 16 << 10

// maxField bounds a pod's names (Kubernetes: 253 for names, 63 labels).
const maxField = 253

// Message types.
const (
	// From the proxy.
	TypeHello = "hello"
	TypeAck   = "ack"
	// From the agent.
	TypeAdd              = "add" // carries the pod's network namespace
	TypeRemove           = "remove"
	TypeSnapshotComplete = "snapshot_complete"
)

// Pod names a captured pod.
type Pod struct {
	UID            string `json:"uid"`
	Name           string `json:"name"`
	Namespace      string `json:"namespace"`
	ServiceAccount string `json:"service_account"`
}

func (p Pod) String() string { return p.Namespace + "/" + p.Name + " (" + p.UID + ")" }

// Message is one packet's payload.
type Message struct {
	Type    string `json:"type"`
	Version int    `json:"version,omitempty"` // hello
	Pod     *Pod   `json:"pod,omitempty"`     // add
	UID     string `json:"uid,omitempty"`     // remove
	Error   string `json:"error,omitempty"`   // ack: why the message was not acted on
}

// carriesFD says whether a message of type t must carry a descriptor.
func carriesFD(t string) bool { return t == TypeAdd }

// Encode checks and marshals m.
func Encode(m Message) ([]byte, error) {
	if err := m.validate(); err != nil {
		return nil, err
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	if len(b) > MaxMessage {
		return nil, fmt.Errorf("handoff: %s message of %d bytes exceeds %d", m.Type, len(b), MaxMessage)
	}
	return b, nil
}

// Decode parses and checks one packet's payload.
func Decode(b []byte) (Message, error) {
	if len(b) > MaxMessage {
		return Message{}, fmt.Errorf("handoff: message of %d bytes exceeds %d", len(b), MaxMessage)
	}
	var m Message
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&m); err != nil {
		return Message{}, fmt.Errorf("handoff: bad message: %w", err)
	}
	if d.More() {
		return Message{}, errors.New("handoff: bad message: data after the JSON object")
	}
	if err := m.validate(); err != nil {
		return Message{}, err
	}
	return m, nil
}

func (m Message) validate() error {
	switch m.Type {
	case TypeHello:
		if m.Version != Version {
			return fmt.Errorf("handoff: hello with version %d, want %d", m.Version, Version)
		}
	case TypeAck, TypeSnapshotComplete:
	case TypeAdd:
		if m.Pod == nil {
			return errors.New("handoff: add without a pod")
		}
		return m.Pod.validate()
	case TypeRemove:
		if m.UID == "" || len(m.UID) > maxField {
			return fmt.Errorf("handoff: remove with uid of length %d", len(m.UID))
		}
	default:
		return fmt.Errorf("handoff: unknown message type %q", m.Type)
	}
	return nil
}

func (p *Pod) validate() error {
	for _, f := range []struct{ name, v string }{{"uid", p.UID}, {"name", p.Name}, {"namespace", p.Namespace}, {"service account", p.ServiceAccount}} {
		if f.v == "" || len(f.v) > maxField {
			return fmt.Errorf("handoff: pod %s of length %d (want 1 to %d)", f.name, len(f.v), maxField)
		}
	}
	return nil
}
