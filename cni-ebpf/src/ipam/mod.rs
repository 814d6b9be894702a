//! Address management: the embedded allocator, or delegation to an IPAM plugin.
//!
//! With no `ipam.type` (or `cni-ebpf`) the embedded allocator serves the host-local schema
//! ([`config`]); any other `ipam.type` is run as a delegated plugin ([`delegate`]).
//!
//! # Store layout
//!
//! One directory per network, `<dataDir>/<network name>/`, root-owned, mode 0700 (files
//! 0600):
//!
//! ```text
//! meta                      {"format":1,"bootId":"…"}: layout version, boot of the last use
//! lock                      flock(2) target, one per network; never removed
//! last_reserved_ip.<set>    round-robin cursor of range set <set> (a hint)
//! keys/<containerID>:<ifname>   the reservation record (JSON: addresses, bootId, netns, …)
//! ips/<address>             a hard link of the record that claims <address>
//! index/<start>-<end>       bitmap of held addresses of one range (a hint)
//! tmp/                      records being written; leftovers of killed processes
//! ```
//!
//! An address is **held** by key K exactly when `ips/<address>` and `keys/K` are the same
//! inode. The record is written once, into a fresh file in `tmp/`, *before* any name
//! points at it, and never modified afterwards.
//!
//! # Crash safety (kill -9 at any instant)
//!
//! Every operation runs under the network's lock. ADD: write the record to `tmp/x`; claim
//! each address with `link(tmp/x, ips/<address>)` (atomic, fails if the address is
//! claimed); **commit** with `link(tmp/x, keys/K)`; remove `tmp/x`; then set index bits and
//! the cursor. DEL: clear index bits; **commit** by renaming `keys/K` to `tmp/y`; remove
//! the `ips/<address>` links that are still this record's inode (so a stale DEL never
//! frees an address that now belongs to someone else); remove `tmp/y`.
//!
//! - Killed before the commit, an allocation left only claims whose inode no key names
//!   ("orphans"): they are not held, so the allocation is absent. Killed after it, every
//!   address is held: the allocation is fully present. A release is likewise all or
//!   nothing around the rename of `keys/K`.
//! - Whatever a killed operation left in `tmp/` is finished by the next operation of any
//!   kind: opening the store removes every temporary file, and with a record no key names
//!   the claims that are still its inode. So a DEL killed after its commit and run again
//!   leaves nothing behind, though its key is gone.
//! - No address can be held twice: there is one `ips/<address>` name, it points at one
//!   inode, and one inode is one record.
//! - Nothing is lost for good: an orphan is recognised (its inode is no key's) and reused
//!   when the search reaches it, and every GC, STATUS, rebuild and reboot sweep removes all
//!   orphans and leftover temporary files. Readers never see a partial record because
//!   names only ever point at complete files.
//! - The index bitmaps and cursors are hints. A set bit always means "held" (set after the
//!   commit of an allocation, cleared before the commit of a release); a clear bit may be
//!   stale and is corrected when probed. When the index says a range set is full it is
//!   rebuilt from `ips/` and `keys/` once before exhaustion is reported.
//!
//! Files are not fsync'ed. A kill -9 loses nothing that is in the page cache; only a
//! kernel crash or power loss can lose writes, and both are reboots, after which the
//! reboot rule below discards every reservation of the previous boot anyway, including
//! any torn or empty file. Skipping fsync keeps allocate+release well under a millisecond
//! (three fsyncs per operation cost ~10 ms on ordinary disks).
//!
//! # The reboot rule
//!
//! Each record carries the boot id (`/proc/sys/kernel/random/boot_id`) of the boot it was
//! made in, and `meta` the boot id of the last operation. Network namespaces do not
//! survive a reboot, so a reservation made in another boot belongs to a namespace that no
//! longer exists. The first operation of a new boot (any verb that opens the store)
//! therefore releases every reservation whose boot id differs from the current one,
//! repairs the store, and then records the new boot id in `meta`. If it is interrupted,
//! the next operation does it again. A runtime that re-creates a container after a reboot
//! with the same ID can thus ADD it again; the released reservations are logged and
//! returned by the GC that performs the sweep.
//!
//! # Lookups and cost
//!
//! A key or address is found by name (O(1) directory lookups); the free-address search
//! reads the index bitmap from the cursor onwards. Nothing on the ADD/DEL path lists a
//! directory, so allocate+release stays flat as the store grows. Listing, GC, repair and
//! the reboot sweep are O(reservations).

use std::{net::IpAddr, path::PathBuf};

use ipnet::IpNet;

use crate::{
    cni::{
        config::NetConf,
        env::{Command, Env},
        result::{CniResult, IpConfig},
    },
    error::{Error, Result},
};

pub mod allocator;
pub mod config;
pub mod delegate;
pub mod record;
pub mod store;

pub use allocator::{Allocator, Audit};
pub use config::{Ipam, IpamConfig};
pub use record::{PodRef, Requester};
pub use store::StoreOptions;

