package config

import (
	"fmt"
	"strings"
)

// Problem is one reason a configuration, or one object of it, was refused,
// with where it came from: the file (local mode) or the API object
// (Kubernetes), the object concerned when known, and why.
type Problem struct {
	Origin string // file path, or another description of the source
	Object string // "Kind namespace/name", "Kind name", or "document N" before decoding
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

// Kind, Namespace and Name split Object ("Kind ns/name" or "Kind name").
func (p Problem) Kind() string {
	kind, _, _ := strings.Cut(p.Object, " ")
	return kind
}

// Namespace is empty for cluster-scoped objects.
func (p Problem) Namespace() string {
	_, ref, _ := strings.Cut(p.Object, " ")
	ns, _, found := strings.Cut(ref, "/")
	if !found {
		return ""
	}
	return ns
}

func (p Problem) Name() string {
	_, ref, _ := strings.Cut(p.Object, " ")
	if i := strings.LastIndexByte(ref, '/'); i >= 0 {
		return ref[i+1:]
	}
	return ref
}

// InvalidError is returned when a configuration is rejected as a whole. It
// lists every problem found (up to maxProblems), so an operator can fix
// them in one pass.
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

// problems collects Problems; err bounds what it reports.
type problems struct {
	list []Problem
}

func (ps *problems) add(origin, object, format string, args ...any) {
	ps.list = append(ps.list, Problem{Origin: origin, Object: object, Reason: fmt.Sprintf(format, args...)})
}

func (ps *problems) addAll(other []Problem) {
	ps.list = append(ps.list, other...)
}

func (ps *problems) err() error {
	if len(ps.list) == 0 {
		return nil
	}
	if len(ps.list) > maxProblems {
		return &InvalidError{Problems: ps.list[:maxProblems:maxProblems], Truncated: len(ps.list) - maxProblems}
	}
	return &InvalidError{Problems: ps.list}
}
