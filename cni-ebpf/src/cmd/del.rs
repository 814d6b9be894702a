//! DEL: idempotent and best-effort. Works with no netns, a vanished netns, no
//! `prevResult` and an unknown container; keeps going past a failed step and reports every
//! failure at the end. Touches only state that names this (container ID, ifname).

use std::net::IpAddr;

use crate::{
    cni::{config::NetConf, env::Env},
    datapath::Datapath,
    error::{Error, Result},
    ipam,
    link::{self, Nl},
};

/// Runs DEL.
pub fn run(env: &Env, conf: &NetConf, stdin: &[u8]) -> Result<()> {
    let mut errors = Vec::new();
    while_deleting_veth(
        conf,
        &env.container_id,
        &env.ifname,
        &mut errors,
        |errors| {
            // 1. Release the addresses first: whatever else fails, they are not leaked.
            let mut ips = ipam::del(conf, env, stdin).unwrap_or_else(|e| {
                errors.push(e);
                Vec::new()
            });
            if let Err(e) = crate::faults::point("del-ipam-released") {
                errors.push(e);
            }
            // With a delegated IPAM the addresses are only known from prevResult.
            if let Some(prev) = &conf.prev_result {
                for ip in &prev.ips {
                    if !ips.contains(&ip.address.addr()) {
                        ips.push(ip.address.addr());
                    }
                }
            }

            // 2. Datapath entries and host ports.
            let dp = Datapath::open(conf).unwrap_or_else(|e| {
                errors.push(e);
                None
            });
            remove_datapath(dp.as_ref(), &env.container_id, &env.ifname, &ips, errors);
        },
    );
    Error::from_list(errors)
}

/// Removes the datapath entries, host ports and host veth of (container ID, ifname),
/// collecting failures in `errors` and carrying on (GC; DEL does the same around its
/// IPAM release).
pub fn teardown(
    conf: &NetConf,
    dp: Option<&Datapath>,
    container_id: &str,
    ifname: &str,
    ips: &[IpAddr],
    errors: &mut Vec<Error>,
) {
    while_deleting_veth(conf, container_id, ifname, errors, |errors| {
        remove_datapath(dp, container_id, ifname, ips, errors);
    });
}

/// Runs `work` while the host veth of (container ID, ifname) is deleted on a thread of its
/// own, and returns when both are done, every failure in `errors`.
///
/// Deleting a veth pair (its container end goes with it) is most of a DEL's time: the
/// kernel waits out RCU grace periods in the request, ≈ 20 ms here, while the process
/// has nothing to do but wait. `work` (the IPAM release and the datapath entries) touches
/// only the IPAM store, maps and bpffs, never rtnl, so nothing in it waits for the
/// deletion, and it no longer adds to DEL's time. Each part is idempotent and done before
/// DEL returns, so a DEL killed at any instant still leaves the retry as much to do as
/// before: the crash campaign kills DEL at `teardown-datapath-removed` with the veth
/// either deleted or not. (A new thread starts in the caller's network namespace: the
/// node's.)
fn while_deleting_veth(
    conf: &NetConf,
    container_id: &str,
    ifname: &str,
    errors: &mut Vec<Error>,
    work: impl FnOnce(&mut Vec<Error>),
) {
    let host_ifname = link::host_veth_name(container_id, ifname);
    let veth = std::thread::scope(|s| {
        let deleting =
            s.spawn(|| delete_host_veth_of(&conf.name, container_id, ifname, &host_ifname));
        work(errors);
        if let Err(e) = crate::faults::point("teardown-datapath-removed") {
            errors.push(e);
        }
        deleting
            .join()
            .unwrap_or_else(|_| Err(Error::netlink("deleting the host veth", "thread panicked")))
    });
    if let Err(e) = veth {
        errors.push(e);
    }
}

/// Removes the datapath entries and host ports of (container ID, ifname).
fn remove_datapath(
    dp: Option<&Datapath>,
    container_id: &str,
    ifname: &str,
    ips: &[IpAddr],
    errors: &mut Vec<Error>,
) {
    if let Some(dp) = dp {
        let host_ifname = link::host_veth_name(container_id, ifname);
        dp.remove_pod(container_id, ifname, &host_ifname, ips, errors);
    }
}

/// Deletes the host veth of (container ID, ifname) when its alias confirms the owner, or
/// when it has no alias and the MAC ADD derives for it (a killed ADD's half-made pair).
fn delete_host_veth_of(
    network: &str,
    container_id: &str,
    ifname: &str,
    host_ifname: &str,
) -> Result<()> {
    let rt = link::runtime()?;
    rt.block_on(async {
        let node = Nl::connect()?;
        let Some(l) = node.link_by_name(host_ifname).await? else { return Ok(()) };
        let want = link::host_veth_alias(network, container_id, ifname);
        match node.alias(l.index).await? {
            Some(alias) if alias == want => node.del_link(l.index).await,
            // No alias yet: an ADD of this attachment killed between creating the pair and
            // labelling it (the kernel takes no alias in the creating request). Ownership
            // is proven by what the creating request did set: both the name and the MAC
            // are derived from (container ID, ifname); a foreign link that merely took the
            // name has another MAC. (The runtime never runs ADD and DEL of one container
            // at once, so this is no ADD in progress.)
            None if l.kind.as_deref() == Some("veth")
                && l.mac == link::derived_mac(container_id, ifname, "host") =>
            {
                tracing::warn!(
                    "deleting {host_ifname}: unlabelled, left by an interrupted ADD of {container_id}/{ifname}"
                );
                node.del_link(l.index).await
            }
            other => {
                tracing::warn!("not deleting {host_ifname}: its alias {other:?} does not name {container_id}/{ifname}");
                Ok(())
            }
        }
    })
}
