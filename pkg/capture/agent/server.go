package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"time"

	"go.uber.org/zap"

	"github.com/causeway-mesh/causeway/pkg/capture/cni"
)

// ServeCNI answers the plugin on ln (a unix socket) until ctx ends.
func (a *Agent) ServeCNI(ctx context.Context, ln net.Listener) error {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+cni.PathAdd, a.handle(func(ctx context.Context, ev cni.Event) (cni.Reply, error) { return a.Add(ctx, ev) }))
	mux.HandleFunc("POST "+cni.PathDel, a.handle(func(ctx context.Context, ev cni.Event) (cni.Reply, error) { return cni.Reply{}, a.Del(ctx, ev) }))
	mux.HandleFunc("POST "+cni.PathCheck, a.handle(func(ctx context.Context, ev cni.Event) (cni.Reply, error) {
		return cni.Reply{Captured: true}, a.Check(ctx, ev)
	}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: time.Minute, ErrorLog: zap.NewStdLog(a.log.Named("cni-server"))}
	stop := context.AfterFunc(ctx, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	})
	defer stop()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("agent: CNI socket: %w", err)
	}
	return nil
}

func (a *Agent) handle(do func(context.Context, cni.Event) (cni.Reply, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var ev cni.Event
		d := json.NewDecoder(http.MaxBytesReader(w, r.Body, cni.MaxBody))
		d.DisallowUnknownFields()
		err := d.Decode(&ev)
		if err == nil {
			err = validEvent(ev)
		}
		if err != nil {
			reply(w, http.StatusBadRequest, cni.Reply{Reason: "bad event: " + err.Error()})
			return
		}
		rep, err := do(r.Context(), ev)
		if err != nil {
			a.log.Error("CNI event failed", zap.String("path", r.URL.Path), zap.String("pod", ev.Namespace+"/"+ev.PodName),
				zap.String("container", ev.ContainerID), zap.Bool("retryable", Retryable(err)), zap.Error(err))
			reply(w, http.StatusInternalServerError, cni.Reply{Reason: err.Error(), Retryable: Retryable(err)})
			return
		}
		reply(w, http.StatusOK, rep)
	}
}

func validEvent(ev cni.Event) error {
	const maxField = 1024
	for _, f := range []struct{ name, v string }{{"container_id", ev.ContainerID}, {"netns", ev.Netns}, {"pod_name", ev.PodName}, {"namespace", ev.Namespace}} {
		if f.v == "" || len(f.v) > maxField {
			return fmt.Errorf("%s of length %d", f.name, len(f.v))
		}
	}
	for _, a := range append(append([]netip.Addr(nil), ev.IPs...), ev.Gateways...) {
		if !a.IsValid() {
			return errors.New("an invalid address")
		}
	}
	return nil
}

func reply(w http.ResponseWriter, status int, r cni.Reply) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(r)
}
