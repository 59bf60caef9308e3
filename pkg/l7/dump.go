package l7

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// ConfigDump is the compiled routing for the admin /config_dump: each
// service port's rules in the order they are tried (hostname specificity
// aside), and what could not be compiled.
type ConfigDump struct {
	Tables   []TableDump `json:"tables"`
	Problems []string    `json:"problems,omitempty"`
}

// TableDump is one service port.
type TableDump struct {
	Service  string `json:"service"`
	Port     uint32 `json:"port"`
	Protocol string `json:"protocol"`
	// ConsumerNamespace is set on the consumer routes of one namespace:
	// they serve callers from it instead of the service's own routes.
	ConsumerNamespace string `json:"consumer_namespace,omitempty"`
	// Implicit is set when no route is attached: traffic goes to the
	// service's own endpoints.
	Implicit  bool       `json:"implicit,omitempty"`
	Endpoints []string   `json:"endpoints"`
	Rules     []RuleDump `json:"rules,omitempty"`
}

// RuleDump is one match of one rule.
type RuleDump struct {
	Kind      string   `json:"kind"`
	Route     string   `json:"route"`
	Rule      int      `json:"rule"`
	Name      string   `json:"name,omitempty"`
	Hostnames []string `json:"hostnames,omitempty"`
	Match     string   `json:"match"`
	Filters   []string `json:"filters,omitempty"`
	Backends  []string `json:"backends"`
	Invalid   string   `json:"invalid,omitempty"`
}

// Dump describes the configuration.
func (c *Config) Dump() ConfigDump {
	d := ConfigDump{Problems: c.Problems()}
	tables := slices.Collect(maps.Values(c.tables))
	for _, t := range c.consumers {
		tables = append(tables, t)
	}
	for _, t := range tables {
		td := TableDump{Service: t.key.svc.String(), Port: t.key.port, Protocol: t.protocol.String(), ConsumerNamespace: t.consumer,
			Implicit: t.implicit != nil, Endpoints: []string{}}
		if si := c.services[t.key.svc]; si != nil {
			for _, tg := range si.targets[t.key.port] {
				td.Endpoints = append(td.Endpoints, tg.Address.String())
			}
		}
		for _, e := range t.grpc {
			td.Rules = append(td.Rules, dumpRule(e.route, e.rule, e.match.String()))
		}
		for _, e := range t.http {
			td.Rules = append(td.Rules, dumpRule(e.route, e.rule, e.match.String()))
		}
		d.Tables = append(d.Tables, td)
	}
	slices.SortFunc(d.Tables, func(a, b TableDump) int {
		return cmp.Or(cmp.Compare(a.Service, b.Service), cmp.Compare(a.Port, b.Port), cmp.Compare(a.ConsumerNamespace, b.ConsumerNamespace))
	})
	return d
}

func dumpRule(m *routeMeta, ru *rule, match string) RuleDump {
	rd := RuleDump{Kind: m.kind, Route: m.String(), Rule: ru.index, Name: ru.name, Match: match, Invalid: ru.invalid, Backends: []string{}}
	rd.Hostnames = append(append(rd.Hostnames, m.hosts.exact...), m.hosts.wildcard...)
	for _, f := range ru.filters {
		rd.Filters = append(rd.Filters, f.kind.String())
	}
	for _, b := range ru.backends {
		s := fmt.Sprintf("%s weight=%d", b, b.weight)
		if b.invalid != "" {
			s += " invalid: " + b.invalid
		}
		rd.Backends = append(rd.Backends, s)
	}
	return rd
}

func (m *httpMatch) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", m.path.kind, m.path.value)
	if m.method != "" {
		fmt.Fprintf(&b, " method=%s", m.method)
	}
	for i := range m.headers {
		fmt.Fprintf(&b, " header:%s", m.headers[i].String())
	}
	for i := range m.query {
		fmt.Fprintf(&b, " query:%s", m.query[i].String())
	}
	return b.String()
}

func (m *grpcMatch) String() string {
	var b strings.Builder
	kind := "Exact"
	if m.serviceRe != nil || m.methodRe != nil {
		kind = "RegularExpression"
	}
	fmt.Fprintf(&b, "%s service=%q method=%q", kind, m.service, m.method)
	for i := range m.headers {
		fmt.Fprintf(&b, " header:%s", m.headers[i].String())
	}
	return b.String()
}
