//! `cni-ebpf metrics`: a Prometheus endpoint over the pinned datapath, for the DaemonSet's
//! main container. It keeps no state of the datapath's own: every scrape opens each
//! network's pinned maps read-only, reads them and closes them again.
//!
//! - [`collect`]: one scrape's reading of the maps ([`collect::Snapshot`]) and the
//!   exporter that does it, logging and counting what it could not read;
//! - [`render`]: a snapshot as metric families — every metric is defined there — and the
//!   exporter as a `prometheus-client` collector, which writes the text format;
//! - [`server`]: the bounded HTTP/1 endpoints on hyper (`/metrics`; the probes `/healthz`
//!   and `/ready`).
//!
//! Nothing here is reachable from the CNI verbs: the plugin's ADD/DEL/CHECK path neither
//! links a code path into it nor initialises anything of it.

pub mod collect;
pub mod render;
pub mod server;

pub use collect::{Exporter, NetworkSnapshot, Snapshot};
pub use server::{serve, Listeners};

/// Default address of `/metrics`: the node's loopback. The DaemonSet's manifest serves it
/// on the node's address (`$(NODE_IP):9670`) for Prometheus; see docs/operations.md for
/// what it reveals.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9670";
/// Default address of the probes (`/healthz`, `/ready`): the node's loopback, where the
/// kubelet probes a host-network pod (`httpGet.host: 127.0.0.1`).
pub const DEFAULT_PROBE_LISTEN: &str = "127.0.0.1:9671";

/// A listen address: `<ip>:<port>`, an IPv6 address bracketed or not (`$(NODE_IP):9670`
/// from the downward API gives `fd00::1:9670`; the last `:` separates the port).
///
/// # Errors
/// What is not such an address, named.
pub fn parse_listen(s: &str) -> Result<std::net::SocketAddr, String> {
    if let Ok(addr) = s.parse() {
        return Ok(addr);
    }
    let bad = || format!("{s:?} is not <address>:<port>");
    let (ip, port) = s.rsplit_once(':').ok_or_else(bad)?;
    let ip: std::net::IpAddr = ip.parse().map_err(|_| bad())?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    Ok(std::net::SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::parse_listen;

    #[test]
    fn listen_addresses_take_unbracketed_ipv6() {
        assert_eq!(
            parse_listen("127.0.0.1:9670").map(|a| a.to_string()),
            Ok("127.0.0.1:9670".into())
        );
        assert_eq!(
            parse_listen("[fd00::1]:9670").map(|a| a.to_string()),
            Ok("[fd00::1]:9670".into())
        );
        assert_eq!(
            parse_listen("fd00::1:9670").map(|a| a.to_string()),
            Ok("[fd00::1]:9670".into())
        );
        assert!(parse_listen("node:9670").is_err_and(|e| e.contains("\"node:9670\"")));
        assert!(parse_listen(":9670").is_err());
    }
}
