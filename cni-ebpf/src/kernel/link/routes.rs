//! Routes: the ones a pod's attachment installs ([`NewRoute`]), the main-table routes
//! by device or gateway that the node-wide modes keep, and reading them back
//! ([`RouteInfo`]).

use std::net::IpAddr;

use futures::TryStreamExt;
use ipnet::IpNet;
use netlink_packet_route::{
    route::{RouteAddress, RouteAttribute, RouteMessage, RouteMetric, RouteProtocol, RouteScope},
    AddressFamily,
};
use rtnetlink::RouteMessageBuilder;

use super::{is_errno, retry_dump, Nl, RTPROT_CNI_EBPF, RT_TABLE_LOCAL, RT_TABLE_MAIN};
use crate::error::{Error, Result};

/// A route as read back from the kernel (main table unless stated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteInfo {
    /// Destination.
    pub dst: IpNet,
    /// Gateway.
    pub gw: Option<IpAddr>,
    /// Output interface.
    pub oif: Option<u32>,
    /// Table id.
    pub table: u32,
    /// Scope (`RT_SCOPE_*` value).
    pub scope: u8,
    /// Protocol (`RTPROT_*` value: who installed it).
    pub protocol: u8,
}

/// A route to install.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewRoute {
    /// Destination.
    pub dst: IpNet,
    /// Gateway, if any.
    pub gw: Option<IpAddr>,
    /// Output interface.
    pub oif: u32,
    /// Scope (`RT_SCOPE_*`); `None` = the kernel's default for the route (universe, or
    /// link for a route without gateway). On-link host routes use
    /// [`RT_SCOPE_LINK`](super::RT_SCOPE_LINK).
    pub scope: Option<u8>,
    /// Metric.
    pub priority: Option<u32>,
    /// Route MTU.
    pub mtu: Option<u32>,
    /// Advertised MSS (`RTAX_ADVMSS`).
    pub advmss: Option<u32>,
    /// Routing table; `None` = main.
    pub table: Option<u32>,
}

impl Nl {
    /// Adds or replaces the main-table route `dst dev oif` marked with `protocol`.
    pub async fn replace_device_route(&self, dst: IpNet, oif: u32, protocol: u8) -> Result<()> {
        let refused = |e: &dyn std::fmt::Display| {
            Error::netlink(
                format!("building the route to {dst} on link #{oif}"),
                e.to_string(),
            )
        };
        let msg = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(dst.addr(), dst.prefix_len())
            .map_err(|e| refused(&e))?
            .output_interface(oif)
            .table_id(RT_TABLE_MAIN)
            .protocol(RouteProtocol::Other(protocol))
            .build();
        self.handle
            .route()
            .add(msg)
            .replace()
            .execute()
            .await
            .map_err(|e| Error::netlink(format!("adding route to {dst} on link #{oif}"), e))
    }

    /// Adds a route. A route to the same destination that already exists (another
    /// network's default route in the pod, the same network attached twice, a duplicate
    /// pod address on the node) is an error that says so: replacing it would break
    /// someone else's traffic, and ignoring it would report a route we did not install.
    pub async fn add_route(&self, route: &NewRoute) -> Result<()> {
        let msg = build_route(route)?;
        let context = || format!("adding route to {} on link #{}", route.dst, route.oif);
        match self.handle.route().add(msg).execute().await {
            Ok(()) => Ok(()),
            Err(e) if is_errno(&e, libc::EEXIST) => Err(Error::netlink(
                context(),
                format!(
                    "a route to {} already exists (is this network already attached, or does \
                     another one own that route?)",
                    route.dst
                ),
            )),
            Err(e) => Err(Error::netlink(context(), e)),
        }
    }

    /// Adds (`replace`: or replaces) the main-table route `dst via gw` marked with
    /// `protocol`; the kernel picks the device that reaches `gw` on-link.
    pub async fn add_gateway_route(
        &self,
        dst: IpNet,
        gw: IpAddr,
        protocol: u8,
        replace: bool,
    ) -> Result<()> {
        let msg = gateway_route(dst, gw, protocol)?;
        let req = self.handle.route().add(msg);
        let req = if replace { req.replace() } else { req };
        req.execute()
            .await
            .map_err(|e| Error::netlink(format!("adding route to {dst} via {gw}"), e))
    }

