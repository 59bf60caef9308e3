package handoff

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"go.uber.org/zap"
)

// Client is the node proxy's end: it connects to the agent, feeds its
// messages to State and acknowledges each, and reconnects when the agent
// goes away (the pods it serves keep running meanwhile).
type Client struct {
	Path   string
	State  *State
	Logger *zap.Logger
	// MaxBackoff caps the wait between connection attempts (default 5s).
	MaxBackoff time.Duration
	// OnSnapshot, when set, runs each time a snapshot completes.
	OnSnapshot func()
}

// Run connects until ctx ends.
func (c *Client) Run(ctx context.Context) error {
	log := c.Logger
	if log == nil {
		log = zap.NewNop()
	}
	maxWait := c.MaxBackoff
	if maxWait <= 0 {
		maxWait = 5 * time.Second
	}
	wait := 50 * time.Millisecond
	for {
		err := c.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		log.Warn("node agent connection ended; reconnecting", zap.String("socket", c.Path), zap.Error(err))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait/2 + rand.N(wait/2+1)):
		}
		wait = min(2*wait, maxWait)
	}
}

// session is one connection: hello, then messages until it fails.
func (c *Client) session(ctx context.Context) error {
	conn, err := Dial(c.Path)
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	if err := conn.Send(Message{Type: TypeHello, Version: Version}, nil); err != nil {
		return err
	}
	c.State.Connected()
	for {
		m, netns, err := conn.Recv()
		if err != nil {
			// A message that breaks the rules ends the connection: the
			// agent replays on the next one.
			return fmt.Errorf("receive: %w", err)
		}
		ack := Message{Type: TypeAck}
		if err := c.State.Handle(ctx, m, netns); err != nil {
			ack.Error = err.Error()
		}
		if err := conn.Send(ack, nil); err != nil {
			return err
		}
		if m.Type == TypeSnapshotComplete && c.OnSnapshot != nil {
			c.OnSnapshot()
		}
	}
}
