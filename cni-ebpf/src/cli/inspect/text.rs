//! A [`Report`] as `inspect` prints it without `--json`: one function per section.

use std::fmt::Write as _;

use super::report::Report;

/// At most this many Service frontends are listed as text.
const SHOWN_SERVICES: usize = 200;

/// The whole report, section by section.
pub(super) fn render(r: &Report) -> String {
    let mut out = String::new();
    for section in [
        node, wireguard, endpoints, host_ports, nat, flows, policy, denies, services, maps, reasons,
    ] {
        section(&mut out, r);
    }
    out
}

/// `writeln!` into the report's text (writing to a `String` cannot fail).
macro_rules! line {
    ($out:expr) => { let _ = writeln!($out); };
    ($out:expr, $($arg:tt)*) => { let _ = writeln!($out, $($arg)*); };
}

fn node(out: &mut String, r: &Report) {
    let node = &r.node;
    let addr = node
        .node_addr
        .map_or_else(|| "-".to_owned(), |a| a.to_string());
    let addr6 = node
        .node_addr6
        .map_or_else(|| "-".to_owned(), |a| a.to_string());
    line!(
        out,
        "node: address {addr}, IPv6 address {addr6}, uplink #{}, ipMasq {}, clusterCIDRs [{}], \
         SNAT ports {}-{} (at most {} per pod and destination)",
        node.uplink_ifindex,
        node.ip_masq,
        node.cluster_cidrs.join(", "),
        node.snat_ports.0,
        node.snat_ports.1,
        node.snat_dest_cap
    );
}

