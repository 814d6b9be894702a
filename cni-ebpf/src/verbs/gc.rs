//! GC (1.1.0): removes every attachment of this network not listed in
//! `cni.dev/valid-attachments` — IPAM reservations, datapath entries, host ports and host
//! veths. Besides the reservations IPAM releases, it collects what a crash between ADD
//! steps may have left without one: host veths (found by their `cni-ebpf/<network>/`
//! alias) and datapath owners that are not valid.

use std::collections::HashSet;

use crate::{
    cni::{config::NetConf, env::Env},
    datapath::Datapath,
    error::{Error, Result},
    ipam,
    kernel::link::{self, Nl},
    verbs::del::teardown,
};

/// Runs GC.
pub fn run(env: &Env, conf: &NetConf, stdin: &[u8]) -> Result<()> {
    let valid = conf.valid_attachment_keys();
    let mut errors = Vec::new();

    let released = ipam::gc(conf, env, stdin).unwrap_or_else(|e| {
        errors.push(e);
        Vec::new()
    });
    if let Err(e) = crate::faults::point("gc-ipam-released") {
        errors.push(e);
    }
    let dp = Datapath::open(conf).unwrap_or_else(|e| {
        errors.push(e);
        None
    });

    // Every stale attachment, with the addresses known for it.
    let mut stale: Vec<(String, String, Vec<std::net::IpAddr>)> = released
        .into_iter()
        .map(|r| (r.container_id, r.ifname, r.addresses))
        .collect();
    let mut seen: HashSet<(String, String)> = stale
        .iter()
        .map(|(c, i, _)| (c.clone(), i.clone()))
        .collect();
    let held: HashSet<(String, String)> = ipam::list(conf)
        .unwrap_or_default()
        .into_iter()
        .map(|r| (r.container_id, r.ifname))
        .collect();
    let mut consider = |cid: String, ifname: String, ips: Vec<std::net::IpAddr>| {
        let key = (cid, ifname);
        if !valid.contains(&key) && !held.contains(&key) && seen.insert(key.clone()) {
            stale.push((key.0, key.1, ips));
        }
    };
    if let Some(dp) = &dp {
        match dp.attachments() {
            Ok(states) => {
                for s in states {
                    consider(s.container_id, s.ifname, s.ips);
                }
            }
            Err(e) => errors.push(e),
        }
    }
    let prefix = link::alias_prefix(&conf.name);
    let veths = link::runtime()
        .and_then(|rt| rt.block_on(async { Nl::connect()?.links_with_alias(&prefix).await }));
    match veths {
        Ok(links) => {
            for (l, alias) in links {
                let Some((cid, ifname)) = alias
                    .strip_prefix(&prefix)
                    .and_then(|rest| rest.split_once('/'))
                else {
                    continue;
                };
                // Only veths whose name is ours for that attachment.
                if l.name == link::host_veth_name(cid, ifname) {
                    consider(cid.to_owned(), ifname.to_owned(), Vec::new());
                }
            }
        }
        Err(e) => errors.push(e),
    }

    for (cid, ifname, ips) in &stale {
        tracing::info!(container = %cid, ifname = %ifname, "GC: removing a stale attachment");
        teardown(conf, dp.as_ref(), cid, ifname, ips, &mut errors);
    }
    // Flows of pods gone without a trace in the endpoint map (see `purge_orphan_flows`).
    if let Some(dp) = &dp {
        match dp.purge_orphan_flows() {
            Ok(0) => {}
            Ok(n) => tracing::info!("GC: removed {n} NAT entries of pods that are gone"),
            Err(e) => errors.push(e),
        }
    }
    // Pairs a killed ADD never labelled: no alias names their owner, so only the
    // network's group and the ADDs' lock tell them apart from an ADD still running.
    if let Err(e) = super::unlabelled_veths::sweep(conf) {
        errors.push(e);
    }
    // Pairs a DEL retired whose finishing process did not get to delete them (killed).
    // Nothing but DEL retires a pair, and nothing uses one after.
    let retired = link::runtime().and_then(|rt| {
        rt.block_on(async {
            let node = Nl::connect()?;
            let group = link::retired_group(&conf.name);
            let left = node.veths_in_group(group).await?;
            for l in &left {
                tracing::info!("GC: deleting {}, retired by a DEL", l.name);
            }
            if left.is_empty() {
                return Ok(());
            }
            node.del_group(group).await
        })
    });
    if let Err(e) = retired {
        errors.push(e);
    }
    Error::from_list(errors)
}
