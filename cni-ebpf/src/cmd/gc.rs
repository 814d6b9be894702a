//! GC (1.1.0): removes every attachment of this network not listed in
//! `cni.dev/valid-attachments` — IPAM reservations, datapath entries, host ports and host
//! veths (found by their `cni-ebpf/<network>/` alias, so even those a crash left without a
//! reservation are collected).

use std::collections::HashSet;

use crate::{
    cmd::del::delete_host_veth_of,
    cni::{config::NetConf, env::Env},
    datapath::Datapath,
    error::{Error, Result},
    ipam,
    link::{self, Nl},
};

/// Runs GC.
pub fn run(env: &Env, conf: &NetConf, stdin: &[u8]) -> Result<()> {
    let valid: HashSet<(&str, &str)> = conf
        .valid_attachments
        .iter()
        .flatten()
        .map(|a| (a.container_id.as_str(), a.ifname.as_str()))
        .collect();
    let mut errors = Vec::new();

    let released = ipam::gc(conf, env, stdin).unwrap_or_else(|e| {
        errors.push(e);
        Vec::new()
    });
    let dp = match Datapath::open(conf) {
        Ok(dp) => dp,
        Err(e) => {
            errors.push(e);
            None
        }
    };
    for r in &released {
        let host = link::host_veth_name(&r.container_id, &r.ifname);
        if let Some(dp) = &dp {
            if let Err(e) = dp.remove_port_mappings((&r.container_id, &r.ifname)) {
                errors.push(e);
            }
            if let Err(e) = dp.detach_endpoint(&r.container_id, &r.ifname, &host, &r.addresses) {
                errors.push(e);
            }
        }
        if let Err(e) = delete_host_veth_of(&conf.name, &r.container_id, &r.ifname, &host) {
            errors.push(e);
        }
    }

    // Host veths of this network's attachments that IPAM no longer knows (a crash between
    // steps): their alias names the attachment.
    let rt = link::runtime()?;
    let orphans = rt.block_on(async {
        let node = Nl::connect()?;
        node.links_with_alias(&link::alias_prefix(&conf.name)).await
    });
    match orphans {
        Ok(links) => {
            let prefix = link::alias_prefix(&conf.name);
            let known: HashSet<(String, String)> = ipam::list(conf)
                .unwrap_or_default()
                .into_iter()
                .map(|r| (r.container_id, r.ifname))
                .collect();
            for (l, alias) in links {
                let Some((cid, ifname)) = alias
                    .strip_prefix(&prefix)
                    .and_then(|rest| rest.split_once('/'))
                else {
                    continue;
                };
                if valid.contains(&(cid, ifname))
                    || known.contains(&(cid.to_owned(), ifname.to_owned()))
                {
                    continue;
                }
                // Only veths whose name is ours for that attachment.
                if l.name != link::host_veth_name(cid, ifname) {
                    continue;
                }
                if let Some(dp) = &dp {
                    if let Err(e) = dp.remove_port_mappings((cid, ifname)) {
                        errors.push(e);
                    }
                    if let Err(e) = dp.detach_endpoint(cid, ifname, &l.name, &[]) {
                        errors.push(e);
                    }
                }
                if let Err(e) = delete_host_veth_of(&conf.name, cid, ifname, &l.name) {
                    errors.push(e);
                }
            }
        }
        Err(e) => errors.push(e),
    }

    // Datapath state whose owner is not valid, even with no reservation or veth left.
    if let Some(dp) = &dp {
        match dp.attachments() {
            Ok(states) => {
                for s in states {
                    if valid.contains(&(s.container_id.as_str(), s.ifname.as_str())) {
                        continue;
                    }
                    let host = link::host_veth_name(&s.container_id, &s.ifname);
                    if let Err(e) = dp.remove_port_mappings((&s.container_id, &s.ifname)) {
                        errors.push(e);
                    }
                    let ips: Vec<std::net::IpAddr> =
                        s.ips.iter().copied().map(std::net::IpAddr::V4).collect();
                    if let Err(e) = dp.detach_endpoint(&s.container_id, &s.ifname, &host, &ips) {
                        errors.push(e);
                    }
                }
            }
            Err(e) => errors.push(e),
        }
    }

    match errors.len() {
        0 => Ok(()),
        1 => Err(errors.remove(0)),
        _ => Err(Error::Multiple(errors)),
    }
}