/// One reservation: the addresses held by `(container_id, ifname)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// Container ID.
    pub container_id: String,
    /// Interface name inside the container.
    pub ifname: String,
    /// The addresses, one per range set (empty if the record could not be read).
    pub addresses: Vec<IpAddr>,
    /// The same addresses with their range's prefix length.
    pub networks: Vec<IpNet>,
    /// Boot id of the boot the reservation was made in.
    pub boot_id: String,
    /// `CNI_NETNS` at ADD time.
    pub netns: Option<String>,
    /// Seconds since the Unix epoch when the reservation was made (0 if unknown).
    pub created: u64,
}

impl From<record::Record> for Reservation {
    fn from(r: record::Record) -> Self {
        Self {
            container_id: r.container_id,
            ifname: r.ifname,
            addresses: r.addresses.iter().map(IpNet::addr).collect(),
            networks: r.addresses,
            boot_id: r.boot_id,
            netns: r.netns,
            created: r.created,
        }
    }
}

impl Reservation {
    /// A reservation known only by its key file name (its record is unreadable).
    #[must_use]
    pub fn from_key_name(name: &str) -> Self {
        let (container_id, ifname) = record::split_key_name(name).unwrap_or((name, ""));
        Self {
            container_id: container_id.to_owned(),
            ifname: ifname.to_owned(),
            addresses: Vec::new(),
            networks: Vec::new(),
            boot_id: String::new(),
            netns: None,
            created: 0,
        }
    }
}

fn store_dir(conf: &NetConf) -> PathBuf {
    conf.store_dir()
}

/// Opens the allocator of `conf`'s network (`create`: make the store if missing).
fn open<'a>(conf: &NetConf, cfg: &'a IpamConfig, create: bool) -> Result<Option<Allocator<'a>>> {
    let opts = StoreOptions {
        create,
        ..StoreOptions::default()
    };
    Allocator::open(&store_dir(conf), &conf.name, cfg, &opts)
}

/// Parse + validate the ipam config and requested IPs WITHOUT side effects (ADD validates
/// everything first). For a delegated plugin: its name and that it is in `CNI_PATH`.
pub fn validate(conf: &NetConf, env: &Env) -> Result<()> {
    match Ipam::parse(&conf.ipam)? {
        Ipam::Delegate(plugin) => delegate::find(&plugin, &env.path).map(|_| ()),
        Ipam::Embedded(cfg) => {
            cfg.check_routes()?;
            let requested = config::requested_ips(conf, env)?;
            cfg.assign_requests(&requested)?;
            record::key_name(&env.container_id, &env.ifname)?;
            cfg.result_dns(conf)?;
            store::check_path(&store_dir(conf))
        }
    }
}

