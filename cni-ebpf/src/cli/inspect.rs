//! `cni-ebpf inspect`: a network's datapath as its pinned maps hold it (node config,
//! endpoints with counters, host ports, NAT entries, flows, NetworkPolicy rule sets, the
//! Service frontends translated at the socket, map fill, reason counters), with the NetworkPolicy state the agent wrote (the policies
//! that select each pod) and the latest packets the policy refused (`--follow` streams
//! them),
//! each endpoint with the Kubernetes pod it belongs to, optionally for one pod only.
//!
//! The pod comes from the IPAM store's record of the endpoint (`K8S_POD_NAMESPACE` and
//! `K8S_POD_NAME` of the ADD): the maps the programs read keep no names.

use std::{collections::HashSet, fmt, net::IpAddr, path::PathBuf};

use serde_json::{json, Value};

use super::NetworkArgs;
use crate::{
    agent::report::{read_state, PodState},
    cni::config::DEFAULT_DATA_DIR,
    datapath::{policy::DenyView, Datapath},
    error::{Error, Result},
    ipam::{record, PodRef},
};

/// Arguments of `cni-ebpf inspect`.
#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    #[command(flatten)]
    net: NetworkArgs,
    /// `dataDir` of the network (where the IPAM store names each endpoint's pod).
    #[arg(long, default_value = DEFAULT_DATA_DIR)]
    data_dir: PathBuf,
    /// Only this pod: `NAMESPACE/NAME`, or `NAME` in any namespace. Its endpoints, host
    /// ports and NAT entries; node-wide sections (maps, reasons) stay whole.
    #[arg(long)]
    pod: Option<String>,
    /// Only pods of this Kubernetes namespace.
    #[arg(long, short = 'n')]
    namespace: Option<String>,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
    /// Where the agent writes its NetworkPolicy state (which policies select each pod).
    #[arg(long, default_value = crate::agent::report::DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
    /// Streams the packets NetworkPolicy refuses (of the pods `--pod`/`--namespace`
    /// select, or all), one line each (`--json`: one object each), until interrupted.
    #[arg(long)]
    follow: bool,
}

impl InspectArgs {
    fn filter(&self) -> Option<PodFilter> {
        let (ns, name) = match self
            .pod
            .as_deref()
            .map(|p| p.split_once('/').map_or((None, p), |(n, p)| (Some(n), p)))
        {
            Some((ns, name)) => (
                ns.map(str::to_owned).or_else(|| self.namespace.clone()),
                Some(name.to_owned()),
            ),
            None => (self.namespace.clone(), None),
        };
        (ns.is_some() || name.is_some()).then_some(PodFilter {
            namespace: ns,
            name,
        })
    }
}

/// Which pods `--pod` / `--namespace` select.
struct PodFilter {
    namespace: Option<String>,
    name: Option<String>,
}

impl PodFilter {
    fn matches(&self, pod: Option<&PodRef>) -> bool {
        pod.is_some_and(|p| {
            self.namespace.as_ref().is_none_or(|n| *n == p.namespace)
                && self.name.as_ref().is_none_or(|n| *n == p.name)
        })
    }
}

impl fmt::Display for PodFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.namespace, &self.name) {
            (Some(ns), Some(name)) => write!(f, "pod {ns}/{name}"),
            (None, Some(name)) => write!(f, "a pod named {name}"),
            (Some(ns), None) => write!(f, "namespace {ns}"),
            (None, None) => write!(f, "any pod"),
        }
    }
}

