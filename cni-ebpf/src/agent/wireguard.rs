//! Encryption between nodes (`encryption: wireguard`), the agent's part: the node's key
//! pair, its public key on the Node, and the peers of the node's WireGuard device and
//! the programs' `WIREGUARD_PEERS` kept from the Nodes (see `crate::datapath::wireguard`
//! for the device, `cni-ebpf-bpf/src/wireguard.rs` for the steering).
//!
//! - **The key pair** is made on the node by the agent the first time a network with
//!   encryption is loaded: 32 random bytes (`getrandom`) in `--wireguard-key` (base64, as
//!   `wg genkey` writes it, mode 0600 in a 0700 directory, written whole or not at all).
//!   The default path is on `/run`: a reboot makes a new pair, an agent restart keeps
//!   it; a path on a persistent disk keeps it across reboots. The private key never
//!   leaves the node: only the kernel device and that file hold it.
//! - **Rotation** (`cni-ebpf wireguard rotate-key`) writes a new private key in its
//!   place; the agent checks the file every second and, when it changed, gives the
//!   device the new key and publishes the new public key. Each peer takes it from its
//!   Node watch: a connection between the two nodes loses the packets of about that
//!   second (TCP sends them again), other nodes' connections are untouched.
//! - **Publishing**: the public key is the Node's annotation
//!   `cni-ebpf.io/wireguard-public-key` (as Calico publishes its own), patched by the
//!   agent whenever it differs.
//! - **Peers**: every other node with a published key and an InternalIP of a family the
//!   uplink has (IPv4 first, as the tunnel picks it) is a peer: its key, that address on
//!   the device's port, its pod CIDRs as allowed prefixes. Only the peers that changed
//!   are written (a new peer before the programs are told to use it, a gone one after
//!   they stopped), so no other peer's session is touched. A node without a key is
//!   listed in `WIREGUARD_PEERS` as keyless: strict mode drops what would go to it.

use std::{
    collections::BTreeMap,
    io::Write as _,
    net::SocketAddr,
    os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    time::SystemTime,
};

use base64::Engine as _;
use cni_ebpf_common::{WireguardPeer, WIREGUARD_KEYED};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde::{Deserialize, Serialize};

use super::{nodes::Underlay, routes::log};
use crate::{
    datapath::{
        load, node_facts,
        wireguard::{ensure_device, WIREGUARD_DEVICE},
        Datapath,
    },
    error::{Error, Result},
    k8s,
    kernel::{
        link::Nl,
        wireguard::{Key, Peer, PeerState, Wg},
    },
};

/// The Node annotation that carries a node's public key (base64).
pub const PUBLIC_KEY_ANNOTATION: &str = "cni-ebpf.io/wireguard-public-key";

/// Where the agent keeps the node's private key unless told otherwise: on `/run`, so a
/// reboot makes a new one.
pub const DEFAULT_KEY_FILE: &str = "/run/cni-ebpf/wireguard/private.key";

/// The agent's settings for encryption.
#[derive(Debug, Clone, clap::Args)]
pub struct WireguardArgs {
    /// The node's WireGuard private key (made when missing, mode 0600). On `/run` (the
    /// default) a reboot makes a new key pair; on a persistent disk the pair survives
    /// reboots. `peers.json` next to it names the peers for `inspect`.
    #[arg(long = "wireguard-key", env = "CNI_EBPF_WIREGUARD_KEY", default_value = DEFAULT_KEY_FILE)]
    pub key: PathBuf,
}

/// A key in the text form `wg(8)` uses (base64).
#[must_use]
pub fn encode(key: &Key) -> String {
    base64::engine::general_purpose::STANDARD.encode(key)
}

/// A key from its base64 form; `None` unless it is exactly 32 bytes.
#[must_use]
pub fn decode(text: &str) -> Option<Key> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .ok()?;
    Key::try_from(bytes.as_slice()).ok()
}

/// The public key of `private` (X25519, as WireGuard derives it).
#[must_use]
pub fn public_key(private: &Key) -> Key {
    let secret = x25519_dalek::StaticSecret::from(*private);
    x25519_dalek::PublicKey::from(&secret).to_bytes()
}

