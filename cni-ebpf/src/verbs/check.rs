//! CHECK: compares `prevResult` with the live state — container interface, addresses,
//! routes, MTU; host veth and its peer; host routes; the IPAM reservation; the datapath's
//! endpoint entry, attached program and host ports. Each mismatch is its own message.
//!
//! One `validate_*` function per object checked, as the reference plugins have them; each
//! returns the first mismatch it finds as [`Error::Check`].

use std::net::IpAddr;

use ipnet::IpNet;

use crate::{
    cni::{
        config::{format_mac, InterfaceKind, NetConf},
        env::Env,
        result::{CniResult, Interface, Route},
    },
    datapath::{Datapath, Endpoint},
    error::{Error, Result},
    ipam,
    ipam::record::PodRef,
    kernel::link::{self, Link, Nl},
    kernel::netns::Netns,
};

/// What `prevResult` says this attachment is.
struct Expected<'a> {
    /// The container interface.
    ctr: &'a Interface,
    /// The host veth.
    host: &'a Interface,
    /// The container interface's addresses.
    pod_ips: Vec<IpNet>,
}

/// Runs CHECK.
pub fn run(env: &Env, conf: &NetConf, stdin: &[u8]) -> Result<()> {
    let prev = conf
        .prev_result
        .as_ref()
        .ok_or_else(|| Error::config("prevResult", "is required for CHECK"))?;
    let netns_path = env
        .netns
        .as_deref()
        .ok_or_else(|| Error::env("CNI_NETNS", "is required for CHECK"))?;
    let netns = Netns::open(netns_path).map_err(|e| Error::env("CNI_NETNS", e.to_string()))?;
    let sandbox = netns_path.display().to_string();
    let host_ifname = link::host_veth_name(&env.container_id, &env.ifname);
    let want = expected(prev, &env.ifname, &sandbox, &host_ifname)?;

    let rt = link::runtime()?;
    let (c, h) = rt.block_on(async {
        let node = Nl::connect()?;
        let ctr = Nl::connect_in(&netns)?;
        let facts = crate::datapath::node_facts::read(&node, conf.uplink.as_deref(), false).await?;
        let (mtu, _) = crate::datapath::node_facts::pod_mtu(
            conf,
            facts.uplink_mtu,
            facts.uplink_addr.is_some(),
        );
        let c = validate_container_interface(&ctr, mtu, &env.ifname, &sandbox, &want).await?;
        validate_container_routes(&ctr, &prev.routes, &want.pod_ips, c.index, &sandbox).await?;
        let h = validate_host_veth(&node, conf, &host_ifname, &env.ifname, &c, want.host).await?;
        validate_node_routes(&node, &want.pod_ips, h.index, &host_ifname).await?;
        Ok::<_, Error>((c, h))
    })?;

    ipam::check(conf, env, stdin, &want.pod_ips)?;
    validate_datapath(conf, env, host_ifname, &h, &c, &want.pod_ips)
}

/// Our two interfaces and the container's addresses in `prev`, or which is missing.
fn expected<'a>(
    prev: &'a CniResult,
    ifname: &str,
    sandbox: &str,
    host_ifname: &str,
) -> Result<Expected<'a>> {
    let ctr_idx = prev
        .interfaces
        .iter()
        .position(|i| i.name == ifname && i.sandbox.as_deref() == Some(sandbox))
        .ok_or_else(|| {
            Error::Check(format!(
                "prevResult lists no interface {ifname} in sandbox {sandbox}"
            ))
        })?;
    let host = prev
        .interfaces
        .iter()
        .find(|i| i.name == host_ifname && i.sandbox.is_none())
        .ok_or_else(|| Error::Check(format!("prevResult lists no host interface {host_ifname}")))?;
    let pod_ips: Vec<IpNet> = prev
        .ips
        .iter()
        .filter(|ip| ip.interface == Some(ctr_idx))
        .map(|ip| ip.address)
        .collect();
    if pod_ips.is_empty() {
        return Err(Error::Check(format!(
            "prevResult lists no address on {ifname}"
        )));
    }
    Ok(Expected {
        ctr: &prev.interfaces[ctr_idx],
        host,
        pod_ips,
    })
}

/// `mac` (from the live link) is the one `prevResult` lists for `name`, if it lists one.
fn validate_mac(name: &str, live: &[u8], want: Option<&String>) -> Result<()> {
    let Some(want) = want else {
        return Ok(());
    };
    let live = format_mac(live);
    if live.eq_ignore_ascii_case(want) {
        Ok(())
    } else {
        Err(Error::Check(format!(
            "{name} has MAC {live}, prevResult says {want}"
        )))
    }
}

/// The container interface exists, with prevResult's MAC, the configured MTU, up, and
/// every address prevResult lists.
async fn validate_container_interface(
    ctr: &Nl,
    mtu: u32,
    ifname: &str,
    sandbox: &str,
    want: &Expected<'_>,
) -> Result<Link> {
    let c = ctr
        .link_by_name(ifname)
        .await?
        .ok_or_else(|| Error::Check(format!("interface {ifname} does not exist in {sandbox}")))?;
    validate_mac(ifname, &c.mac, want.ctr.mac.as_ref())?;
    if c.mtu != mtu {
        return Err(Error::Check(format!(
            "{ifname} has MTU {}, the configuration and the node's uplink say {mtu}",
            c.mtu
        )));
    }
    if !c.up {
        return Err(Error::Check(format!("{ifname} is down")));
    }
    let live_addrs = ctr.addresses(c.index).await?;
    for ip in &want.pod_ips {
        if !live_addrs
            .iter()
            .any(|a| a.addr() == ip.addr() && a.prefix_len() == ip.prefix_len())
        {
            return Err(Error::Check(format!(
                "address {ip} is missing from {ifname}"
            )));
        }
    }
    Ok(c)
}

