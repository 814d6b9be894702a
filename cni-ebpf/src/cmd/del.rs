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

    // The pod's addresses: from our store, else from prevResult (delegated IPAM).
    let mut ips: Vec<IpAddr> = match ipam::list(conf) {
        Ok(list) => list
            .into_iter()
            .filter(|r| r.container_id == env.container_id && r.ifname == env.ifname)
            .flat_map(|r| r.addresses)
            .collect(),
        Err(e) => {
            errors.push(e);
            Vec::new()
        }
    };
    if let Some(prev) = &conf.prev_result {
        for ip in &prev.ips {
            if !ips.contains(&ip.address.addr()) {
                ips.push(ip.address.addr());
            }
        }
    }

    // 1. Release the addresses first: whatever else fails, they are not leaked.
    if let Err(e) = ipam::del(conf, env, stdin) {
        errors.push(e);
    }

    // 2. Datapath entries and host ports.
    let host_ifname = link::host_veth_name(&env.container_id, &env.ifname);
    match Datapath::open(conf) {
        Ok(Some(dp)) => {
            if let Err(e) = dp.remove_port_mappings((&env.container_id, &env.ifname)) {
                errors.push(e);
            }
            if let Err(e) = dp.detach_endpoint(&env.container_id, &env.ifname, &host_ifname, &ips) {
                errors.push(e);
            }
        }
        Ok(None) => {}
        Err(e) => errors.push(e),
    }

    // 3. The veth (its routes and the container end go with it).
    if let Err(e) = delete_host_veth_of(&conf.name, &env.container_id, &env.ifname, &host_ifname) {
        errors.push(e);
    }

    match errors.len() {
        0 => Ok(()),
        1 => Err(errors.remove(0)),
        _ => Err(Error::Multiple(errors)),
    }
}

/// Deletes the host veth of (container ID, ifname) when its alias confirms the owner.
pub fn delete_host_veth_of(
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
            other => {
                tracing::warn!(
                    "not deleting {host_ifname}: its alias {other:?} does not name {container_id}/{ifname}"
                );
                Ok(())
            }
        }
    })
}