    /// Deletes the main-table route `dst via gw` with `protocol` (the kernel matches the
    /// protocol, so a route someone else installed is never removed); a missing route is
    /// not an error.
    pub async fn del_gateway_route(&self, dst: IpNet, gw: IpAddr, protocol: u8) -> Result<()> {
        let msg = gateway_route(dst, gw, protocol)?;
        match self.handle.route().del(msg).execute().await {
            Ok(()) => Ok(()),
            Err(e) if is_errno(&e, libc::ESRCH) => Ok(()),
            Err(e) => Err(Error::netlink(
                format!("deleting route to {dst} via {gw}"),
                e,
            )),
        }
    }

    /// Every route of both families in every table but `local` (the kernel's own).
    pub async fn routes(&self) -> Result<Vec<RouteInfo>> {
        let mut out = Vec::new();
        for v6 in [false, true] {
            let msg = if v6 {
                RouteMessageBuilder::<std::net::Ipv6Addr>::new().build()
            } else {
                RouteMessageBuilder::<std::net::Ipv4Addr>::new().build()
            };
            let msgs: Vec<RouteMessage> = retry_dump("listing routes", || async {
                self.handle
                    .route()
                    .get(msg.clone())
                    .execute()
                    .try_collect()
                    .await
            })
            .await?;
            out.extend(
                msgs.iter()
                    .filter_map(route_info)
                    .filter(|r| r.table != RT_TABLE_LOCAL),
            );
        }
        Ok(out)
    }

    /// The ifindex of the device of the IPv4 default route, if there is one.
    pub async fn default_route_device(&self) -> Result<Option<u32>> {
        Ok(self
            .routes()
            .await?
            .into_iter()
            .find(|r| r.table == RT_TABLE_MAIN && r.dst.prefix_len() == 0 && r.dst.addr().is_ipv4())
            .and_then(|r| r.oif))
    }
}

/// The netlink message for `r`. The builder refuses what the kernel could not install as
/// asked (an IPv4 gateway on an IPv6 destination); that is an error here, never a route
/// quietly built without the part that was refused.
fn build_route(r: &NewRoute) -> Result<RouteMessage> {
    // rtnetlink does not export its error type (`InvalidRouteMessage`); keep its text.
    let refused = |e: &dyn std::fmt::Display| {
        let via = r.gw.map(|g| format!(" via {g}")).unwrap_or_default();
        Error::netlink(
            format!("building the route to {}{via}", r.dst),
            e.to_string(),
        )
    };
    let mut b = RouteMessageBuilder::<IpAddr>::new()
        .destination_prefix(r.dst.addr(), r.dst.prefix_len())
        .map_err(|e| refused(&e))?;
    if let Some(gw) = r.gw {
        b = b.gateway(gw).map_err(|e| refused(&e))?;
    }
    b = b
        .output_interface(r.oif)
        .protocol(RouteProtocol::Other(RTPROT_CNI_EBPF));
    if let Some(scope) = r.scope {
        b = b.scope(RouteScope::from(scope));
    }
    if let Some(p) = r.priority {
        b = b.priority(p);
    }
    if let Some(t) = r.table {
        b = b.table_id(t);
    }
    let mut msg = b.build();
    let metrics: Vec<RouteMetric> = [
        r.mtu.map(RouteMetric::Mtu),
        r.advmss.map(RouteMetric::Advmss),
    ]
    .into_iter()
    .flatten()
    .collect();
    if !metrics.is_empty() {
        msg.attributes.push(RouteAttribute::Metrics(metrics));
    }
    Ok(msg)
}

/// The message of a main-table route `dst via gw` with `protocol` and no device.
fn gateway_route(dst: IpNet, gw: IpAddr, protocol: u8) -> Result<RouteMessage> {
    let refused = |e: &dyn std::fmt::Display| {
        Error::netlink(
            format!("building the route to {dst} via {gw}"),
            e.to_string(),
        )
    };
    Ok(RouteMessageBuilder::<IpAddr>::new()
        .destination_prefix(dst.addr(), dst.prefix_len())
        .map_err(|e| refused(&e))?
        .gateway(gw)
        .map_err(|e| refused(&e))?
        .table_id(RT_TABLE_MAIN)
        .protocol(RouteProtocol::Other(protocol))
        .build())
}

