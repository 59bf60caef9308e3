package rules

import (
	"fmt"
	"net/netip"
	"reflect"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// TableName is the nftables table (family inet: IPv4 and IPv6 together)
// that holds every capture rule of a pod.
const TableName = "causeway"

// NFTables is the nftables back end. It speaks netlink into the pod's
// namespace directly, and replaces its table in one transaction, so a pod
// never sees half a rule set.
type NFTables struct{}

var _ Backend = NFTables{}

type chainSpec struct {
	name     string
	hook     *nftables.ChainHook
	priority *nftables.ChainPriority
}

var (
	preroutingChain = chainSpec{"prerouting", nftables.ChainHookPrerouting, nftables.ChainPriorityNATDest}
	// nft 1.0.6 rejects "dstnat" on the output hook; the number is the same.
	outputChain = chainSpec{"output", nftables.ChainHookOutput, nftables.ChainPriorityNATDest}
)

type rule struct {
	chain   chainSpec
	comment string
	exprs   []expr.Any
}

// ruleset is every rule for c, in chain order.
func ruleset(c Config) []rule {
	rs := []rule{
		{preroutingChain, "causeway: from the pod itself", concat(ifname(expr.MetaKeyIIFNAME, "lo"), ret())},
	}
	for _, a := range c.ProbeSources {
		rs = append(rs, rule{preroutingChain, "causeway: health probes from the node", concat(saddr(a), ret())})
	}
	rs = append(rs,
		rule{preroutingChain, "causeway: HBONE", concat(tcpDport(c.HBONEPort), ret())},
		rule{preroutingChain, "causeway: inbound plaintext", concat(isTCP(), redirect(c.InboundPort))},
		rule{outputChain, "causeway: the node proxy's own sockets", concat(mark(c.Mark, c.MarkMask), ret())},
		rule{outputChain, "causeway: loopback", concat(ifname(expr.MetaKeyOIFNAME, "lo"), ret())},
		rule{outputChain, "causeway: outbound", concat(isTCP(), redirect(c.OutboundPort))},
	)
	return rs
}

func concat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func ifname(key expr.MetaKey, name string) []expr.Any {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b},
	}
}

func isTCP() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
	}
}

func tcpDport(port uint16) []expr.Any {
	return append(isTCP(),
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
	)
}

func saddr(a netip.Addr) []expr.Any {
	proto, offset, size := byte(unix.NFPROTO_IPV4), uint32(12), uint32(4)
	if a.Is6() {
		proto, offset, size = unix.NFPROTO_IPV6, 8, 16
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: size},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a.AsSlice()},
	}
}

func mark(m, mask uint32) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(mask), Xor: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(m)},
	}
}

func ret() []expr.Any { return []expr.Any{&expr.Verdict{Kind: expr.VerdictReturn}} }

func redirect(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
		// As the kernel reports it back, so that Check can compare.
		&expr.Redir{RegisterProtoMin: 1, RegisterProtoMax: 1, Flags: unix.NF_NAT_RANGE_PROTO_SPECIFIED},
	}
}

func table() *nftables.Table {
	return &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName}
}

func connect(netns int) (*nftables.Conn, error) {
	c, err := nftables.New(nftables.WithNetNSFd(netns))
	if err != nil {
		return nil, fmt.Errorf("rules: netlink: %w", err)
	}
	return c, nil
}

// prepare completes and checks c and connects to the namespace.
func prepare(netns int, c Config) (Config, *nftables.Conn, error) {
	c = c.Defaults()
	if err := c.Validate(); err != nil {
		return c, nil, err
	}
	conn, err := connect(netns)
	return c, conn, err
}

// Apply replaces the table with the rules for c in one transaction.
func (NFTables) Apply(netns int, c Config) error {
	c, conn, err := prepare(netns, c)
	if err != nil {
		return err
	}
	t := table()
	// Adding first makes the delete valid when the table is absent.
	conn.AddTable(t)
	conn.DelTable(t)
	conn.AddTable(t)
	chains := map[string]*nftables.Chain{}
	accept := nftables.ChainPolicyAccept
	for _, s := range []chainSpec{preroutingChain, outputChain} {
		chains[s.name] = conn.AddChain(&nftables.Chain{Name: s.name, Table: t, Type: nftables.ChainTypeNAT,
			Hooknum: s.hook, Priority: s.priority, Policy: &accept})
	}
	for _, r := range ruleset(c) {
		conn.AddRule(&nftables.Rule{Table: t, Chain: chains[r.chain.name], Exprs: r.exprs,
			UserData: userdata.AppendString(nil, userdata.TypeComment, r.comment)})
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("rules: write table inet %s: %w", TableName, err)
	}
	return nil
}

// Delete removes the table, if there is one.
func (NFTables) Delete(netns int) error {
	conn, err := connect(netns)
	if err != nil {
		return err
	}
	t := table()
	conn.AddTable(t)
	conn.DelTable(t)
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("rules: delete table inet %s: %w", TableName, err)
	}
	return nil
}

// Check compares the table in the namespace with the one Apply(c) writes:
// the chains' hooks and priorities and every rule's expressions, in order.
func (NFTables) Check(netns int, c Config) error {
	c, conn, err := prepare(netns, c)
	if err != nil {
		return err
	}
	t, err := conn.ListTableOfFamily(TableName, nftables.TableFamilyINet)
	if err != nil {
		return fmt.Errorf("%w: table inet %s: %v", ErrMissing, TableName, err)
	}
	want := ruleset(c)
	for _, s := range []chainSpec{preroutingChain, outputChain} {
		ch, err := conn.ListChain(t, s.name)
		if err != nil {
			return fmt.Errorf("%w: chain %s: %v", ErrMissing, s.name, err)
		}
		if ch.Type != nftables.ChainTypeNAT || ch.Hooknum == nil || *ch.Hooknum != *s.hook || ch.Priority == nil || *ch.Priority != *s.priority {
			return fmt.Errorf("%w: chain %s has another type, hook or priority", ErrMissing, s.name)
		}
		got, err := conn.GetRules(t, ch)
		if err != nil {
			return fmt.Errorf("rules: list chain %s: %w", s.name, err)
		}
		var exp []rule
		for _, r := range want {
			if r.chain.name == s.name {
				exp = append(exp, r)
			}
		}
		if len(got) != len(exp) {
			return fmt.Errorf("%w: chain %s has %d rules, want %d", ErrMissing, s.name, len(got), len(exp))
		}
		for i, r := range exp {
			if !reflect.DeepEqual(got[i].Exprs, r.exprs) {
				return fmt.Errorf("%w: chain %s rule %d (%s) differs", ErrMissing, s.name, i+1, r.comment)
			}
		}
	}
	return nil
}
