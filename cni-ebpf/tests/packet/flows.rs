//! The datapath next to netfilter, one decision per test through
//! `BPF_PROG_TEST_RUN`. A flow's first packets go to the stack; a flow seen leaving the
//! uplink untranslated takes the fast path; a flow netfilter translated stays on the
//! kernel path; replies to a pod socket that talks through the stack go to the stack;
//! replies in flows opened from outside are never masqueraded.
//!
//! Pod A's host veth is the loopback device (see `IFINDEX_A`), so `from_pod` runs here
//! see pod A's packets as arriving on A's own veth.

use std::net::{Ipv4Addr, Ipv6Addr};

use cni_ebpf_common::{FlowFlags, Reason};
use testbed::packet::*;

use crate::frames6::*;

/// A Service's ClusterIP (never routed anywhere: netfilter DNATs it).
const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
/// A host-network endpoint of that Service on another node (outside clusterCIDRs).
const HOSTNET_EP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 50);

fn node() -> Fixture {
    Fixture::with_two_pods()
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn a_flows_first_packet_goes_to_the_stack_and_is_recorded_pending() {
    let fx = node();
    let syn = tcp_frame(POD_A, 40000, EXT, 80, SYN);
    fx.assert_passes_unchanged("from_pod", &syn, "first packet of a flow leaving the node");
    assert_eq!(fx.reason(Reason::PassUnverifiedFlow), 1);
    assert_eq!(fx.flow(&flow_key(&syn)), Some(FlowFlags::PENDING));

    // A spoofed source is dropped before anything is recorded (it could steer another
    // pod's flows).
    let spoofed = tcp_frame(POD_B, 40000, EXT, 80, SYN);
    let (v, _) = fx.run_on("from_pod", IFINDEX_A, &spoofed);
    assert_eq!(v, SHOT, "pod A sending as pod B");
    assert_eq!(fx.flow(&flow_key(&spoofed)), None);
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn an_untranslated_flow_is_verified_at_the_uplink_and_then_fast_pathed() {
    let fx = node();
    let syn = tcp_frame(POD_A, 40000, EXT, 80, SYN);
    fx.run("from_pod", &syn);
    // The stack forwarded it unchanged: uplink_egress sees the very tuple.
    let (v, _) = fx.run("uplink_egress", &syn);
    assert_eq!(v, OK);
    assert_eq!(fx.flow(&flow_key(&syn)), Some(FlowFlags::VERIFIED));
    assert_eq!(fx.reason(Reason::FlowVerified), 1);
    assert_eq!(fx.dp().flow_summary().unwrap().verified, 1);

    // The next packet is not handed to the stack by the flow check: it goes to the
    // uplink fast path (whose FIB lookup here, outside any node, then leaves it to the
    // kernel route).
    let ack = tcp_frame(POD_A, 40000, EXT, 80, ACK);
    let before = fx.reason(Reason::PassUnverifiedFlow);
    fx.run("from_pod", &ack);
    assert_eq!(
        fx.reason(Reason::PassUnverifiedFlow),
        before,
        "ACK of a verified flow"
    );
    assert_eq!(
        fx.reason(Reason::RedirectUplink) + fx.reason(Reason::PassKernelRoute),
        1,
        "the verified flow's packet must reach the uplink fast path"
    );

    // A SYN is always judged afresh (a new connection on a reused tuple).
    fx.assert_passes_unchanged("from_pod", &syn, "SYN of a verified tuple");
    assert_eq!(fx.reason(Reason::PassUnverifiedFlow), before + 1);
    assert_eq!(fx.flow(&flow_key(&syn)), Some(FlowFlags::PENDING));
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn a_flow_netfilter_translates_stays_on_the_kernel_path() {
    let fx = node();
    let to_vip = tcp_frame(POD_A, 40000, VIP, 80, SYN);
    fx.assert_passes_unchanged("from_pod", &to_vip, "pod → ClusterIP");
    // kube-proxy DNATs it to a remote pod: the uplink sees another tuple.
    let dnated = tcp_frame(POD_A, 40000, REMOTE_POD, 8080, SYN);
    fx.assert_passes_unchanged("uplink_egress", &dnated, "DNATed packet to a cluster pod");
    assert_eq!(fx.flow(&flow_key(&to_vip)), Some(FlowFlags::PENDING));
    assert_eq!(fx.reason(Reason::FlowVerified), 0);

    // Every later packet of the flow still goes to the stack.
    for _ in 0..3 {
        fx.assert_passes_unchanged(
            "from_pod",
            &tcp_frame(POD_A, 40000, VIP, 80, ACK),
            "later packet of a translated flow",
        );
    }
    assert_eq!(fx.reason(Reason::PassUnverifiedFlow), 4);
    assert_eq!(fx.reason(Reason::RedirectUplink), 0);
    // `inspect` shows it on the kernel path, the pod socket as talking through the stack.
    let s = fx.dp().flow_summary().unwrap();
    assert_eq!((s.verified, s.pending, s.stack_sockets), (0, 1, 1), "{s:?}");
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn a_translated_connection_on_an_ended_direct_flows_tuple_stays_on_the_kernel_path() {
    let fx = node();
    // Pod A talks to a remote pod directly from port 40000: verified, fast-pathed.
    let direct = tcp_frame(POD_A, 40000, REMOTE_POD, 8080, SYN);
    fx.run("from_pod", &direct);
    fx.run("uplink_egress", &direct);
    assert_eq!(fx.flow(&flow_key(&direct)), Some(FlowFlags::VERIFIED));
    // That connection ends; port 40000 calls the ClusterIP, which kube-proxy DNATs to the
    // same endpoint: the SYN leaves with the old flow's tuple.
    fx.assert_passes_unchanged("from_pod", &tcp_frame(POD_A, 40000, VIP, 80, SYN), "SYN");
    fx.assert_passes_unchanged("uplink_egress", &direct, "the DNATed SYN");
    assert_eq!(
        fx.flow(&flow_key(&direct)),
        None,
        "the ended flow's entry must go"
    );
    // The endpoint's SYN-ACK goes to the stack, which un-DNATs it.
    let reply = tcp_frame(REMOTE_POD, 8080, POD_A, 40000, SYN | ACK);
    fx.assert_passes_unchanged("uplink_ingress", &reply, "the reply of a DNATed flow");
    assert_eq!(fx.reason(Reason::RedirectFromUplink), 0);
    // Later packets of it too.
    let later = tcp_frame(POD_A, 40000, REMOTE_POD, 8080, ACK);
    fx.assert_passes_unchanged("uplink_egress", &later, "a later DNATed packet");
    let reply = tcp_frame(REMOTE_POD, 8080, POD_A, 40000, ACK);
    fx.assert_passes_unchanged("uplink_ingress", &reply, "a later reply");
    assert_eq!(fx.reason(Reason::RedirectFromUplink), 0);
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn a_service_reply_between_local_pods_goes_to_the_stack() {
    let fx = node();
    // Pod A calls the ClusterIP; kube-proxy DNATs it to pod B on this node.
    fx.run("from_pod", &tcp_frame(POD_A, 40000, VIP, 80, SYN));
    // B's reply to A:40000 must be un-DNATed by the stack (A called VIP, not B).
    let reply = tcp_frame(POD_B, 8080, POD_A, 40000, SYN | ACK);
    fx.assert_passes_unchanged("from_pod", &reply, "endpoint → client of a Service flow");
    assert_eq!(fx.reason(Reason::PassTranslatedReply), 1);
    assert_eq!(fx.reason(Reason::RedirectPod), 0);

    // Pod → pod traffic to another of A's sockets is still redirected at once.
    let (v, _) = fx.run("from_pod", &tcp_frame(POD_B, 8080, POD_A, 40001, SYN));
    assert_eq!(v, REDIRECT, "plain pod → pod is fast from its first packet");
    // And a reply from the very peer A's socket addressed is too.
    fx.run("from_pod", &udp_frame(POD_A, 5353, POD_B, 53));
    let (v, _) = fx.run("from_pod", &udp_frame(POD_B, 53, POD_A, 5353));
    assert_eq!(v, REDIRECT);
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn replies_in_flows_opened_from_outside_are_not_masqueraded() {
    let fx = node();
    for (syn_in, reply_out, what) in [
        (
            tcp_frame(EXT, 50000, POD_A, 8080, SYN),
            tcp_frame(POD_A, 8080, EXT, 50000, SYN | ACK),
            "TCP",
        ),
        (
            udp_frame(EXT, 50001, POD_A, 53),
            udp_frame(POD_A, 53, EXT, 50001),
            "UDP",
        ),
    ] {
        fx.assert_passes_unchanged("uplink_ingress", &syn_in, &format!("{what} from outside"));
        assert_eq!(
            fx.flow(&flow_key(&reply_out)),
            Some(FlowFlags::INBOUND),
            "{what}"
        );
        fx.run("from_pod", &reply_out);
        fx.assert_passes_unchanged("uplink_egress", &reply_out, &format!("{what} reply"));
    }
    assert_eq!(fx.reason(Reason::PassInboundReply), 2);
    assert_eq!(fx.reason(Reason::SnatNew), 0);

    // A SYN-ACK never opens a masqueraded flow, even with no record of the inbound SYN.
    let stray = tcp_frame(POD_B, 8080, EXT, 50002, SYN | ACK);
    fx.assert_passes_unchanged("uplink_egress", &stray, "SYN-ACK without a record");
    // Cluster sources are not recorded (their replies are never masqueraded anyway).
    let from_cluster = tcp_frame(REMOTE_POD, 50003, POD_A, 8080, SYN);
    fx.run("uplink_ingress", &from_cluster);
    assert_eq!(
        fx.flow(&flow_key(&tcp_frame(POD_A, 8080, REMOTE_POD, 50003, ACK))),
        None
    );
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn masquerade_of_a_flow_netfilter_translated_returns_through_the_stack() {
    let fx = node();
    // Pod A → ClusterIP, DNATed by kube-proxy to a host-network endpoint outside the
    // cluster CIDRs: we masquerade what reaches the uplink, but the reply must go back
    // through the stack so that netfilter can undo its DNAT.
    fx.run("from_pod", &tcp_frame(POD_A, 40000, VIP, 80, SYN));
    let (v, out) = fx.run(
        "uplink_egress",
        &tcp_frame(POD_A, 40000, HOSTNET_EP, 8080, SYN),
    );
    assert_eq!(v, OK);
    let p = parse_checked(&out);
    assert_eq!(p.src, NODE);
    let (v, out) = fx.run(
        "uplink_ingress",
        &tcp_frame(HOSTNET_EP, 8080, NODE, p.sport, SYN | ACK),
    );
    assert_eq!(
        v, OK,
        "the reply goes to the stack, not straight into the pod"
    );
    let r = parse_checked(&out);
    assert_eq!(
        (r.src, r.sport, r.dst, r.dport),
        (HOSTNET_EP, 8080, POD_A, 40000)
    );
    assert_eq!(fx.reason(Reason::SnatReplyToStack), 1);
    assert_eq!(fx.reason(Reason::SnatReply), 0);

    // An untranslated masqueraded flow's reply still goes straight into the pod.
    let (_, out) = fx.egress(&tcp_frame(POD_A, 40001, EXT, 80, SYN));
    let np = parse_checked(&out).sport;
    let (v, _) = fx.run("uplink_ingress", &tcp_frame(EXT, 80, NODE, np, SYN | ACK));
    assert_eq!(v, REDIRECT);
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn host_port_replies_may_bypass_the_stack_at_once() {
    let fx = node();
    fx.add_ports("ctr-b", POD_B, &[pm(8080, 80, "tcp", None)]);
    let (v, _) = fx.run("uplink_ingress", &tcp_frame(EXT, 50000, NODE, 8080, SYN));
    assert_eq!(v, REDIRECT);
    // We translated and delivered it past netfilter: B's replies need no verification,
    // and are never masqueraded.
    assert_eq!(
        fx.flow(&flow_key(&tcp_frame(POD_B, 80, EXT, 50000, ACK))),
        Some(FlowFlags::VERIFIED | FlowFlags::INBOUND)
    );
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn a_verified_flow_is_fast_both_ways() {
    let fx = node();
    // Pod A → a pod on another node: verified on its way out.
    let syn = tcp_frame(POD_A, 40000, REMOTE_POD, 8080, SYN);
    fx.run("from_pod", &syn);
    fx.run("uplink_egress", &syn);
    // Its other direction skips the stack too (conntrack must not see one direction
    // only: it would call the acknowledgements of data it never saw INVALID).
    let (v, out) = fx.run(
        "uplink_ingress",
        &tcp_frame(REMOTE_POD, 8080, POD_A, 40000, SYN | ACK),
    );
    assert_eq!(
        v, REDIRECT,
        "reply of a verified flow goes straight into the pod"
    );
    let p = parse_checked(&out);
    assert_eq!((p.dmac, p.smac, p.ttl), (POD_MAC_A, HOST_MAC_A, 63));
    assert_eq!(fx.reason(Reason::RedirectFromUplink), 1);

    // A flow that is not verified goes to the stack, and so does a SYN on a verified
    // tuple (a new connection from outside is judged afresh).
    fx.assert_passes_unchanged(
        "uplink_ingress",
        &tcp_frame(REMOTE_POD, 8081, POD_A, 40000, ACK),
        "packet of an unverified flow",
    );
    fx.assert_passes_unchanged(
        "uplink_ingress",
        &tcp_frame(REMOTE_POD, 8080, POD_A, 40000, SYN),
        "SYN from outside",
    );
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn a_server_answering_outside_clients_through_the_stack_keeps_local_clients_fast() {
    let fx = node();
    // Pod B's TCP server on 80 answers a client outside (its SYN-ACK goes through the
    // stack, as a new flow's packets do).
    fx.run("from_pod", &tcp_frame(POD_B, 80, EXT, 50000, SYN | ACK));
    // Pod B's UDP server on 53 answers a flow opened from outside.
    fx.run("uplink_ingress", &udp_frame(EXT, 50001, POD_B, 53));
    fx.run("from_pod", &udp_frame(POD_B, 53, EXT, 50001));
    assert_eq!(fx.reason(Reason::PassUnverifiedFlow), 2);
    // A local client's requests to those servers are still redirected at once.
    for (what, pkt) in [
        ("TCP", tcp_frame(POD_A, 41000, POD_B, 80, SYN)),
        ("UDP", udp_frame(POD_A, 41001, POD_B, 53)),
    ] {
        let (v, _) = fx.run("from_pod", &pkt);
        assert_eq!(
            v, REDIRECT,
            "{what} request from a local pod to pod B's server"
        );
    }
    assert_eq!(fx.reason(Reason::PassTranslatedReply), 0);
    assert_eq!(fx.dp().flow_summary().unwrap().stack_sockets, 0);
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn a_reused_client_port_talking_to_a_local_pod_is_fast_again() {
    let fx = node();
    // Pod A's port 40000 called a ClusterIP (through the stack)...
    fx.run("from_pod", &tcp_frame(POD_A, 40000, VIP, 80, SYN));
    // ...then, after that connection, the same port connects to pod B directly.
    let (v, _) = fx.run("from_pod", &tcp_frame(POD_A, 40000, POD_B, 8080, SYN));
    assert_eq!(v, REDIRECT);
    let (v, _) = fx.run("from_pod", &tcp_frame(POD_B, 8080, POD_A, 40000, SYN | ACK));
    assert_eq!(
        v, REDIRECT,
        "the direct connection's replies are not sent to the stack"
    );
    assert_eq!(fx.reason(Reason::PassTranslatedReply), 0);
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn the_reply_of_a_flow_opened_from_outside_keeps_the_pods_ipv6_address() {
    let fx = dual_stack_node();
    // An outside client opens a connection to the pod (routed to it by the stack).
    let syn = tcp6(EXT6, 50000, POD_A6, 8080, SYN);
    fx.assert_passes_unchanged("uplink_ingress", &syn, "inbound SYN to a pod");
    // The pod's answer leaves with its own address: MASQUERADE only translates flows the
    // pod opened.
    let synack = tcp6(POD_A6, 8080, EXT6, 50000, SYN | ACK);
    fx.assert_passes_unchanged("uplink_egress", &synack, "the pod's SYN-ACK");
    let ack = tcp6(POD_A6, 8080, EXT6, 50000, ACK);
    fx.assert_passes_unchanged("uplink_egress", &ack, "the pod's next segment");
    assert_eq!(nat6_len(&fx), 0);
    assert!(fx.reason(Reason::PassInboundReply) >= 1);
}

/// The uplink fast path's count: a redirect to the uplink, or (the FIB lookup, outside
/// any node here, finding no route out of the uplink) the kernel route.
fn uplink_fast_path(fx: &Fixture) -> u64 {
    fx.reason(Reason::RedirectUplink) + fx.reason(Reason::PassKernelRoute)
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn an_untranslated_ipv6_flow_is_verified_then_fast_pathed_both_ways() {
    let fx = dual_stack_node();
    let syn = tcp6(POD_A6, 40000, EXT6, 443, SYN);
    fx.assert_passes_unchanged("from_pod", &syn, "the first packet goes to the stack");
    let key = key6(POD_A6, 40000, EXT6, 443, TCP);
    assert_eq!(flow6(&fx, &key), Some(FlowFlags::PENDING));
    // The stack forwarded it unchanged: uplink_egress sees the pod's very tuple (and
    // masquerades it).
    let (v, out) = fx.run("uplink_egress", &syn);
    assert_eq!(v, OK);
    assert_eq!(flow6(&fx, &key), Some(FlowFlags::VERIFIED));
    assert_eq!(fx.reason(Reason::FlowVerified), 1);
    let nport = parse6(&out).sport;

    // Later packets skip the stack and the flow check.
    let ack = tcp6(POD_A6, 40000, EXT6, 443, ACK);
    let before = fx.reason(Reason::PassUnverifiedFlow);
    fx.run("from_pod", &ack);
    assert_eq!(
        fx.reason(Reason::PassUnverifiedFlow),
        before,
        "ACK of a verified flow"
    );
    assert_eq!(
        uplink_fast_path(&fx),
        1,
        "the verified flow's packet took the fast path"
    );

    // The reply, translated back, goes straight into the pod: the stack saw neither
    // direction after the first packet.
    let reply = tcp6(EXT6, 443, NODE6, nport, SYN | ACK);
    let (v, back) = fx.run("uplink_ingress", &reply);
    assert_eq!(v, REDIRECT, "into pod A (bpf_redirect_peer)");
    assert_eq!(back[0..6], POD_MAC_A);
    assert_eq!(back[14 + 7], 63, "hop limit decremented");
    let b = parse6(&back);
    assert_eq!((b.src, b.dst, b.dport), (EXT6, POD_A6, 40000));
    assert!(b.csum_ok);

    // A SYN is judged afresh (a new connection on a reused tuple).
    fx.assert_passes_unchanged("from_pod", &syn, "SYN of a verified tuple");
    assert_eq!(flow6(&fx, &key), Some(FlowFlags::PENDING));
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn an_ipv6_flow_netfilter_translates_stays_on_the_kernel_path() {
    let fx = dual_stack_node();
    let vip = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 10);
    let remote = Ipv6Addr::new(0xfd00, 0x10, 0x244, 2, 0, 0, 0, 5);
    let to_vip = tcp6(POD_A6, 40000, vip, 80, SYN);
    fx.assert_passes_unchanged("from_pod", &to_vip, "pod → IPv6 ClusterIP");
    // kube-proxy DNATs it to a pod of another node: the uplink sees another tuple.
    let dnated = tcp6(POD_A6, 40000, remote, 8080, SYN);
    fx.assert_passes_unchanged("uplink_egress", &dnated, "DNATed to a cluster pod");
    let key = key6(POD_A6, 40000, vip, 80, TCP);
    assert_eq!(flow6(&fx, &key), Some(FlowFlags::PENDING));
    assert_eq!(fx.reason(Reason::FlowVerified), 0);
    for _ in 0..3 {
        fx.assert_passes_unchanged(
            "from_pod",
            &tcp6(POD_A6, 40000, vip, 80, ACK),
            "a later packet of a translated flow",
        );
    }
    assert_eq!(fx.reason(Reason::PassUnverifiedFlow), 4);
    assert_eq!(uplink_fast_path(&fx), 0);
    // The endpoint's reply (remote → pod, before netfilter's un-DNAT) is not for a
    // verified flow: the stack gets it.
    fx.assert_passes_unchanged(
        "uplink_ingress",
        &tcp6(remote, 8080, POD_A6, 40000, SYN | ACK),
        "the reply of a translated flow",
    );
    assert_eq!(fx.reason(Reason::RedirectFromUplink), 0);
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn a_verified_ipv6_flow_to_another_node_comes_back_straight_into_the_pod() {
    let fx = dual_stack_node();
    let remote = Ipv6Addr::new(0xfd00, 0x10, 0x244, 2, 0, 0, 0, 5);
    let out = udp6(POD_A6, 40000, remote, 53);
    fx.assert_passes_unchanged("from_pod", &out, "the first packet");
    // Inside the cluster: verified, never masqueraded.
    fx.assert_passes_unchanged("uplink_egress", &out, "a pod → pod packet across nodes");
    assert_eq!(nat6_len(&fx), 0);
    assert_eq!(
        flow6(&fx, &key6(POD_A6, 40000, remote, 53, UDP)),
        Some(FlowFlags::VERIFIED)
    );
    let (v, back) = fx.run("uplink_ingress", &udp6(remote, 53, POD_A6, 40000));
    assert_eq!(v, REDIRECT, "the reply goes straight into pod A");
    assert_eq!(back[0..6], POD_MAC_A);
    assert_eq!(fx.reason(Reason::RedirectFromUplink), 1);
    // A packet of another flow from the same peer goes to the stack.
    fx.assert_passes_unchanged(
        "uplink_ingress",
        &udp6(remote, 54, POD_A6, 40000),
        "a flow the pod never opened",
    );
}