/// A fresh private key: 32 random bytes, clamped as X25519 wants (WireGuard clamps too).
fn fresh_key() -> Result<Key> {
    let mut key = [0_u8; 32];
    getrandom::fill(&mut key).map_err(|e| {
        Error::io(
            "making a WireGuard key",
            std::io::Error::other(e.to_string()),
        )
    })?;
    key[0] &= 248;
    key[31] = (key[31] & 127) | 64;
    Ok(key)
}

/// Writes `key` to `path` whole or not at all (a temporary file in the same directory,
/// mode 0600, renamed over it); the directory is made with mode 0700 when missing.
fn write_key(path: &Path, key: &Key) -> Result<()> {
    let io = |what: &str, e: std::io::Error| Error::io(format!("{what} {}", path.display()), e);
    let dir = path.parent().unwrap_or(Path::new("/"));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| io("making the directory of", e))?;
    let tmp = path.with_extension("new");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| io("writing", e))?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
        .and_then(|()| writeln!(f, "{}", encode(key)))
        .and_then(|()| f.sync_all())
        .map_err(|e| io("writing", e))?;
    std::fs::rename(&tmp, path).map_err(|e| io("replacing", e))
}

/// The private key in `path`, made and written first when the file is missing. A file
/// that holds no key is an error (never replaced: it may be the operator's); one that
/// others may read is made 0600.
pub fn load_or_make(path: &Path) -> Result<Key> {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let key = decode(&text).ok_or_else(|| {
                Error::config(
                    "--wireguard-key",
                    format!(
                        "{} holds no WireGuard key (base64 of 32 bytes)",
                        path.display()
                    ),
                )
            })?;
            if let Ok(meta) = std::fs::metadata(path) {
                if meta.permissions().mode() & 0o077 != 0 {
                    log(&format!(
                        "{}: others could read it; made 0600",
                        path.display()
                    ));
                    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
                }
            }
            Ok(key)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = fresh_key()?;
            write_key(path, &key)?;
            log(&format!(
                "made the node's WireGuard key pair: public key {}",
                encode(&public_key(&key))
            ));
            Ok(key)
        }
        Err(e) => Err(Error::io(format!("reading {}", path.display()), e)),
    }
}

/// `cni-ebpf wireguard rotate-key`: a new private key in `path`; returns its public key.
/// The node's agent puts it in force within a second.
pub fn rotate(path: &Path) -> Result<Key> {
    let key = fresh_key()?;
    write_key(path, &key)?;
    Ok(public_key(&key))
}

/// Another node, as the device and the programs should know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    /// The device's peers, each with its node's name.
    pub peers: Vec<(String, Peer)>,
    /// `WIREGUARD_PEERS`: every other node's pod CIDRs, keyed or not.
    pub entries: Vec<(IpNet, WireguardPeer)>,
    /// The nodes that have no peer, and why.
    pub keyless: Vec<(String, String)>,
}

/// What `nodes` (all of them; `own` is this node) make of the device's peers on `port`,
/// over the families `underlay` has.
#[must_use]
pub fn wanted(nodes: &[Node], own: &str, port: u16, underlay: Underlay) -> Wanted {
    let mut w = Wanted {
        peers: Vec::new(),
        entries: Vec::new(),
        keyless: Vec::new(),
    };
    let mut keys = std::collections::HashSet::new();
    for node in nodes {
        let name = k8s::name(node);
        if name == own || name.is_empty() {
            continue;
        }
        let Ok(cidrs) = k8s::pod_cidrs(node) else {
            continue;
        };
        let ips = k8s::internal_ips(node);
        let address = underlay.pick(&ips);
        let key = node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(PUBLIC_KEY_ANNOTATION));
        let peer = match (key.map(|k| decode(k)), address) {
            (None, _) => Err("no WireGuard key published".to_owned()),
            (Some(None), _) => Err(format!("its {PUBLIC_KEY_ANNOTATION} is not a key")),
            (Some(Some(_)), None) => Err(format!(
                "no InternalIP of a family this node's uplink has ({})",
                underlay.describe()
            )),
            (Some(Some(k)), Some(_)) if !keys.insert(k) => {
                Err("its key is another node's too".to_owned())
            }
            (Some(Some(k)), Some(ip)) => Ok(Peer {
                public_key: k,
                endpoint: SocketAddr::new(ip, port),
                allowed_ips: {
                    let mut c = cidrs.clone();
                    c.sort();
                    c
                },
            }),
        };
        let flags = match peer {
            Ok(p) => {
                w.peers.push((name.to_owned(), p));
                WIREGUARD_KEYED
            }
            Err(why) => {
                w.keyless.push((name.to_owned(), why));
                0
            }
        };
        w.entries
            .extend(cidrs.into_iter().map(|c| (c, WireguardPeer { flags })));
    }
    w.entries.sort_by_key(|(n, _)| *n);
    w.entries.dedup_by(|a, b| a.0 == b.0);
    w
}

