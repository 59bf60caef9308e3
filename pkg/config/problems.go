package config

import (
	"fmt"
	"strings"
)

// Problem is one reason a configuration was rejected, with where it came
// from: the file (local mode) or the API object (Kubernetes), the object
// concerned when known, and why.
type Problem struct {
	Origin string // file path, or another description of the source
	Object string // "Kind namespace/name", or "document N" before decoding
	Reason string
}

func (p Problem) String() string {
	var b strings.Builder
	b.WriteString(p.Origin)
	if p.Object != "" {
		b.WriteString(": ")
		b.WriteString(p.Object)
	}
	b.WriteString(": ")
	b.WriteString(p.Reason)
	return b.String()
}

// InvalidError is returned when a configuration is rejected. It lists every
// problem found (up to maxProblems), so an operator can fix them in one pass.
type InvalidError struct {
	Problems []Problem
	// Truncated counts problems left out beyond the limit.
	Truncated int
}

// maxProblems bounds the report: one broken file should not produce
// megabytes of log.
const maxProblems = 100

func (e *InvalidError) Error() string {
	parts := make([]string, 0, len(e.Problems)+1)
	for _, p := range e.Problems {
		parts = append(parts, p.String())
	}
	if e.Truncated > 0 {
		parts = append(parts, fmt.Sprintf("and %d more problems", e.Truncated))
	}
	return "invalid configuration: " + strings.Join(parts, "; ")
}

// problems collects Problems up to the limit.
type problems struct {
	list      []Problem
	truncated int
}

func (ps *problems) add(origin, object, format string, args ...any) {
	if len(ps.list) >= maxProblems {
		ps.truncated++
		return
	}
	ps.list = append(ps.list, Problem{Origin: origin, Object: object, Reason: fmt.Sprintf(format, args...)})
}

func (ps *problems) addAll(other []Problem) {
	for _, p := range other {
		ps.add(p.Origin, p.Object, "%s", p.Reason)
	}
}

func (ps *problems) err() error {
	if len(ps.list) == 0 {
		return nil
	}
	return &InvalidError{Problems: ps.list, Truncated: ps.truncated}
}