/// Runs a verb on the network's IPAM, the one place that parses `ipam` and opens the
/// embedded store: `delegated` gets a delegated plugin's name; `embedded` gets the
/// embedded configuration and its store. `missing` says what a store that does not exist
/// means to the verb; `None`: the verb makes it (ADD, STATUS).
fn on_store<T>(
    conf: &NetConf,
    delegated: impl FnOnce(&str) -> Result<T>,
    missing: Option<fn() -> Result<T>>,
    embedded: impl FnOnce(&IpamConfig, Allocator<'_>) -> Result<T>,
) -> Result<T> {
    let cfg = match Ipam::parse(&conf.ipam)? {
        Ipam::Delegate(plugin) => return delegated(&plugin),
        Ipam::Embedded(cfg) => cfg,
    };
    match (open(conf, &cfg, missing.is_none())?, missing) {
        (Some(alloc), _) => embedded(&cfg, alloc),
        (None, Some(missing)) => missing(),
        (None, None) => Err(Error::Ipam(format!(
            "the IPAM store {} could not be created",
            store_dir(conf).display()
        ))),
    }
}

/// Reserve addresses for `(env.container_id, env.ifname)`. The result has `ips`
/// (`interface: None`, the range's gateway, the address with the range's prefix length),
/// `routes` from `ipam.routes` and `dns` (`ipam.dns`, else `ipam.resolvConf`, else the
/// top-level `dns`). With a delegated plugin: its result, parsed from any version.
pub fn add(conf: &NetConf, env: &Env, stdin: &[u8]) -> Result<CniResult> {
    on_store(
        conf,
        |plugin| delegate::add(plugin, conf, env, stdin),
        None,
        |cfg, mut alloc| {
            let requested = config::requested_ips(conf, env)?;
            let assigned = cfg.assign_requests(&requested)?;
            let dns = cfg.result_dns(conf)?;
            let ips: Vec<IpConfig> = alloc.allocate(
                &env.container_id,
                &env.ifname,
                Requester {
                    netns: env.netns.as_ref().map(|p| p.display().to_string()),
                    pod: PodRef::from_args(&env.args),
                },
                &assigned,
            )?;
            Ok(CniResult {
                interfaces: Vec::new(),
                ips,
                routes: cfg.routes.clone(),
                dns,
            })
        },
    )
}

/// Idempotent release of `(env.container_id, env.ifname)`; never frees an address now
/// held by another key. A store that does not exist holds nothing: success. Returns the
/// addresses released (none for a delegated plugin, which does not say).
pub fn del(conf: &NetConf, env: &Env, stdin: &[u8]) -> Result<Vec<IpAddr>> {
    on_store(
        conf,
        |plugin| delegate::exec(plugin, Command::Del, env, stdin).map(|_| Vec::new()),
        Some(|| Ok(Vec::new())),
        |_, mut alloc| {
            let Some(r) = alloc.release(&env.container_id, &env.ifname)? else {
                return Ok(Vec::new());
            };
            tracing::info!(container = %r.container_id, ifname = %r.ifname, "released {:?}", r.addresses);
            Ok(r.addresses)
        },
    )
}

/// CHECK: the store (or the delegate) holds exactly `expected` for this key (address and
/// prefix length); [`Error::Check`] naming the difference otherwise.
pub fn check(conf: &NetConf, env: &Env, stdin: &[u8], expected: &[IpNet]) -> Result<()> {
    let no_store = || {
        Error::Check(format!(
            "container {} interface {} has no address reservation: the IPAM store {} does \
             not exist",
            env.container_id,
            env.ifname,
            store_dir(conf).display()
        ))
    };
    // A missing store is told apart from the verb's own result by the outer `Option`.
    on_store(
        conf,
        |plugin| {
            Ok(Some(
                delegate::exec(plugin, Command::Check, env, stdin).map(|_| ()),
            ))
        },
        Some(|| Ok(None)),
        |_, alloc| Ok(Some(alloc.check(&env.container_id, &env.ifname, expected))),
    )?
    .unwrap_or_else(|| Err(no_store()))
}

/// GC: release every reservation whose key is not in `conf.valid_attachments`, and clean
/// up crash leftovers (the lock and the round-robin cursors are left alone). Returns the
/// released reservations (including any released by a reboot sweep) so the caller can
/// clean the datapath too. With a delegated plugin: its GC, if it speaks 1.1.0 (the
/// released addresses are then unknown: the result is empty).
pub fn gc(conf: &NetConf, env: &Env, stdin: &[u8]) -> Result<Vec<Reservation>> {
    on_store(
        conf,
        |plugin| {
            if delegate::supports(plugin, conf, env, "1.1.0")? {
                delegate::exec(plugin, Command::Gc, env, stdin)?;
            } else {
                tracing::info!("IPAM plugin {plugin} does not support GC (cniVersion 1.1.0)");
            }
            Ok(Vec::new())
        },
        Some(|| Ok(Vec::new())),
        |_, mut alloc| {
            let mut released = alloc.swept().to_vec();
            released.extend(alloc.gc(&conf.valid_attachment_keys())?);
            Ok(released)
        },
    )
}

/// STATUS: the store directory is usable and writable and every range set has at least
/// one free address; [`Error::NotAvailable`] otherwise. With a delegated plugin: its
/// STATUS, if it speaks 1.1.0.
pub fn status(conf: &NetConf, env: &Env, stdin: &[u8]) -> Result<()> {
    let not_available = |e: Error| match e {
        e @ (Error::NotAvailable(_) | Error::TryAgain(_)) => e,
        e => Error::NotAvailable(format!(
            "the IPAM store {} is not usable: {e}",
            store_dir(conf).display()
        )),
    };
    let cfg = match Ipam::parse(&conf.ipam)? {
        Ipam::Delegate(plugin) => {
            delegate::find(&plugin, &env.path).map_err(|e| Error::NotAvailable(e.to_string()))?;
            if delegate::supports(&plugin, conf, env, "1.1.0")? {
                delegate::exec(&plugin, Command::Status, env, stdin)?;
            }
            return Ok(());
        }
        Ipam::Embedded(cfg) => cfg,
    };
    // Not through `on_store`: here a store that cannot be opened or made is the verb's
    // answer (not available), while a configuration error stays one.
    let mut alloc = open(conf, &cfg, true)
        .map_err(not_available)?
        .ok_or_else(|| {
            Error::NotAvailable(format!(
                "the IPAM store {} could not be created",
                store_dir(conf).display()
            ))
        })?;
    alloc.status().map_err(not_available)
}

/// All current reservations (for inspect / datapath GC), sorted by key. Empty for a
/// delegated plugin or a store that does not exist yet.
pub fn list(conf: &NetConf) -> Result<Vec<Reservation>> {
    on_store(
        conf,
        |_| Ok(Vec::new()),
        Some(|| Ok(Vec::new())),
        |_, alloc| alloc.list(),
    )
}

/// A read-only consistency report of the network's store (for `inspect` and tests).
/// `None` for a delegated plugin or a store that does not exist.
pub fn audit(conf: &NetConf) -> Result<Option<Audit>> {
    on_store(
        conf,
        |_| Ok(None),
        Some(|| Ok(None)),
        |_, mut alloc| alloc.audit().map(Some),
    )
}