/// Runs `cni-ebpf inspect`.
pub fn run(args: &InspectArgs) -> Result<()> {
    let net = &args.net;
    let dir = net.bpffs_root.join(&net.network);
    let dp = Datapath::open_at(&dir)?.ok_or_else(|| {
        Error::datapath(
            "inspect",
            format!("nothing is pinned under {}", dir.display()),
        )
    })?;
    let node = dp.node_config_view()?;
    let pods = record::pods_of(&args.data_dir.join(&net.network));
    let pod_of = |cid: &str, ifname: &str| pods.get(&(cid.to_owned(), ifname.to_owned()));
    let mut endpoints = dp.endpoints()?;
    let mut ports = dp.port_mappings()?;
    let mut nat = dp.nat_entries()?;
    if let Some(filter) = args.filter() {
        endpoints.retain(|e| filter.matches(pod_of(&e.container_id, &e.ifname)));
        if endpoints.is_empty() {
            return Err(Error::datapath(
                "inspect",
                format!(
                    "no endpoint of network {} belongs to {filter} (pods are known by the \
                     K8S_POD_NAMESPACE/K8S_POD_NAME their runtime passed at ADD)",
                    net.network
                ),
            ));
        }
        let owners: HashSet<(&str, &str)> = endpoints
            .iter()
            .map(|e| (e.container_id.as_str(), e.ifname.as_str()))
            .collect();
        ports.retain(|p| owners.contains(&(p.container_id.as_str(), p.ifname.as_str())));
        let ips: HashSet<IpAddr> = endpoints.iter().map(|e| e.ip).collect();
        nat.retain(|n| {
            [n.src, n.dst, n.new_src, n.new_dst]
                .iter()
                .any(|a| ips.contains(a))
        });
    }
    let filtered = args.filter().is_some();
    let shown: HashSet<u32> = endpoints.iter().map(|e| e.host_ifindex).collect();
    let ips: HashSet<IpAddr> = endpoints.iter().map(|e| e.ip).collect();
    // A pod's denies: those its own rules gave, and those of packets from or to it.
    let concerns = |d: &DenyView| {
        !filtered
            || shown.contains(&d.host_ifindex)
            || ips.contains(&d.source)
            || ips.contains(&d.destination)
    };
    if args.follow {
        return follow(&dp, &concerns, args.json);
    }
    let reasons = dp.reason_counts()?;
    let services = dp.service_views()?;
    let flows = dp.flow_summary()?;
    let maps = dp.map_stats()?;
    let mut policy = dp.policy_view()?;
    policy.endpoints.retain(|e| shown.contains(&e.host_ifindex));
    let agent = read_state(&args.state_dir, &net.network);
    let selecting = |ifindex: u32| {
        agent
            .as_ref()
            .and_then(|s| s.pods.iter().find(|p| p.ifindex == ifindex))
    };
    let mut denies = dp.policy_denies()?;
    denies.retain(|d| concerns(d));
    let denies: Vec<DenyView> = denies.split_off(denies.len().saturating_sub(SHOWN_DENIES));
    let named: HashSet<String> = policy
        .endpoints
        .iter()
        .flat_map(|e| [e.ingress.clone(), e.egress.clone()])
        .collect();
    policy
        .rulesets
        .retain(|id, _| named.contains(&crate::datapath::policy::describe_ruleset(*id)));
    if args.json {
        let endpoints: Vec<Value> = endpoints
            .iter()
            .map(|e| {
                let mut v = serde_json::to_value(e).unwrap_or(Value::Null);
                if let (Some(obj), Some(pod)) =
                    (v.as_object_mut(), pod_of(&e.container_id, &e.ifname))
                {
                    obj.insert(
                        "pod".into(),
                        serde_json::to_value(pod).unwrap_or(Value::Null),
                    );
                }
                v
            })
            .collect();
        let pods: Vec<&PodState> = policy
            .endpoints
            .iter()
            .filter_map(|e| selecting(e.host_ifindex))
            .collect();
        let mut policy = serde_json::to_value(&policy).unwrap_or(Value::Null);
        if let Some(obj) = policy.as_object_mut() {
            obj.insert(
                "pods".into(),
                serde_json::to_value(&pods).unwrap_or_default(),
            );
            obj.insert(
                "denies".into(),
                serde_json::to_value(&denies).unwrap_or_default(),
            );
        }
        let doc = json!({ "node": node, "endpoints": endpoints, "portMappings": ports, "nat": nat, "flows": flows, "policy": policy, "services": services, "reasons": reasons, "maps": maps });
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
        return Ok(());
    }
    let addr = node
        .node_addr
        .map_or_else(|| "-".to_owned(), |a| a.to_string());
    let addr6 = node
        .node_addr6
        .map_or_else(|| "-".to_owned(), |a| a.to_string());
    println!(
        "node: address {addr}, IPv6 address {addr6}, uplink #{}, ipMasq {}, clusterCIDRs [{}], \
         SNAT ports {}-{} (at most {} per pod and destination)",
        node.uplink_ifindex,
        node.ip_masq,
        node.cluster_cidrs.join(", "),
        node.snat_ports.0,
        node.snat_ports.1,
        node.snat_dest_cap
    );
    println!("\nENDPOINTS ({})", endpoints.len());
    println!(
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
    for e in &endpoints {
        let owner = format!("{}/{}", short(&e.container_id), e.ifname);
        let pod =
            pod_of(&e.container_id, &e.ifname).map_or_else(|| "-".to_owned(), ToString::to_string);
        println!(
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
    println!("\nHOST PORTS ({})", ports.len());
    println!(
        "{:<16} {:<6} {:<5} {:<22} {:<28}",
        "HOST IP", "PORT", "PROTO", "POD", "OWNER"
    );
    for p in &ports {
        let hip = p.host_ip.map_or_else(|| "*".to_owned(), |a| a.to_string());
        let owner = format!("{}/{}", short(&p.container_id), p.ifname);
        println!(
            "{hip:<16} {:<6} {:<5} {:<22} {owner:<28}",
            p.host_port,
            p.protocol,
            format!("{}:{}", p.pod_ip, p.container_port)
        );
    }
    println!("\nNAT ({})", nat.len());
    println!(
        "{:<14} {:<15} {:<5} {:<22} {:<22} {:<22} {:<22} {:>8} {:<9} {:<7}",
        "KIND", "HOOK", "PROTO", "SRC", "DST", "NEW SRC", "NEW DST", "IDLE MS", "STATE", "DELIVER"
    );
    for n in &nat {
        println!(
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
    println!(
        "\nFLOWS: {} fast-pathed (verified untranslated), {} on the kernel path (new or \
         translated by netfilter), {} opened from outside; {} pod sockets talking through \
         the stack, {} node sockets on host ports",
        flows.verified, flows.pending, flows.inbound, flows.stack_sockets, flows.host_port_sockets
    );
    println!(
        "\nNETWORKPOLICY: generation {}{}",
        policy.generation,
        match (policy.generation, node.network_policy) {
            (0, true) => {
                " (not in force yet: every pod is closed but to the node's traffic until the \
                 agent has put the cluster's policy in force)"
            }
            (0, false) =>
                " (networkPolicy is off and no agent has swapped a policy in: nothing is judged)",
            _ => "",
        }
    );
    if node.network_policy {
        println!(
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
    println!(
        "  {:<8} {:<32} {:<16} {:<16}",
        "HOSTIF", "POD", "INGRESS", "EGRESS"
    );
    for p in &policy.endpoints {
        let pod = endpoints
            .iter()
            .find(|e| e.host_ifindex == p.host_ifindex)
            .and_then(|e| pod_of(&e.container_id, &e.ifname))
            .map_or_else(|| "-".to_owned(), ToString::to_string);
        println!(
            "  {:<8} {:<32} {:<16} {:<16}",
            p.host_ifindex, pod, p.ingress, p.egress
        );
        match selecting(p.host_ifindex) {
            Some(s) => {
                for (dir, side) in [("ingress", &s.ingress), ("egress", &s.egress)] {
                    if side.policies.is_empty() && side.closed.is_none() {
                        continue;
                    }
                    println!(
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
            None if agent.is_some() => {
                println!("    the agent does not know this pod yet (ADD left it as it is)");
            }
            None => {}
        }
    }
    if agent.is_none() {
        println!(
            "  (no agent state in {}: which policies select each pod is not known)",
            args.state_dir.display()
        );
    }
    for (id, rs) in &policy.rulesets {
        println!("  rules #{id}:");
        for line in rs.peers.iter().chain(&rs.ports).chain(&rs.named) {
            println!("    {line}");
        }
    }
    println!(
        "\nDENIED BY NETWORKPOLICY (the latest {}{})",
        denies.len(),
        if filtered {
            " concerning the pods shown"
        } else {
            ""
        }
    );
    for d in &denies {
        println!("  {d}");
    }
    println!(
        "\nSERVICES ({} frontends: `socket` for the node and its pods, `uplink` for flows from outside{})",
        services.len(),
        if services.is_empty() {
            "; the agent's --kube-proxy-replacement is off, or no Service has a ClusterIP"
        } else {
            ""
        }
    );
    for svc in services.iter().take(SHOWN_SERVICES) {
        println!(
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
        println!(
            "  … and {} more (--json lists every one)",
            services.len() - SHOWN_SERVICES
        );
    }
    println!("\nMAPS");
    println!(
        "  {:<14} {:<16} {:>10} {:>10} {:>12}",
        "NAME", "TYPE", "ENTRIES", "MAX", "MEMLOCK"
    );
    for m in &maps {
        let entries = m.entries.map_or_else(|| "-".to_owned(), |n| n.to_string());
        println!(
            "  {:<14} {:<16} {:>10} {:>10} {:>12}",
            m.name, m.map_type, entries, m.max_entries, m.memlock_bytes
        );
    }
    println!(
        "  {:<14} {:<16} {:>10} {:>10} {:>12}",
        "total",
        "",
        "",
        "",
        maps.iter().map(|m| m.memlock_bytes).sum::<u64>()
    );
    println!("\nREASONS");
    for r in reasons.iter().filter(|r| r.count > 0) {
        println!("  {:<28} {:>12}", r.reason, r.count);
    }
    Ok(())
}

/// At most this many Service frontends are listed as text.
const SHOWN_SERVICES: usize = 200;
/// At most this many deny events are listed (the newest).
const SHOWN_DENIES: usize = 50;
/// How often `--follow` reads the deny rings.
const FOLLOW_EVERY: std::time::Duration = std::time::Duration::from_millis(200);

/// `--follow`: every deny event `concerns` keeps, the ones in the rings now and then each
/// new one, in time order, until the process is interrupted.
fn follow(dp: &Datapath, concerns: &dyn Fn(&DenyView) -> bool, json: bool) -> Result<()> {
    use std::io::Write as _;
    let mut seen: HashSet<(usize, u64, u64)> = HashSet::new();
    loop {
        let denies = dp.policy_denies()?;
        let mut out = std::io::stdout().lock();
        let now: HashSet<(usize, u64, u64)> =
            denies.iter().map(|d| (d.cpu, d.seq, d.time_ns)).collect();
        for d in denies
            .iter()
            .filter(|d| !seen.contains(&(d.cpu, d.seq, d.time_ns)) && concerns(d))
        {
            let line = if json {
                serde_json::to_string(d).unwrap_or_default()
            } else {
                d.to_string()
            };
            // A closed pipe (`| head`) ends the stream.
            if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
                return Ok(());
            }
        }
        seen = now;
        drop(out);
        std::thread::sleep(FOLLOW_EVERY);
    }
}

fn short(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}
