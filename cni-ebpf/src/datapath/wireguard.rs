//! The node's WireGuard device (`encryption: wireguard`; see `cni-ebpf-bpf/src/wireguard.rs`
//! for how the programs steer pod traffic into it): one device per node, created by the
//! first ADD that needs it, down and keyless until the agent gives it the node's key,
//! port and peers (`crate::agent::wireguard`). The device is L3: the kernel routes what
//! it decrypts to the pods, through `to_pod` and their NetworkPolicy.
//!
//! A device of that name that cni-ebpf did not create (its alias says so) is never taken
//! over or changed: ADD fails naming it. A kernel without WireGuard fails ADD with a
//! configuration error naming `encryption`: nothing is ever sent in clear instead.

use cni_ebpf_common::{map as map_name, WireguardPeer};
use ipnet::IpNet;

use super::{
    maps,
    tunnel::{remove_ours, sync_trie, trie_net},
    Datapath,
};
use crate::{
    cni::config::NetConf,
    error::{Error, Result},
    kernel::link::{Link, Nl},
};

/// The WireGuard device's name.
pub const WIREGUARD_DEVICE: &str = "cni-ebpf.wg";
/// The alias that marks the device as ours.
const WIREGUARD_ALIAS: &str = "cni-ebpf wireguard";

/// What the node's WireGuard device is, for the programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WireguardState {
    pub ifindex: u32,
    /// The UDP port the agent gives it (`wireguardPort`).
    pub port: u16,
    /// `encryptionStrict`.
    pub strict: bool,
}

impl Datapath {
    /// The WireGuard device the configuration asks for, made ready (created with MTU
    /// `mtu` if missing, labelled, up). `None` without encryption.
    pub(super) async fn ensure_wireguard(
        &self,
        nl: &Nl,
        conf: &NetConf,
        mtu: u32,
    ) -> Result<Option<WireguardState>> {
        let Some(enc) = conf.encryption else {
            return Ok(None);
        };
        let ifindex = ensure_device(nl, mtu).await?;
        Ok(Some(WireguardState {
            ifindex,
            port: enc.port,
            strict: enc.strict,
        }))
    }

    /// Makes `WIREGUARD_PEERS` hold exactly `entries` (another node's pod CIDR or
    /// address → whether that node has a key, and whether the prefix is its address).
    /// New and changed entries are written before the stale ones go. Returns how many
    /// changed.
    pub fn set_wireguard_peers(&self, entries: &[(IpNet, WireguardPeer)]) -> Result<usize> {
        let mut m = self.maps()?;
        let mut trie = m.wireguard_peers()?;
        sync_trie(
            &mut trie,
            map_name::WIREGUARD_PEERS,
            entries.iter().copied().collect(),
        )
    }

    /// `WIREGUARD_PEERS`, sorted by prefix.
    pub fn wireguard_peers(&self) -> Result<Vec<(IpNet, WireguardPeer)>> {
        let mut m = self.maps()?;
        let trie = m.wireguard_peers()?;
        let mut out = Vec::new();
        for item in trie.iter() {
            let (k, v) = item.map_err(|e| maps::err(map_name::WIREGUARD_PEERS, "read", e))?;
            if let Some(net) = trie_net(&k) {
                out.push((net, v));
            }
        }
        out.sort_by_key(|(n, _)| *n);
        Ok(out)
    }

    /// `uninstall --purge`: deletes the node's WireGuard device if this network uses one
    /// and it is ours (its alias says so). Returns whether it did.
    pub fn remove_wireguard(&self) -> Result<bool> {
        if self.node_config_raw()?.wireguard_ifindex == 0 {
            return Ok(false);
        }
        remove_ours(WIREGUARD_DEVICE, WIREGUARD_ALIAS)
    }
}

/// The node's WireGuard device made ready, its ifindex: created with MTU `mtu` if
/// missing (by ADD, or by the agent preparing a node whose conflist asks for encryption;
/// one that lost a race to create it takes the winner's), labelled, up, its MTU `mtu`.
/// A device of its name that is not ours is an error naming `encryption`.
pub async fn ensure_device(nl: &Nl, mtu: u32) -> Result<u32> {
    let mut dev = match nl.link_by_name(WIREGUARD_DEVICE).await? {
        Some(d) => d,
        None => match create(nl, mtu).await {
            Ok(d) => d,
            Err(e) => nl.link_by_name(WIREGUARD_DEVICE).await?.ok_or(e)?,
        },
    };
    let foreign = |why: String| {
        Error::config(
            "encryption",
            format!(
                "an interface named {WIREGUARD_DEVICE} exists that cni-ebpf did not create \
                 ({why}); rename or remove it"
            ),
        )
    };
    if dev.kind.as_deref() != Some("wireguard") {
        return Err(foreign(format!("kind {:?}", dev.kind.unwrap_or_default())));
    }
    // Made but not yet labelled and up: by the creation above, or by one that died
    // between the two steps.
    if dev.alias.as_deref().is_none_or(str::is_empty) && !dev.up {
        nl.label_and_set_up(dev.index, WIREGUARD_ALIAS).await?;
        // What it decrypts comes from other nodes' pods, whose routes lead elsewhere (the
        // uplink, the tunnel): no reverse-path check on it.
        let knob = format!("/proc/sys/net/ipv4/conf/{WIREGUARD_DEVICE}/rp_filter");
        if let Err(e) = std::fs::write(&knob, "0") {
            tracing::warn!("{knob}: {e}");
        }
        dev.alias = Some(WIREGUARD_ALIAS.to_owned());
        dev.up = true;
    }
    if dev.alias.as_deref() != Some(WIREGUARD_ALIAS) {
        return Err(foreign(format!(
            "alias {:?}",
            dev.alias.unwrap_or_default()
        )));
    }
    if dev.mtu != mtu {
        nl.set_mtu(dev.index, mtu).await?;
    }
    if !dev.up {
        nl.set_up(dev.index).await?;
    }
    Ok(dev.index)
}

/// Creates the device; a kernel without WireGuard is the configuration's error.
async fn create(nl: &Nl, mtu: u32) -> Result<Link> {
    if !nl.create_wireguard(WIREGUARD_DEVICE, mtu).await? {
        return Err(Error::config(
            "encryption",
            "\"wireguard\": this kernel has no WireGuard (Linux 5.6 or later built with \
             CONFIG_WIREGUARD, its module loadable); pods get no network rather than send \
             in clear: load the module, or set \"encryption\": \"none\"",
        ));
    }
    nl.link_by_name(WIREGUARD_DEVICE)
        .await?
        .ok_or_else(|| Error::netlink("creating the WireGuard device", "it vanished"))
}