/// A loaded network, as the agent needs it.
struct Network {
    name: String,
    dp: Datapath,
    /// Its programs encrypt (its node configuration names the device): with the port
    /// and `encryptionStrict` of its configuration.
    encrypting: Option<(u16, bool)>,
    underlay: Underlay,
}

/// The networks loaded below `root`.
fn networks(root: &Path) -> Vec<Network> {
    load::network_dirs(root)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|name| {
            let dp = Datapath::open_lazily_at(root.join(&name)).ok().flatten()?;
            let cfg = dp.node_config_view().ok()?;
            Some(Network {
                name,
                dp,
                encrypting: (cfg.wireguard_ifindex != 0)
                    .then_some((cfg.wireguard_port, cfg.wireguard_strict)),
                underlay: Underlay {
                    v4: cfg.node_addr.is_some(),
                    v6: cfg.node_addr6.is_some(),
                },
            })
        })
        .collect()
}

/// What the node's CNI configurations in `conf_dir` ask for: the port and
/// `encryptionStrict` of the first cni-ebpf configuration with `encryption:
/// wireguard`, if any.
fn configured(conf_dir: &Path) -> Option<(u16, bool)> {
    super::ready::cni_ebpf_plugins(conf_dir)
        .into_iter()
        .find(|(_, p)| p.get("encryption").and_then(serde_json::Value::as_str) == Some("wireguard"))
        .map(|(_, p)| {
            let port = p
                .get("wireguardPort")
                .and_then(serde_json::Value::as_u64)
                .and_then(|p| u16::try_from(p).ok())
                .unwrap_or(cni_ebpf_common::DEFAULT_WIREGUARD_PORT);
            let strict = p
                .get("encryptionStrict")
                .and_then(serde_json::Value::as_bool)
                .unwrap_or(true);
            (port, strict)
        })
}

/// Names the device's peers for `inspect` and the metrics: `peers.json` next to the key.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PeerNames {
    /// Public key (base64) → node name.
    pub nodes: BTreeMap<String, String>,
    /// Nodes without a peer → why.
    pub keyless: BTreeMap<String, String>,
}

impl PeerNames {
    fn path(key_file: &Path) -> PathBuf {
        key_file.with_file_name("peers.json")
    }

    /// What the agent last wrote next to `key_file` (empty when nothing).
    #[must_use]
    pub fn read(key_file: &Path) -> Self {
        std::fs::read(Self::path(key_file))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    fn write(&self, key_file: &Path) {
        let path = Self::path(key_file);
        let tmp = path.with_extension("new");
        let ok = serde_json::to_vec(self)
            .map_err(std::io::Error::other)
            .and_then(|b| std::fs::write(&tmp, b))
            .and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = ok {
            log(&format!("writing {}: {e}", path.display()));
        }
    }
}

/// One peer of the device, for `inspect` and the metrics.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PeerReport {
    /// The node it is (`-` when the agent has not named it).
    pub node: String,
    pub public_key: String,
    pub endpoint: Option<String>,
    pub allowed_ips: Vec<String>,
    /// Seconds since the Unix epoch of the last handshake (`None`: never).
    pub last_handshake: Option<u64>,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
}

/// The node's device as the kernel has it, its peers named from `peers.json` next to
/// `key_file`: its public key, port and peers, or `None` when the node has no device.
#[must_use]
pub fn report(key_file: &Path) -> Option<(Option<String>, u16, Vec<PeerReport>)> {
    let mut wg = Wg::connect().ok()?;
    let dev = wg.device(WIREGUARD_DEVICE).ok()?;
    let names = PeerNames::read(key_file);
    let peers = dev
        .peers
        .iter()
        .map(|p| {
            let key = encode(&p.public_key);
            PeerReport {
                node: names.nodes.get(&key).cloned().unwrap_or_else(|| "-".into()),
                public_key: key,
                endpoint: p.endpoint.map(|e| e.to_string()),
                allowed_ips: p.allowed_ips.iter().map(ToString::to_string).collect(),
                last_handshake: p.last_handshake.and_then(|t| {
                    t.duration_since(SystemTime::UNIX_EPOCH)
                        .ok()
                        .map(|d| d.as_secs())
                }),
                rx_bytes: p.rx_bytes,
                tx_bytes: p.tx_bytes,
            }
        })
        .collect();
    Some((dev.public_key.as_ref().map(encode), dev.listen_port, peers))
}

