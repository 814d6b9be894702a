//! Packet tests of domain names in cluster policy egress rules: the programs read the DNS
//! answers a pod receives (UDP and TCP, delivered by the kernel or redirected into the
//! pod), learn the addresses of the names its rules name (exact and `*.`, through CNAME
//! chains, A and AAAA), expire them with the answer's TTL, and never learn from what is
//! not a well-formed answer to a question a rule names.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use cni_ebpf::policy::cluster_network_policy::ClusterNetworkPolicy;
use cni_ebpf_common::Reason;
use serde_json::json;
use testbed::packet::*;

use crate::{
    frames6::{frame6, l4_6, tcp6},
    policy::{dual_stack_pods, enforce_all},
};

/// A DNS server outside the cluster.
const RESOLVER: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 53);
const RESOLVER6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x53);
/// Addresses names resolve to.
const SITE: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 100);
const OTHER: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 7);
const SITE6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x100);

const TYPE_A: u16 = 1;
const TYPE_AAAA: u16 = 28;
const TYPE_CNAME: u16 = 5;

/// A name's wire form.
fn wire(name: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for label in name.split('.') {
        out.push(label.len() as u8);
        out.extend_from_slice(label.as_bytes());
    }
    out.push(0);
    out
}

/// One answer record: its owner (`None`: a pointer to the question's name), type, TTL and
/// data.
struct Record {
    owner: Option<&'static str>,
    ty: u16,
    ttl: u32,
    rdata: Vec<u8>,
}

fn a(owner: Option<&'static str>, addr: Ipv4Addr, ttl: u32) -> Record {
    Record {
        owner,
        ty: TYPE_A,
        ttl,
        rdata: addr.octets().to_vec(),
    }
}

fn aaaa(owner: Option<&'static str>, addr: Ipv6Addr, ttl: u32) -> Record {
    Record {
        owner,
        ty: TYPE_AAAA,
        ttl,
        rdata: addr.octets().to_vec(),
    }
}

fn cname(owner: Option<&'static str>, target: &str) -> Record {
    Record {
        owner,
        ty: TYPE_CNAME,
        ttl: 300,
        rdata: wire(target),
    }
}

/// A DNS response (RCODE `rcode`) to one question for `name` of type `qtype`.
fn response(name: &str, qtype: u16, rcode: u16, records: &[Record]) -> Vec<u8> {
    let mut m = Vec::new();
    m.extend_from_slice(&0x1234u16.to_be_bytes());
    m.extend_from_slice(&(0x8180u16 | rcode).to_be_bytes());
    m.extend_from_slice(&1u16.to_be_bytes());
    m.extend_from_slice(&(records.len() as u16).to_be_bytes());
    m.extend_from_slice(&[0, 0, 0, 0]);
    m.extend_from_slice(&wire(name));
    m.extend_from_slice(&qtype.to_be_bytes());
    m.extend_from_slice(&1u16.to_be_bytes());
    for r in records {
        match r.owner {
            None => m.extend_from_slice(&[0xc0, 12]),
            Some(o) => m.extend_from_slice(&wire(o)),
        }
        m.extend_from_slice(&r.ty.to_be_bytes());
        m.extend_from_slice(&1u16.to_be_bytes());
        m.extend_from_slice(&r.ttl.to_be_bytes());
        m.extend_from_slice(&(r.rdata.len() as u16).to_be_bytes());
        m.extend_from_slice(&r.rdata);
    }
    m
}

/// `message` from the resolver's port 53 to pod a over UDP, as the kernel delivers it.
fn udp_to_a(message: &[u8]) -> Vec<u8> {
    frame(
        HOST_MAC_A,
        UPLINK_MAC,
        RESOLVER,
        POD_A,
        UDP,
        &udp(RESOLVER, POD_A, 53, 33000, message, true),
    )
}

/// `message` from the resolver's port 53 to pod a over TCP (its 2-byte length first).
fn tcp_to_a(message: &[u8]) -> Vec<u8> {
    let mut data = (message.len() as u16).to_be_bytes().to_vec();
    data.extend_from_slice(message);
    tcp_segment_to_a(&data)
}

/// A TCP segment from the resolver's port 53 to pod a carrying `data`.
fn tcp_segment_to_a(data: &[u8]) -> Vec<u8> {
    frame(
        HOST_MAC_A,
        UPLINK_MAC,
        RESOLVER,
        POD_A,
        TCP,
        &tcp(RESOLVER, POD_A, 53, 33000, ACK, data),
    )
}

