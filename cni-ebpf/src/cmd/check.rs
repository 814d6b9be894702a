//! CHECK: compares `prevResult` with the live state — container interface, addresses,
//! routes, MTU; host veth and its peer; host routes; the IPAM reservation; the datapath's
//! endpoint entry, attached program and host ports. Each mismatch is its own message.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::{
    cni::{
        config::{format_mac, NetConf},
        env::Env,
    },
    datapath::{Datapath, Endpoint},
    error::{Error, Result},
    ipam,
    link::{self, Nl},
    netns::Netns,
};

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

    // Our interfaces in prevResult.
    let ctr_idx = prev
        .interfaces
        .iter()
        .position(|i| i.name == env.ifname && i.sandbox.as_deref() == Some(sandbox.as_str()))
        .ok_or_else(|| {
            Error::Check(format!(
                "prevResult lists no interface {} in sandbox {sandbox}",
                env.ifname
            ))
        })?;
    let ctr_want = &prev.interfaces[ctr_idx];
    let host_want = prev
        .interfaces
        .iter()
        .find(|i| i.name == host_ifname && i.sandbox.is_none());
    let Some(host_want) = host_want else {
        return Err(Error::Check(format!(
            "prevResult lists no host interface {host_ifname}"
        )));
    };
    let pod_ips: Vec<IpNet> = prev
        .ips
        .iter()
        .filter(|ip| ip.interface == Some(ctr_idx))
        .map(|ip| ip.address)
        .collect();
    if pod_ips.is_empty() {
        return Err(Error::Check(format!(
            "prevResult lists no address on {}",
            env.ifname
        )));
    }

    let rt = link::runtime()?;
    let (host_index, host_mac, pod_mac) = rt.block_on(async {
        let node = Nl::connect()?;
        let ctr = Nl::connect_in(&netns)?;

        // Container interface.
        let c = ctr.link_by_name(&env.ifname).await?.ok_or_else(|| {
            Error::Check(format!(
                "interface {} does not exist in {sandbox}",
                env.ifname
            ))
        })?;
        if let Some(mac) = &ctr_want.mac {
            let live = format_mac(&c.mac);
            if !live.eq_ignore_ascii_case(mac) {
                return Err(Error::Check(format!(
                    "{} has MAC {live}, prevResult says {mac}",
                    env.ifname
                )));
            }
        }
        if c.mtu != conf.mtu {
            return Err(Error::Check(format!(
                "{} has MTU {}, the configuration says {}",
                env.ifname, c.mtu, conf.mtu
            )));
        }
        if !c.up {
            return Err(Error::Check(format!("{} is down", env.ifname)));
        }
        let live_addrs = ctr.addresses(c.index).await?;
        for ip in &pod_ips {
            if !live_addrs
                .iter()
                .any(|a| a.addr() == ip.addr() && a.prefix_len() == ip.prefix_len())
            {
                return Err(Error::Check(format!(
                    "address {ip} is missing from {}",
                    env.ifname
                )));
            }
        }
        let live_routes = ctr.routes().await?;
        for r in &prev.routes {
            let family_ok = pod_ips
                .iter()
                .any(|ip| ip.addr().is_ipv6() == r.dst.addr().is_ipv6());
            if !family_ok {
                continue;
            }
            let found = live_routes.iter().any(|l| {
                l.dst == r.dst
                    && (r.gw.is_none() || l.gw == r.gw)
                    && l.oif == Some(c.index)
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

        // Host veth: exists, is a veth, and is the peer of the container interface.
        let h = node
            .link_by_name(&host_ifname)
            .await?
            .ok_or_else(|| Error::Check(format!("host veth {host_ifname} does not exist")))?;
        if !link::is_veth(&h) {
            return Err(Error::Check(format!(
                "host interface {host_ifname} is not a veth"
            )));
        }
        if c.peer_index != Some(h.index) {
            return Err(Error::Check(format!(
                "{} is not the peer of host veth {host_ifname} (peer #{:?}, host #{})",
                env.ifname, c.peer_index, h.index
            )));
        }
        if let Some(mac) = &host_want.mac {
            let live = format_mac(&h.mac);
            if !live.eq_ignore_ascii_case(mac) {
                return Err(Error::Check(format!(
                    "{host_ifname} has MAC {live}, prevResult says {mac}"
                )));
            }
        }
        let node_routes = node.routes().await?;
        for ip in &pod_ips {
            let dst = IpNet::from(ip.addr());
            if !node_routes
                .iter()
                .any(|r| r.table == link::RT_TABLE_MAIN && r.dst == dst && r.oif == Some(h.index))
            {
                return Err(Error::Check(format!(
                    "node route {dst} dev {host_ifname} is missing"
                )));
            }
        }
        let mut host_mac = [0u8; 6];
        let mut pod_mac = [0u8; 6];
        if h.mac.len() == 6 && c.mac.len() == 6 {
            host_mac.copy_from_slice(&h.mac);
            pod_mac.copy_from_slice(&c.mac);
        }
        Ok((h.index, host_mac, pod_mac))
    })?;

    // IPAM reservation.
    ipam::check(conf, env, stdin, &pod_ips)?;

    // Datapath: endpoint entry, program attached, host ports, uplink programs.
    let dp = Datapath::open(conf)?.ok_or_else(|| {
        Error::Check(format!(
            "no eBPF programs are pinned under {}",
            conf.pin_dir().display()
        ))
    })?;
    let ep = Endpoint {
        container_id: env.container_id.clone(),
        ifname: env.ifname.clone(),
        host_ifindex: host_index,
        host_ifname,
        host_mac,
        pod_mac,
        ips: pod_ips.iter().map(IpNet::addr).collect::<Vec<IpAddr>>(),
        allowed_sources: conf.allowed_sources.clone(),
        nat_flows: conf.nat_flows_per_pod,
        egress_rate: conf.egress_rate,
    };
    // A later chained plugin (tuning) may have changed the pod's MAC after ADD wrote the
    // endpoint entry; the entry may hold either the live MAC or the one ADD set.
    let accepted = [pod_mac, super::add::pod_mac(conf, env)?];
    dp.check_endpoint_accepting(&ep, &accepted, &conf.runtime_config.port_mappings)?;
    Ok(())
}