/// The agent's WireGuard state between rounds.
pub struct Keeper {
    key_file: PathBuf,
    conf_dir: PathBuf,
    /// The key file's modification time and the key in force.
    key: Option<(SystemTime, Key)>,
    wg: Option<Wg>,
    /// What was last logged about keyless nodes and strict mode (logged on change).
    logged: Vec<String>,
    /// What encryption looked like at the last look ([`Self::due`]).
    seen: Option<Seen>,
}

/// What [`Keeper::due`] compares: each loaded network's encryption, and the
/// configurations'.
type Seen = (Vec<(String, Option<(u16, bool)>)>, Option<(u16, bool)>);

impl Keeper {
    /// `conf_dir`: the node's CNI configuration directory (a conflist that asks for
    /// encryption has the node prepared before its programs encrypt).
    #[must_use]
    pub fn new(args: &WireguardArgs, conf_dir: &Path) -> Self {
        Self {
            key_file: args.key.clone(),
            conf_dir: conf_dir.to_owned(),
            key: None,
            wg: None,
            logged: Vec::new(),
            seen: None,
        }
    }

    /// One round: the key in force and published, the peers and the programs' entries
    /// as `nodes` say. Does nothing on a node where neither a loaded network nor a CNI
    /// configuration asks for encryption.
    ///
    /// A node whose configuration asks for encryption is prepared before its programs
    /// encrypt (its next ADD turns them on): its device made, its key published, its
    /// peers and every network's entries in place. So the other nodes encrypt to it as
    /// soon as they do, it decrypts what they send, and its own programs have every
    /// entry the moment they start to use them: turning encryption on across a cluster
    /// drops nothing between nodes that both have it configured.
    pub async fn round(
        &mut self,
        nodes: &[Node],
        own: &str,
        root: &Path,
        nl: &Nl,
        api: &Api<Node>,
    ) {
        let nets = networks(root);
        let configured = configured(&self.conf_dir);
        let Some((port, strict)) = nets.iter().find_map(|n| n.encrypting).or(configured) else {
            return;
        };
        if let Err(e) = self.apply(nodes, own, &nets, (port, strict), nl, api).await {
            log(&format!("WireGuard: {e}"));
            self.wg = None;
        }
    }