fn wireguard(out: &mut String, r: &Report) {
    let Some(w) = &r.wireguard else {
        return;
    };
    let mode = match (w.encrypting, w.strict) {
        (false, _) => "prepared: this network's pods do not encrypt yet",
        (true, true) => "nodes without a key unreachable",
        (true, false) => "nodes without a key reached IN CLEAR",
    };
    line!(
        out,
        "\nWIREGUARD {} (UDP {}, {mode}): public key {}",
        w.device,
        w.port,
        w.public_key.as_deref().unwrap_or("none yet")
    );
    line!(
        out,
        "{:<20} {:<46} {:<28} {:>20} {:>12} {:>12}",
        "NODE",
        "PUBLIC KEY",
        "ENDPOINT",
        "LAST HANDSHAKE",
        "RX BYTES",
        "TX BYTES"
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    for p in &w.peers {
        let handshake = p.last_handshake.map_or_else(
            || "never".to_owned(),
            |t| format!("{} s ago", now.saturating_sub(t)),
        );
        line!(
            out,
            "{:<20} {:<46} {:<28} {:>20} {:>12} {:>12}",
            p.node,
            p.public_key,
            p.endpoint.as_deref().unwrap_or("-"),
            handshake,
            p.rx_bytes,
            p.tx_bytes
        );
    }
    for (node, why) in &w.keyless {
        line!(out, "{node:<20} no peer: {why}");
    }
}

fn endpoints(out: &mut String, r: &Report) {
    line!(out, "\nENDPOINTS ({})", r.shown.endpoints.len());
    line!(
        out,
        "{:<16} {:<8} {:<18} {:<18} {:<28} {:<32} {:>10} {:>12} {:>10} {:>12}  EGRESS RATE",
        "IP",
        "HOSTIF",
        "HOST MAC",
        "POD MAC",
        "OWNER",
        "POD",
        "TX PKTS",
        "TX BYTES",
        "RX PKTS",
        "RX BYTES"
    );
    for e in &r.shown.endpoints {
        let owner = format!("{}/{}", short(&e.container_id), e.ifname);
        let pod = r
            .shown
            .pod_of(&e.container_id, &e.ifname)
            .map_or_else(|| "-".to_owned(), ToString::to_string);
        line!(
            out,
            "{:<16} {:<8} {:<18} {:<18} {:<28} {:<32} {:>10} {:>12} {:>10} {:>12}  {}  {}",
            e.ip,
            e.host_ifindex,
            e.host_mac,
            e.pod_mac,
            owner,
            pod,
            e.tx_packets,
            e.tx_bytes,
            e.rx_packets,
            e.rx_bytes,
            match (e.egress_rate_bits, e.egress_rate_mode) {
                (Some(r), Some(m)) => format!("{r} bit/s ({m})"),
                _ => "-".to_owned(),
            },
            match (e.nat_flows, e.nat_flows_cap) {
                (Some(n), Some(c)) => format!("nat {n}/{c}"),
                _ => String::new(),
            }
        );
    }
}

fn host_ports(out: &mut String, r: &Report) {
    line!(out, "\nHOST PORTS ({})", r.shown.ports.len());
    line!(
        out,
        "{:<16} {:<6} {:<5} {:<22} {:<28}",
        "HOST IP",
        "PORT",
        "PROTO",
        "POD",
        "OWNER"
    );
    for p in &r.shown.ports {
        let hip = p.host_ip.map_or_else(|| "*".to_owned(), |a| a.to_string());
        let owner = format!("{}/{}", short(&p.container_id), p.ifname);
        line!(
            out,
            "{hip:<16} {:<6} {:<5} {:<22} {owner:<28}",
            p.host_port,
            p.protocol,
            format!("{}:{}", p.pod_ip, p.container_port)
        );
    }
}

fn nat(out: &mut String, r: &Report) {
    line!(out, "\nNAT ({})", r.shown.nat.len());
    line!(
        out,
        "{:<14} {:<15} {:<5} {:<22} {:<22} {:<22} {:<22} {:>8} {:<9} {:<7}",
        "KIND",
        "HOOK",
        "PROTO",
        "SRC",
        "DST",
        "NEW SRC",
        "NEW DST",
        "IDLE MS",
        "STATE",
        "DELIVER"
    );
    for n in &r.shown.nat {
        line!(
            out,
            "{:<14} {:<15} {:<5} {:<22} {:<22} {:<22} {:<22} {:>8} {:<9} {:<7}",
            n.kind,
            n.hook,
            n.protocol,
            format!("{}:{}", n.src, n.sport),
            format!("{}:{}", n.dst, n.dport),
            format!("{}:{}", n.new_src, n.new_sport),
            format!("{}:{}", n.new_dst, n.new_dport),
            n.idle_ms,
            n.state,
            n.deliver
        );
    }
}

fn flows(out: &mut String, r: &Report) {
    let f = &r.flows;
    line!(
        out,
        "\nFLOWS: {} fast-pathed (verified untranslated), {} on the kernel path (new or \
         translated by netfilter), {} opened from outside; {} pod sockets talking through \
         the stack, {} node sockets on host ports",
        f.verified,
        f.pending,
        f.inbound,
        f.stack_sockets,
        f.host_port_sockets
    );
}

fn policy(out: &mut String, r: &Report) {
    let policy = &r.policy;
    line!(
        out,
        "\nNETWORKPOLICY: generation {}{}",
        policy.generation,
        match (policy.generation, r.node.network_policy) {
            (0, true) => {
                " (not in force yet: every pod is closed but to the node's traffic until the \
                 agent has put the cluster's policy in force)"
            }
            (0, false) =>
                " (networkPolicy is off and no agent has swapped a policy in: nothing is judged)",
            _ => "",
        }
    );
    if r.node.network_policy {
        line!(
            out,
            "  agent lease: {}",
            match policy.lease_left_s {
                None => "never held".to_owned(),
                Some(s) if s >= 0 => format!("held for {s} s more"),
                Some(s) => format!(
                    "ran out {} s ago: new pods are closed until an agent holds it",
                    -s
                ),
            }
        );
    }
    line!(
        out,
        "  {:<8} {:<32} {:<16} {:<16}",
        "HOSTIF",
        "POD",
        "INGRESS",
        "EGRESS"
    );
    for p in &policy.endpoints {
        let pod = r
            .shown
            .pod_of_ifindex(p.host_ifindex)
            .map_or_else(|| "-".to_owned(), ToString::to_string);
        line!(
            out,
            "  {:<8} {:<32} {:<16} {:<16}",
            p.host_ifindex,
            pod,
            p.ingress,
            p.egress
        );
        selected_by(out, r, p.host_ifindex);
    }
    if r.agent.is_none() {
        line!(
            out,
            "  (no agent state in {}: which policies select each pod is not known)",
            r.state_dir.display()
        );
    }
    for (id, rs) in &policy.rulesets {
        line!(out, "  rules #{id}:");
        for rule in rs.peers.iter().chain(&rs.ports).chain(&rs.named) {
            line!(out, "    {rule}");
        }
    }
}

/// The policies that select the pod behind `ifindex`, per direction, as the agent wrote
/// them.
fn selected_by(out: &mut String, r: &Report, ifindex: u32) {
    let Some(s) = r.selecting(ifindex) else {
        if r.agent.is_some() {
            line!(
                out,
                "    the agent does not know this pod yet (ADD left it as it is)"
            );
        }
        return;
    };
    for (dir, side) in [("ingress", &s.ingress), ("egress", &s.egress)] {
        if side.policies.is_empty() && side.closed.is_none() {
            continue;
        }
        line!(
            out,
            "    {dir}: selected by {}{}",
            if side.policies.is_empty() {
                "no policy".to_owned()
            } else {
                side.policies.join(", ")
            },
            side.closed
                .as_ref()
                .map_or_else(String::new, |why| format!("; closed: {why}"))
        );
    }
}

fn denies(out: &mut String, r: &Report) {
    line!(
        out,
        "\nDENIED BY NETWORKPOLICY (the latest {}{})",
        r.denies.len(),
        if r.shown.filtered {
            " concerning the pods shown"
        } else {
            ""
        }
    );
    for d in &r.denies {
        line!(out, "  {d}");
    }
}

fn services(out: &mut String, r: &Report) {
    let services = &r.services;
    line!(
        out,
        "\nSERVICES ({} frontends: `socket` for the node and its pods, `uplink` for flows from outside{})",
        services.len(),
        if services.is_empty() {
            "; the agent's --kube-proxy-replacement is off, or no Service has a ClusterIP"
        } else {
            ""
        }
    );
    for svc in services.iter().take(SHOWN_SERVICES) {
        line!(
            out,
            "  {:<28} {:<4} {:<6} {}{}",
            svc.frontend,
            svc.protocol,
            svc.scope,
            if svc.backends.is_empty() {
                "refused (no usable endpoint)".to_owned()
            } else {
                svc.backends.join(", ")
            },
            svc.affinity_secs
                .map_or_else(String::new, |s| format!("  (ClientIP affinity, {s} s)"))
        );
    }
    if services.len() > SHOWN_SERVICES {
        line!(
            out,
            "  … and {} more (--json lists every one)",
            services.len() - SHOWN_SERVICES
        );
    }
}

fn maps(out: &mut String, r: &Report) {
    line!(out, "\nMAPS");
    line!(
        out,
        "  {:<14} {:<16} {:>10} {:>10} {:>12}",
        "NAME",
        "TYPE",
        "ENTRIES",
        "MAX",
        "MEMLOCK"
    );
    for m in &r.maps {
        let entries = m.entries.map_or_else(|| "-".to_owned(), |n| n.to_string());
        line!(
            out,
            "  {:<14} {:<16} {:>10} {:>10} {:>12}",
            m.name,
            m.map_type,
            entries,
            m.max_entries,
            m.memlock_bytes
        );
    }
    line!(
        out,
        "  {:<14} {:<16} {:>10} {:>10} {:>12}",
        "total",
        "",
        "",
        "",
        r.maps.iter().map(|m| m.memlock_bytes).sum::<u64>()
    );
}

fn reasons(out: &mut String, r: &Report) {
    line!(out, "\nREASONS");
    for c in r.reasons.iter().filter(|c| c.count > 0) {
        line!(out, "  {:<28} {:>12}", c.reason, c.count);
    }
}

fn short(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}