/// Every prevResult route of a family the pod has is in the container, through its
/// interface (`oif`), in its table.
async fn validate_container_routes(
    ctr: &Nl,
    routes: &[Route],
    pod_ips: &[IpNet],
    oif: u32,
    sandbox: &str,
) -> Result<()> {
    let live_routes = ctr.routes().await?;
    for r in routes {
        let family_ok = pod_ips
            .iter()
            .any(|ip| ip.addr().is_ipv6() == r.dst.addr().is_ipv6());
        if !family_ok {
            continue;
        }
        let found = live_routes.iter().any(|l| {
            l.dst == r.dst
                && (r.gw.is_none() || l.gw == r.gw)
                && l.oif == Some(oif)
                && l.table == r.table.unwrap_or(link::RT_TABLE_MAIN)
        });
        if !found {
            let via = r.gw.map(|g| format!(" via {g}")).unwrap_or_default();
            let table = r.table.map(|t| format!(" (table {t})")).unwrap_or_default();
            return Err(Error::Check(format!(
                "route {}{via}{table} is missing from {sandbox}",
                r.dst
            )));
        }
    }
    Ok(())
}

/// The host veth exists, is a veth or a netkit device as `interface` allows, is the
/// container interface's peer and has prevResult's MAC.
async fn validate_host_veth(
    node: &Nl,
    conf: &NetConf,
    host_ifname: &str,
    ifname: &str,
    c: &Link,
    want: &Interface,
) -> Result<Link> {
    let h = node
        .link_by_name(host_ifname)
        .await?
        .ok_or_else(|| Error::Check(format!("host veth {host_ifname} does not exist")))?;
    let allowed = match conf.interface {
        InterfaceKind::Veth => link::is_veth(&h),
        InterfaceKind::Netkit => link::is_netkit(&h),
        InterfaceKind::Auto => link::is_pod_pair_end(&h),
    };
    if !allowed {
        return Err(Error::Check(format!(
            "host interface {host_ifname} is a {}, not the {} \"interface\" asks for",
            h.kind.as_deref().unwrap_or("device of no kind"),
            match conf.interface {
                InterfaceKind::Veth => "veth",
                InterfaceKind::Netkit => "netkit device",
                InterfaceKind::Auto => "veth or netkit device",
            }
        )));
    }
    if c.peer_index != Some(h.index) {
        return Err(Error::Check(format!(
            "{ifname} is not the peer of host veth {host_ifname} (peer #{:?}, host #{})",
            c.peer_index, h.index
        )));
    }
    validate_mac(host_ifname, &h.mac, want.mac.as_ref())?;
    Ok(h)
}

/// The node routes each pod address to the host veth (main table).
async fn validate_node_routes(
    node: &Nl,
    pod_ips: &[IpNet],
    host_index: u32,
    host_ifname: &str,
) -> Result<()> {
    let node_routes = node.routes().await?;
    for ip in pod_ips {
        let dst = IpNet::from(ip.addr());
        if !node_routes
            .iter()
            .any(|r| r.table == link::RT_TABLE_MAIN && r.dst == dst && r.oif == Some(host_index))
        {
            return Err(Error::Check(format!(
                "node route {dst} dev {host_ifname} is missing"
            )));
        }
    }
    Ok(())
}

/// The datapath holds this attachment: endpoint entries, the program on the host veth,
/// the host ports, the uplink programs.
fn validate_datapath(
    conf: &NetConf,
    env: &Env,
    host_ifname: String,
    h: &Link,
    c: &Link,
    pod_ips: &[IpNet],
) -> Result<()> {
    let dp = Datapath::open(conf)?.ok_or_else(|| {
        Error::Check(format!(
            "no eBPF programs are pinned under {}",
            conf.pin_dir().display()
        ))
    })?;
    let mac6 = |m: &[u8]| <[u8; 6]>::try_from(m).unwrap_or_default();
    let pod_mac = mac6(&c.mac);
    let ep = Endpoint {
        container_id: env.container_id.clone(),
        ifname: env.ifname.clone(),
        host_ifindex: h.index,
        host_ifname,
        host_mac: mac6(&h.mac),
        pod_mac,
        ips: pod_ips.iter().map(IpNet::addr).collect::<Vec<IpAddr>>(),
        allowed_sources: conf.allowed_sources.clone(),
        nat_flows: conf.nat_flows_per_pod,
        egress_rate: conf.egress_rate,
        host_ports: !conf.runtime_config.port_mappings.is_empty(),
        netkit: link::is_netkit(h),
        pod: PodRef::from_args(&env.args),
    };
    // A later chained plugin (tuning) may have changed the pod's MAC after ADD wrote the
    // endpoint entry; the entry may hold either the live MAC or the one ADD set.
    let accepted = [pod_mac, super::add::pod_mac(conf, env)?];
    dp.check_endpoint_accepting(&ep, &accepted, &conf.runtime_config.port_mappings)
}