    async fn apply(
        &mut self,
        nodes: &[Node],
        own: &str,
        nets: &[Network],
        (port, strict): (u16, bool),
        nl: &Nl,
        api: &Api<Node>,
    ) -> Result<()> {
        let underlay = match nets.iter().find(|n| n.encrypting.is_some()) {
            Some(n) => n.underlay,
            None => {
                // Prepared ahead of the programs: the device as ADD would make it, from
                // the uplink ADD would read.
                let facts = node_facts::read(nl, None, false).await?;
                let overhead = if facts.uplink_addr.is_some() {
                    cni_ebpf_common::WIREGUARD_OVERHEAD4
                } else {
                    cni_ebpf_common::WIREGUARD_OVERHEAD6
                };
                ensure_device(nl, facts.uplink_mtu.saturating_sub(overhead)).await?;
                nets.first().map_or(
                    Underlay {
                        v4: facts.uplink_addr.is_some(),
                        v6: facts.uplink_addr6.is_some(),
                    },
                    |n| n.underlay,
                )
            }
        };
        let key = self.key()?;
        let public = public_key(&key);
        let wg = match &mut self.wg {
            Some(wg) => wg,
            None => self.wg.insert(Wg::connect()?),
        };
        let dev = wg.device(WIREGUARD_DEVICE)?;
        if dev.public_key != Some(public) || dev.listen_port != port {
            wg.set_key_and_port(WIREGUARD_DEVICE, &key, port)?;
            log(&format!(
                "{WIREGUARD_DEVICE}: key {} on UDP port {port}",
                encode(&public)
            ));
        }
        publish(nodes, own, &encode(&public), api).await?;
        let want = wanted(nodes, own, port, underlay);
        // New and changed peers first, then the programs use them; the programs stop
        // using a gone one before it goes.
        let have: std::collections::HashMap<Key, &PeerState> =
            dev.peers.iter().map(|p| (p.public_key, p)).collect();
        let changed: Vec<Peer> = want
            .peers
            .iter()
            .filter(|(_, w)| !have.get(&w.public_key).is_some_and(|p| p.is(w)))
            .map(|(_, w)| w.clone())
            .collect();
        wg.set_peers(WIREGUARD_DEVICE, &changed)?;
        // Every loaded network's entries, also of networks whose programs do not
        // encrypt yet: they read them the moment an ADD turns encryption on.
        for n in nets {
            match n.dp.set_wireguard_peers(&want.entries) {
                Ok(0) => {}
                Ok(c) => log(&format!(
                    "{}: {c} WireGuard entries changed ({} peers, {} nodes without a key)",
                    n.name,
                    want.peers.len(),
                    want.keyless.len()
                )),
                Err(e) => log(&format!("{}: the WireGuard entries: {e}", n.name)),
            }
        }
        let kept: std::collections::HashSet<Key> =
            want.peers.iter().map(|(_, w)| w.public_key).collect();
        let gone: Vec<Key> = dev
            .peers
            .iter()
            .map(|p| p.public_key)
            .filter(|k| !kept.contains(k))
            .collect();
        wg.remove_peers(WIREGUARD_DEVICE, &gone)?;
        if !changed.is_empty() || !gone.is_empty() {
            log(&format!(
                "{WIREGUARD_DEVICE}: {} peers set, {} removed",
                changed.len(),
                gone.len()
            ));
        }
        PeerNames {
            nodes: want
                .peers
                .iter()
                .map(|(n, p)| (encode(&p.public_key), n.clone()))
                .collect(),
            keyless: want.keyless.iter().cloned().collect(),
        }
        .write(&self.key_file);
        let mut lines: Vec<String> = want
            .keyless
            .iter()
            .map(|(node, why)| {
                format!(
                    "no WireGuard peer: node {node}: {why}; {}",
                    if strict {
                        "its pods are unreachable (encryptionStrict)"
                    } else {
                        "its pods are reached IN CLEAR (encryptionStrict: false)"
                    }
                )
            })
            .collect();
        lines.sort();
        for l in lines.iter().filter(|l| !self.logged.contains(l)) {
            log(l);
        }
        self.logged = lines;
        Ok(())
    }

    /// The private key in force: the file's, read again when it changed.
    fn key(&mut self) -> Result<Key> {
        if let (true, Some((_, key))) = (self.key_current(), &self.key) {
            return Ok(*key);
        }
        let key = load_or_make(&self.key_file)?;
        self.key = Some((self.key_stamp().unwrap_or(SystemTime::UNIX_EPOCH), key));
        Ok(key)
    }

    /// The key file's modification time (`None`: no file yet).
    fn key_stamp(&self) -> Option<SystemTime> {
        std::fs::metadata(&self.key_file)
            .and_then(|m| m.modified())
            .ok()
    }

    /// Whether the key in force is the key file's as it is now.
    fn key_current(&self) -> bool {
        matches!((&self.key, self.key_stamp()), (Some((seen, _)), Some(now)) if *seen == now)
    }

    /// Whether a round is due since the last look: a network's encryption was turned on
    /// or off or changed (an ADD with a changed conflist), a conflist asks for it now or
    /// no more, a network was loaded, or, with encryption wanted, the key file changed
    /// (a rotation). Cheap: what is read is the node configurations, the conflists and
    /// the key file's time, so the agent looks every second.
    pub fn due(&mut self, root: &Path) -> bool {
        let now: Seen = (
            networks(root)
                .into_iter()
                .map(|n| (n.name, n.encrypting))
                .collect(),
            configured(&self.conf_dir),
        );
        let wanted = now.1.is_some() || now.0.iter().any(|(_, e)| e.is_some());
        let changed = self.seen.as_ref() != Some(&now);
        let first = self.seen.is_none();
        self.seen = Some(now);
        if changed && !first {
            return true;
        }
        wanted && !self.key_current()
    }
}

