package config

import (
	"sort"
	"strings"

	"go.uber.org/zap"
)

// RejectionLog logs the objects a source's translations refuse
// (Snapshot.Rejected) as refusals come and go: an object's problems once
// when it is refused or its reasons change, and one line when it is
// accepted again. Sources translate on every change; the same refusal
// would otherwise be logged on each.
type RejectionLog struct {
	log  *zap.Logger
	last map[string]string // object -> its reasons, joined
}

// NewRejectionLog logs to log.
func NewRejectionLog(log *zap.Logger) *RejectionLog {
	return &RejectionLog{log: log, last: map[string]string{}}
}

// Update logs what changed since the last call.
func (l *RejectionLog) Update(rejected []Problem) {
	byObject := map[string][]Problem{}
	for _, p := range rejected {
		byObject[p.Object] = append(byObject[p.Object], p)
	}
	cur := make(map[string]string, len(byObject))
	objs := make([]string, 0, len(byObject))
	for obj, ps := range byObject {
		reasons := make([]string, len(ps))
		for i, p := range ps {
			reasons[i] = p.Reason
		}
		cur[obj] = strings.Join(reasons, "\n")
		objs = append(objs, obj)
	}
	sort.Strings(objs)
	for _, obj := range objs {
		if l.last[obj] == cur[obj] {
			continue
		}
		for _, p := range byObject[obj] {
			l.log.Warn("object refused; it fails closed and the rest of the configuration is served",
				zap.String("kind", p.Kind()), zap.String("namespace", p.Namespace()), zap.String("name", p.Name()),
				zap.String("origin", p.Origin), zap.String("reason", p.Reason))
		}
	}
	var gone []string
	for obj := range l.last {
		if _, ok := cur[obj]; !ok {
			gone = append(gone, obj)
		}
	}
	sort.Strings(gone)
	for _, obj := range gone {
		p := Problem{Object: obj}
		l.log.Info("object no longer refused", zap.String("kind", p.Kind()), zap.String("namespace", p.Namespace()), zap.String("name", p.Name()))
	}
	l.last = cur
}

// RejectedByKind counts the refused objects of each kind.
func RejectedByKind(rejected []Problem) map[string]int {
	seen := map[string]bool{}
	out := map[string]int{}
	for _, p := range rejected {
		if !seen[p.Object] {
			seen[p.Object] = true
			out[p.Kind()]++
		}
	}
	return out
}