fn route_info(m: &RouteMessage) -> Option<RouteInfo> {
    let mut dst = None;
    let mut gw = None;
    let mut oif = None;
    let mut table = u32::from(m.header.table);
    for a in &m.attributes {
        match a {
            RouteAttribute::Destination(RouteAddress::Inet(ip)) => dst = Some(IpAddr::V4(*ip)),
            RouteAttribute::Destination(RouteAddress::Inet6(ip)) => dst = Some(IpAddr::V6(*ip)),
            RouteAttribute::Gateway(RouteAddress::Inet(ip)) => gw = Some(IpAddr::V4(*ip)),
            RouteAttribute::Gateway(RouteAddress::Inet6(ip)) => gw = Some(IpAddr::V6(*ip)),
            RouteAttribute::Oif(i) => oif = Some(*i),
            RouteAttribute::Table(t) => table = *t,
            _ => {}
        }
    }
    let dst = match (dst, m.header.address_family) {
        (Some(ip), _) => IpNet::new(ip, m.header.destination_prefix_length).ok()?,
        (None, AddressFamily::Inet) => IpNet::new(IpAddr::V4(0.into()), 0).ok()?,
        (None, AddressFamily::Inet6) => IpNet::new(IpAddr::V6(0.into()), 0).ok()?,
        (None, _) => return None,
    };
    Some(RouteInfo {
        dst,
        gw,
        oif,
        table,
        scope: u8::from(m.header.scope),
        protocol: u8::from(m.header.protocol),
    })
}

#[cfg(test)]
#[expect(clippy::panic, reason = "tests fail by panicking with a message")]
mod tests {
    use super::{build_route, NewRoute, RouteAttribute, RouteMetric, RouteScope};
    use crate::error::Error;

    fn route(dst: &str, gw: &str) -> NewRoute {
        NewRoute {
            dst: dst.parse().unwrap_or_else(|e| panic!("{dst}: {e}")),
            gw: Some(gw.parse().unwrap_or_else(|e| panic!("{gw}: {e}"))),
            oif: 2,
            scope: None,
            priority: None,
            mtu: None,
            advmss: None,
            table: None,
        }
    }

    #[test]
    fn a_route_keeps_its_gateway_or_is_an_error() {
        let msg = build_route(&route("10.0.0.0/8", "10.244.1.1"))
            .unwrap_or_else(|e| panic!("a same-family route was refused: {e}"));
        assert!(
            msg.attributes
                .iter()
                .any(|a| matches!(a, RouteAttribute::Gateway(_))),
            "the gateway is missing from {msg:?}"
        );
        // The builder cannot put an IPv4 gateway on an IPv6 route; that used to yield a
        // route without a gateway.
        match build_route(&route("2001:db8::/64", "10.244.1.1")) {
            Err(Error::Netlink { context, .. }) => {
                assert!(
                    context.contains("2001:db8::/64 via 10.244.1.1"),
                    "{context}"
                );
            }
            Err(e) => panic!("refused with the wrong error: {e}"),
            Ok(msg) => panic!("built without complaint: {msg:?}"),
        }
    }

    #[test]
    fn every_field_of_a_route_reaches_the_message() {
        let r = NewRoute {
            scope: Some(0),
            priority: Some(7),
            mtu: Some(1400),
            advmss: Some(1300),
            table: Some(1000),
            ..route("192.0.2.0/24", "10.244.1.1")
        };
        let msg = build_route(&r).unwrap_or_else(|e| panic!("refused: {e}"));
        let has = |f: &dyn Fn(&RouteAttribute) -> bool| msg.attributes.iter().any(f);
        assert!(
            has(&|a| matches!(a, RouteAttribute::Priority(7))),
            "{msg:?}"
        );
        assert!(
            has(&|a| matches!(a, RouteAttribute::Table(1000))),
            "{msg:?}"
        );
        assert!(
            has(&|a| matches!(a, RouteAttribute::Metrics(m)
                if m.contains(&RouteMetric::Mtu(1400)) && m.contains(&RouteMetric::Advmss(1300)))),
            "{msg:?}"
        );
        assert_eq!(msg.header.scope, RouteScope::Universe);
    }
}