/// Patches `own`'s Node with `public` unless `nodes` shows it there already.
async fn publish(nodes: &[Node], own: &str, public: &str, api: &Api<Node>) -> Result<()> {
    let current = nodes
        .iter()
        .find(|n| k8s::name(n) == own)
        .and_then(|n| n.metadata.annotations.as_ref())
        .and_then(|a| a.get(PUBLIC_KEY_ANNOTATION));
    if current.map(String::as_str) == Some(public) {
        return Ok(());
    }
    let patch = serde_json::json!({"metadata": {"annotations": {PUBLIC_KEY_ANNOTATION: public}}});
    api.patch(own, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| {
            Error::datapath(
                format!("publishing the WireGuard key on Node {own}"),
                e.to_string(),
            )
        })?;
    log(&format!("node {own}: published WireGuard key {public}"));
    Ok(())
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    /// RFC 7748 section 6.1: Alice's private key gives her public key.
    #[test]
    fn the_public_key_is_x25519_of_the_private_one() {
        let hex = |s: &str| -> Key {
            let v: Vec<u8> = (0..s.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
                .collect();
            Key::try_from(v.as_slice()).unwrap()
        };
        let private = hex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a");
        let public = hex("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a");
        assert_eq!(public_key(&private), public);
        assert_eq!(decode(&encode(&public)), Some(public));
        assert_eq!(decode("not a key"), None);
        assert_eq!(decode(&encode(&public)[..40]), None);
    }

    #[test]
    fn a_key_is_made_once_mode_0600_and_rotation_replaces_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wg/private.key");
        let key = load_or_make(&path).unwrap();
        assert_eq!(load_or_make(&path).unwrap(), key, "kept across restarts");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let dir_mode = std::fs::metadata(path.parent().unwrap())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(dir_mode & 0o777, 0o700);
        let public = rotate(&path).unwrap();
        let new = load_or_make(&path).unwrap();
        assert_ne!(new, key);
        assert_eq!(public_key(&new), public);
        std::fs::write(&path, "garbage").unwrap();
        assert!(
            load_or_make(&path).is_err(),
            "a file without a key is not replaced"
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "garbage");
    }

    fn node(name: &str, cidrs: &[&str], ips: &[&str], key: Option<&str>) -> Node {
        let mut n: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"podCIDRs": cidrs},
            "status": {"addresses": ips.iter().map(|a| serde_json::json!({"type": "InternalIP", "address": a})).collect::<Vec<_>>()},
        }))
        .unwrap();
        if let Some(k) = key {
            n.metadata.annotations =
                Some([(PUBLIC_KEY_ANNOTATION.to_owned(), k.to_owned())].into());
        }
        n
    }

    #[test]
    fn nodes_with_keys_are_peers_and_the_others_keyless_entries() {
        let kb = encode(&[2; 32]);
        let kc = encode(&[3; 32]);
        let nodes = [
            node(
                "a",
                &["10.244.1.0/24"],
                &["198.18.0.1"],
                Some(&encode(&[1; 32])),
            ),
            node(
                "b",
                &["10.244.2.0/24", "fd00:2::/64"],
                &["fd00::2", "198.18.0.2"],
                Some(&kb),
            ),
            node("c", &["10.244.3.0/24"], &["198.18.0.3"], None),
            node("d", &["10.244.4.0/24"], &["198.18.0.4"], Some("bad")),
            node("e", &["10.244.5.0/24"], &["198.18.0.5"], Some(&kb)),
            node("f", &["10.244.6.0/24"], &["fd00::6"], Some(&kc)),
        ];
        let w = wanted(
            &nodes,
            "a",
            51872,
            Underlay {
                v4: true,
                v6: false,
            },
        );
        assert_eq!(w.peers.len(), 1, "{w:?}");
        let (name, b) = &w.peers[0];
        assert_eq!(name, "b");
        assert_eq!(b.endpoint, "198.18.0.2:51872".parse().unwrap());
        assert_eq!(
            b.allowed_ips,
            vec![
                "10.244.2.0/24".parse().unwrap(),
                "fd00:2::/64".parse().unwrap()
            ]
        );
        let keyless: Vec<&str> = w.keyless.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(keyless, ["c", "d", "e", "f"]);
        let keyed: Vec<String> = w
            .entries
            .iter()
            .filter(|(_, p)| p.flags & WIREGUARD_KEYED != 0)
            .map(|(n, _)| n.to_string())
            .collect();
        assert_eq!(keyed, ["10.244.2.0/24", "fd00:2::/64"]);
        assert_eq!(w.entries.len(), 6, "own node's CIDRs are no entry: {w:?}");
    }
}
