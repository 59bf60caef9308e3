package policy

import (
	"fmt"

	"github.com/open-policy-agent/opa/v1/ast"
	"sigs.k8s.io/yaml"
)

// SettingsFile holds a policy directory's settings, at the directory's
// root. It is read with the policy at every (re)load and is part of its
// revision: new settings are activated together with the policy they came
// with, and invalid settings reject that revision like a compile error.
//
//	decisionPath: envoy/http/public/allow  # the decision to evaluate
//	parseBody: true                        # give policies body and parsed_body
//	maxBodyBytes: 16384                    # body bytes placed in the input
//	decisionLog: all                       # all, denied or none
//
// A setting left out keeps the waypoint's default (its flags).
const SettingsFile = "causeway-policy.yaml"

// MaxBodyLimit bounds maxBodyBytes: the waypoint buffers at most this much
// of a request body before it asks the policy.
const MaxBodyLimit = 64 << 10

// Settings say how a policy is asked. The engine's Options give the
// defaults; a policy directory's SettingsFile overrides them.
type Settings struct {
	// DecisionPath names the decision, "envoy/authz/allow" or
	// "data.envoy.authz.allow".
	DecisionPath string `json:"decision_path"`
	// ParseBody and MaxBodyBytes: the body in the input (InputOptions).
	ParseBody    bool `json:"parse_body"`
	MaxBodyBytes int  `json:"max_body_bytes,omitempty"`
	// DecisionLog says which decisions the decision log records.
	DecisionLog DecisionLogMode `json:"decision_log"`
	// From is SettingsFile when the policy carries settings, "defaults"
	// otherwise.
	From string `json:"from"`
}

// settingsDoc is the file's schema; a nil field keeps the default.
type settingsDoc struct {
	DecisionPath *string `json:"decisionPath"`
	ParseBody    *bool   `json:"parseBody"`
	MaxBodyBytes *int    `json:"maxBodyBytes"`
	DecisionLog  *string `json:"decisionLog"`
}

var settingsKeys = map[string]bool{"decisionPath": true, "parseBody": true, "maxBodyBytes": true, "decisionLog": true}

// settings are Settings resolved for evaluation.
type settings struct {
	Settings
	decision ast.Ref
}

func (s *settings) input() InputOptions {
	return InputOptions{ParseBody: s.ParseBody, MaxBodyBytes: s.MaxBodyBytes}
}

// resolveSettings checks s and prepares it for evaluation.
func resolveSettings(s Settings) (*settings, error) {
	ref, err := ParseDecisionPath(s.DecisionPath)
	if err != nil {
		return nil, err
	}
	s.DecisionPath = ref.String()
	if s.MaxBodyBytes < 0 || s.MaxBodyBytes > MaxBodyLimit {
		return nil, fmt.Errorf("body limit %d: want 1 to %d bytes", s.MaxBodyBytes, MaxBodyLimit)
	}
	switch {
	case !s.ParseBody:
		s.MaxBodyBytes = 0
	case s.MaxBodyBytes == 0:
		s.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if s.DecisionLog == "" {
		s.DecisionLog = LogAllDecisions
	}
	if _, err := ParseDecisionLogMode(string(s.DecisionLog)); err != nil {
		return nil, err
	}
	return &settings{Settings: s, decision: ref}, nil
}

// parseSettings applies a SettingsFile's content over the defaults.
func parseSettings(content []byte, defaults Settings) (*settings, error) {
	var doc settingsDoc
	if err := yaml.UnmarshalStrict(content, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", SettingsFile, err)
	}
	// JSON decoding matches names in any case: insist on the exact ones,
	// so a misspelt setting is an error rather than a silent default.
	var keys map[string]any
	if err := yaml.Unmarshal(content, &keys); err != nil {
		return nil, fmt.Errorf("%s: %w", SettingsFile, err)
	}
	for k := range keys {
		if !settingsKeys[k] {
			return nil, fmt.Errorf("%s: unknown field %q (want decisionPath, parseBody, maxBodyBytes or decisionLog)", SettingsFile, k)
		}
	}
	s := defaults
	s.From = SettingsFile
	if doc.DecisionPath != nil {
		s.DecisionPath = *doc.DecisionPath
		if s.DecisionPath == "" {
			return nil, fmt.Errorf("%s: decisionPath is empty", SettingsFile)
		}
	}
	if doc.ParseBody != nil {
		s.ParseBody = *doc.ParseBody
	}
	if doc.MaxBodyBytes != nil {
		if !s.ParseBody {
			return nil, fmt.Errorf("%s: maxBodyBytes needs parseBody: true", SettingsFile)
		}
		if *doc.MaxBodyBytes <= 0 {
			return nil, fmt.Errorf("%s: maxBodyBytes %d: want 1 to %d bytes", SettingsFile, *doc.MaxBodyBytes, MaxBodyLimit)
		}
		s.MaxBodyBytes = *doc.MaxBodyBytes
	}
	if doc.DecisionLog != nil {
		s.DecisionLog = DecisionLogMode(*doc.DecisionLog)
	}
	r, err := resolveSettings(s)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", SettingsFile, err)
	}
	return r, nil
}