/// `message` from the resolver's IPv6 address to pod a's over UDP.
fn udp6_to_a(message: &[u8]) -> Vec<u8> {
    let mut l4 = vec![0u8; 8];
    l4[0..2].copy_from_slice(&53u16.to_be_bytes());
    l4[2..4].copy_from_slice(&33000u16.to_be_bytes());
    l4[4..6].copy_from_slice(&((8 + message.len()) as u16).to_be_bytes());
    l4.extend_from_slice(message);
    frame6(RESOLVER6, POD_A6, UDP, &l4_6(RESOLVER6, POD_A6, UDP, l4, 6))
}

/// A source port no earlier probe used: each probe is a new connection, judged afresh
/// (an admitted one would pass on its record until the policy changes).
fn fresh_port() -> u16 {
    static NEXT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(40000);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Pod a's TCP SYN to `dst`:`dport`, leaving the node, on a new connection.
fn a_out(dst: Ipv4Addr, dport: u16) -> Vec<u8> {
    frame(
        HOST_MAC_A,
        POD_MAC_A,
        POD_A,
        dst,
        TCP,
        &tcp(POD_A, dst, fresh_port(), dport, SYN, b"x"),
    )
}

/// Pod a's IPv6 TCP SYN to `dst`:`dport`, leaving the node, on a new connection.
fn a_out6(dst: Ipv6Addr, dport: u16) -> Vec<u8> {
    tcp6(POD_A6, fresh_port(), dst, dport, SYN)
}

/// Pod a may reach `example.com` and any name below `example.org` on TCP 443, nothing
/// else outside (an Admin policy).
fn domain_policy() -> ClusterNetworkPolicy {
    serde_json::from_value(json!({
        "metadata": {"name": "egress-by-name"},
        "spec": {
            "tier": "Admin",
            "priority": 10,
            "subject": {"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "a"}}}},
            "egress": [
                {"name": "sites", "action": "Accept",
                 "to": [{"domainNames": ["example.com", "*.example.org"]}],
                 "protocols": [{"tcp": {"destinationPort": {"number": 443}}}]},
                {"name": "nothing-else", "action": "Deny",
                 "to": [{"networks": ["0.0.0.0/0", "::/0"]}]},
            ],
        },
    }))
    .unwrap()
}

fn fixture() -> Fixture {
    let fx = Fixture::with_two_pods();
    enforce_all(&fx, &[], &[domain_policy()], 1);
    fx
}

/// Whether the policy lets pod a's SYN to `dst`:`dport` leave the node.
fn leaves(fx: &Fixture, dst: Ipv4Addr, dport: u16) -> bool {
    fx.run("uplink_egress", &a_out(dst, dport)).0 != SHOT
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn a_pod_learns_the_addresses_of_its_rules_names_from_the_answers_it_receives() {
    let fx = fixture();
    assert!(!leaves(&fx, SITE, 443), "nothing learned yet");
    // The answer passes, and its address is a peer of the rule from then on, on the
    // rule's port only.
    let answer = response("example.com", TYPE_A, 0, &[a(None, SITE, 300)]);
    assert_eq!(fx.run_on("to_pod", IFINDEX_A, &udp_to_a(&answer)).0, PASS);
    assert_eq!(fx.reason(Reason::PolicyDnsLearned), 1);
    assert!(leaves(&fx, SITE, 443));
    assert!(!leaves(&fx, SITE, 80), "the rule's port only");
    assert!(!leaves(&fx, OTHER, 443), "an address no answer gave");
    let learned = fx.dp().policy_learned().unwrap();
    assert_eq!(learned.len(), 1, "{learned:?}");
    assert_eq!(learned[0].addr, IpAddr::V4(SITE));
    assert_eq!(
        learned[0].pod,
        cni_ebpf::datapath::policy::pod_key("x", "a")
    );

    // A name below example.com is not example.com; example.org is not below itself.
    let a_ip = |n: u8| Ipv4Addr::new(198, 18, 0, n);
    for (name, n) in [
        ("www.example.com", 20),
        ("example.org", 21),
        ("example.net", 22),
    ] {
        let answer = response(name, TYPE_A, 0, &[a(None, a_ip(n), 300)]);
        assert_eq!(fx.run_on("to_pod", IFINDEX_A, &udp_to_a(&answer)).0, PASS);
        assert!(!leaves(&fx, a_ip(n), 443), "{name} is no rule's name");
    }
    // A wildcard matches one or more labels, in any case; the addresses at the end of a
    // CNAME chain are learned.
    let chain = response(
        "API.eu.Example.ORG",
        TYPE_A,
        0,
        &[
            cname(None, "edge.cdn.test"),
            cname(Some("edge.cdn.test"), "e1.cdn.test"),
            a(Some("e1.cdn.test"), a_ip(30), 60),
            a(Some("e1.cdn.test"), a_ip(31), 60),
        ],
    );
    assert_eq!(fx.run_on("to_pod", IFINDEX_A, &udp_to_a(&chain)).0, PASS);
    assert!(leaves(&fx, a_ip(30), 443) && leaves(&fx, a_ip(31), 443));
    // Over TCP, one whole message in the segment.
    let over_tcp = response("example.com", TYPE_A, 0, &[a(None, a_ip(40), 300)]);
    assert_eq!(fx.run_on("to_pod", IFINDEX_A, &tcp_to_a(&over_tcp)).0, PASS);
    assert!(leaves(&fx, a_ip(40), 443), "learned over TCP");
    // From a server that writes the length in a segment of its own, then the message.
    let alone = response("example.com", TYPE_A, 0, &[a(None, a_ip(41), 300)]);
    let length = (alone.len() as u16).to_be_bytes();
    assert_eq!(
        fx.run_on("to_pod", IFINDEX_A, &tcp_segment_to_a(&length)).0,
        PASS
    );
    assert_eq!(
        fx.run_on("to_pod", IFINDEX_A, &tcp_segment_to_a(&alone)).0,
        PASS
    );
    assert!(leaves(&fx, a_ip(41), 443), "learned from the message alone");
    // An error answer teaches nothing, whatever records it carries.
    let unread = fx.reason(Reason::PolicyDnsUnread);
    let nxdomain = response("example.com", TYPE_A, 3, &[a(None, a_ip(50), 300)]);
    assert_eq!(fx.run_on("to_pod", IFINDEX_A, &udp_to_a(&nxdomain)).0, PASS);
    assert!(!leaves(&fx, a_ip(50), 443));
    assert_eq!(fx.reason(Reason::PolicyDnsUnread), unread + 1);
    // Pod b's rules name no domain: what it receives is not read for it.
    let to_b = frame(
        HOST_MAC_B,
        UPLINK_MAC,
        RESOLVER,
        POD_B,
        UDP,
        &udp(
            RESOLVER,
            POD_B,
            53,
            33000,
            &response("example.com", TYPE_A, 0, &[a(None, a_ip(60), 300)]),
            true,
        ),
    );
    let before = fx.reason(Reason::PolicyDnsLearned);
    assert_eq!(fx.run_on("to_pod", IFINDEX_B, &to_b).0, PASS);
    assert_eq!(fx.reason(Reason::PolicyDnsLearned), before);
    // An answer from a DNS server pod on the node: `from_pod` hands it to pod a's host
    // veth rather than straight into the pod, and `to_pod` (which the kernel runs next)
    // reads it.
    let from_b = frame(
        HOST_MAC_B,
        POD_MAC_B,
        POD_B,
        POD_A,
        UDP,
        &udp(
            POD_B,
            POD_A,
            53,
            33001,
            &response("example.com", TYPE_A, 0, &[a(None, a_ip(70), 300)]),
            true,
        ),
    );
    assert_eq!(fx.run("from_pod", &from_b).0, REDIRECT);
    assert!(!leaves(&fx, a_ip(70), 443), "not read on the way out of b");
    assert_eq!(fx.run_on("to_pod", IFINDEX_A, &from_b).0, PASS);
    assert!(leaves(&fx, a_ip(70), 443), "read on the way into a");
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn learned_addresses_expire_with_the_answers_ttl_and_serve_both_families() {
    let fx = fixture();
    fx.configure_node(&cni_ebpf::datapath::NodeConfigSpec {
        node_addr6: Some("fd00:18::2".parse().unwrap()),
        cluster_cidrs6: vec!["fd00:10:244::/48".parse().unwrap()],
        ..standard_settings(true)
    });
    dual_stack_pods(&fx);
    enforce_all(&fx, &[], &[domain_policy()], 10);
    // The compiled rule set carries no floor here (the agent's `--dns-min-ttl` sets one).
    let answer = response("example.com", TYPE_A, 0, &[a(None, SITE, 1)]);
    assert_eq!(fx.run_on("to_pod", IFINDEX_A, &udp_to_a(&answer)).0, PASS);
    assert!(leaves(&fx, SITE, 443));
    // An AAAA answer delivered over IPv6 opens the IPv6 address.
    let answer6 = response("example.com", TYPE_AAAA, 0, &[aaaa(None, SITE6, 300)]);
    assert_eq!(fx.run_on("to_pod", IFINDEX_A, &udp6_to_a(&answer6)).0, PASS);
    assert_ne!(fx.run("uplink_egress", &a_out6(SITE6, 443)).0, SHOT);
    assert_eq!(
        fx.run("uplink_egress", &a_out6(RESOLVER6, 443)).0,
        SHOT,
        "an address no answer gave"
    );
    std::thread::sleep(std::time::Duration::from_millis(1300));
    assert!(!leaves(&fx, SITE, 443), "expired with its TTL of 1 s");
    assert_ne!(
        fx.run("uplink_egress", &a_out6(SITE6, 443)).0,
        SHOT,
        "the AAAA's TTL has not passed"
    );
    // A new answer renews it.
    assert_eq!(fx.run_on("to_pod", IFINDEX_A, &udp_to_a(&answer)).0, PASS);
    assert!(leaves(&fx, SITE, 443));
}

/// Answers mutated at random (bytes changed, cut short, counts and lengths made up,
/// compression pointers looping) are delivered as the policy decides, and whatever the
/// programs learn from them is an address some delivered answer carried.
#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn malformed_answers_never_open_anything() {
    let fx = fixture();
    let base = response(
        "api.example.org",
        TYPE_A,
        0,
        &[
            cname(None, "edge.cdn.test"),
            a(Some("edge.cdn.test"), SITE, 300),
            aaaa(None, SITE6, 300),
        ],
    );
    let mut seed = 0x5eed_u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut seen: Vec<Vec<u8>> = Vec::new();
    const ROUNDS: usize = 3000;
    for round in 0..ROUNDS {
        let mut m = base.clone();
        for _ in 0..1 + next() % 6 {
            let i = (next() as usize) % m.len();
            match next() % 5 {
                0 => m[i] = next() as u8,
                1 => m.truncate(i.max(12)),
                2 => m[i] = 0xc0,
                3 => m[i] = 63,
                _ => m.insert(i, next() as u8),
            }
        }
        let pkt = if round % 4 == 0 {
            tcp_to_a(&m)
        } else {
            udp_to_a(&m)
        };
        assert_eq!(
            fx.run_on("to_pod", IFINDEX_A, &pkt).0,
            PASS,
            "round {round}: a DNS answer is delivered as the policy decides"
        );
        seen.push(m);
    }
    let carried = |addr: IpAddr| {
        let bytes = match addr {
            IpAddr::V4(a) => a.octets().to_vec(),
            IpAddr::V6(a) => a.octets().to_vec(),
        };
        seen.iter()
            .any(|m| m.windows(bytes.len()).any(|w| w == bytes.as_slice()))
    };
    let learned = fx.dp().policy_learned().unwrap();
    for l in &learned {
        assert!(carried(l.addr), "{} was learned from no answer", l.addr);
    }
    assert!(
        fx.reason(Reason::PolicyDnsUnread) > (ROUNDS / 10) as u64,
        "most mutations make answers that cannot be read"
    );
}

/// What reading an answer costs its delivery, measured in the kernel with
/// `BPF_PROG_TEST_RUN`'s repeat count (its `duration` is the average per run): the same
/// answer (a CNAME and two addresses) delivered by `to_pod` to a pod whose rules name
/// domains (read, its addresses learned again each run) and to one whose rules do not.
/// Printed (run with `--nocapture`) for docs/networkpolicy.md, and bounded loosely so
/// that a change making the reading an order of magnitude dearer fails here.
#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn reading_an_answer_costs_its_delivery_little() {
    const REPEAT: u32 = 100_000;
    let fx = fixture();
    let answer = response(
        "api.example.org",
        TYPE_A,
        0,
        &[
            cname(None, "edge.cdn.test"),
            a(Some("edge.cdn.test"), SITE, 300),
            a(Some("edge.cdn.test"), OTHER, 300),
        ],
    );
    let to_b = frame(
        HOST_MAC_B,
        UPLINK_MAC,
        RESOLVER,
        POD_B,
        UDP,
        &udp(RESOLVER, POD_B, 53, 33000, &answer, true),
    );
    let (v, with) = fx.run_timed("to_pod", IFINDEX_A, &udp_to_a(&answer), REPEAT);
    assert_eq!(v, PASS);
    let (v, without) = fx.run_timed("to_pod", IFINDEX_B, &to_b, REPEAT);
    assert_eq!(v, PASS);
    assert!(leaves(&fx, SITE, 443), "the timed runs learned");
    eprintln!(
        "a DNS answer into a pod: {without} ns without domain rules, {with} ns with \
         (read, two addresses learned)"
    );
    assert!(
        with < without + 20_000,
        "reading an answer costs {with} ns against {without} ns"
    );
}
