//! ADD: validate everything, then IPAM → veth → addresses and routes → datapath, as one
//! transaction. Each step registers its undo; on failure the undos run in reverse and the
//! first error is returned.

use std::net::IpAddr;

use ipnet::IpNet;
use serde_json::Value;

use crate::{
    cni::{
        config::{format_mac, parse_mac, InterfaceKind, NetConf},
        env::Env,
        result::{CniResult, Interface, IpConfig, Route},
    },
    datapath::{Datapath, Endpoint},
    error::{Error, Result},
    ipam,
    ipam::record::PodRef,
    kernel::link::{self, NewRoute, Nl},
    kernel::netns::Netns,
};

/// The MAC ADD gives the container interface: `runtimeConfig.mac` (capability `mac`),
/// else `CNI_ARGS MAC=`, else one derived from (container ID, ifname). A later chained
/// plugin (e.g. `tuning`) may change it; CHECK accepts either.
pub fn pod_mac(conf: &NetConf, env: &Env) -> Result<[u8; 6]> {
    match (&conf.runtime_config.mac, env.args.get("MAC")) {
        (Some(m), _) => parse_mac(m)
            .ok_or_else(|| Error::config("runtimeConfig.mac", format!("{m:?} is not a MAC"))),
        (None, Some(m)) => {
            parse_mac(m).ok_or_else(|| Error::env("CNI_ARGS", format!("MAC={m:?} is not a MAC")))
        }
        (None, None) => Ok(link::derived_mac(&env.container_id, &env.ifname, "pod")),
    }
}

/// Deletes the veth pairs earlier DELs retired and left to their finishing processes (see
/// `del`) that are in the pod's way: one whose pod end DEL moved aside in this namespace
/// (its retired group) or that still holds this interface of the pod (DEL then ADD into
/// one namespace), or that holds this attachment's host veth name (DEL then ADD of the
/// same container). Returns whether, after that, the pod still has an interface called
/// `ifname` and the node a link called `host_ifname`: ADD's own existence checks.
async fn clear_retired(
    node: &Nl,
    ctr: &Nl,
    network: &str,
    ifname: &str,
    host_ifname: &str,
) -> Result<(bool, bool)> {
    let retired =
        |l: &link::Link| l.group == link::retired_group(network) && link::is_pod_pair_end(l);
    for pod_end in ctr.pair_ends_in_group(link::retired_group(network)).await? {
        let Some(peer) = pod_end.peer_index else {
            continue;
        };
        if let Some(host) = node.link_by_index(peer).await? {
            if retired(&host) && host.peer_index == Some(pod_end.index) {
                tracing::info!("deleting {}, retired by an earlier DEL", host.name);
                node.del_link(host.index).await?;
            }
        }
    }
    let mut pod_end_taken = false;
    if let Some(pod_end) = ctr.link_by_name(ifname).await? {
        pod_end_taken = true;
        // The pod end names its peer's ifindex; the peer must name it back.
        if let Some(peer) = pod_end.peer_index {
            if let Some(host) = node.link_by_index(peer).await? {
                if retired(&host) && host.peer_index == Some(pod_end.index) {
                    tracing::info!("deleting {}, retired by an earlier DEL", host.name);
                    node.del_link(host.index).await?;
                    pod_end_taken = false;
                }
            }
        }
    }
    let mut host_name_taken = false;
    if let Some(host) = node.link_by_name(host_ifname).await? {
        host_name_taken = true;
        if retired(&host) {
            tracing::info!("deleting {}, retired by an earlier DEL", host.name);
            node.del_link(host.index).await?;
            host_name_taken = false;
        }
    }
    Ok((pod_end_taken, host_name_taken))
}

/// What has been done so far and must be undone if a later step fails.
enum Undo {
    Ipam,
    HostLink(u32),
    Endpoint {
        host_ifname: String,
        ips: Vec<IpAddr>,
    },
    PortMappings,
}

/// Runs ADD and returns the result document.
pub fn run(env: &Env, conf: &NetConf, stdin: &[u8]) -> Result<Value> {
    // Validate everything before changing anything.
    ipam::validate(conf, env)?;
    let netns_path = env
        .netns
        .as_deref()
        .ok_or_else(|| Error::env("CNI_NETNS", "is required for ADD"))?;
    let netns = Netns::open(netns_path).map_err(|e| Error::env("CNI_NETNS", e.to_string()))?;
    let host_ifname = link::host_veth_name(&env.container_id, &env.ifname);
    let ctr_mac = pod_mac(conf, env)?;
    // Name and MAC of the host veth are both derived from (container ID, ifname) and set in
    // the request that creates the pair: they prove ownership to DEL even if ADD is killed
    // before it labels the link with its alias.
    let host_mac = link::derived_mac(&env.container_id, &env.ifname, "host");

    let rt = link::runtime()?;
    rt.block_on(async {
        let node = Nl::connect()?;
        // The pod's netns cookie makes its sockets ones the Service translation applies
        // to (read while inside, with the pod's netlink socket).
        let (ctr, pod_netns) = {
            let _in_pod = netns.enter()?;
            (Nl::connect()?, crate::datapath::netns_cookie()?)
        };
        let (pod_end_taken, host_name_taken) =
            clear_retired(&node, &ctr, &conf.name, &env.ifname, &host_ifname).await?;
        if pod_end_taken {
            return Err(Error::InterfaceExists {
                ifname: env.ifname.clone(),
                netns: netns_path.display().to_string(),
            });
        }
        if host_name_taken {
            return Err(Error::InterfaceExists {
                ifname: host_ifname.clone(),
                netns: "the node".into(),
            });
        }
        // Loading is per network and idempotent (no per-pod state), so it is part of
        // validation: a node that cannot run our programs gets no half-made pod.
        let dp = Datapath::open_or_load_with(conf, &node).await?;

        let mut txn = Transaction {
            env,
            conf,
            stdin,
            netns: &netns,
            node: &node,
            ctr: &ctr,
            pod_netns,
            dp: &dp,
            host_ifname: &host_ifname,
            host_mac,
            ctr_mac,
            netkit: false,
            undo: Vec::new(),
        };
        let out = txn.run().await;
        if let Err(e) = &out {
            tracing::warn!(container = %env.container_id, "ADD failed, rolling back: {e}");
            txn.rollback().await;
        }
        out
    })
}

/// One ADD: its whole context, and what it has done so far (`undo`).
struct Transaction<'a> {
    env: &'a Env,
    conf: &'a NetConf,
    stdin: &'a [u8],
    /// The pod's network namespace.
    netns: &'a Netns,
    /// Netlink in the node's namespace.
    node: &'a Nl,
    /// Netlink in the pod's namespace.
    ctr: &'a Nl,
    /// The pod namespace's cookie (`SO_NETNS_COOKIE`).
    pod_netns: u64,
    dp: &'a Datapath,
    host_ifname: &'a str,
    host_mac: [u8; 6],
    ctr_mac: [u8; 6],
    /// Whether step 2 made a netkit pair (else a veth pair).
    netkit: bool,
    /// The steps done, undone in reverse by [`Self::rollback`].
    undo: Vec<Undo>,
}

impl Transaction<'_> {
    /// The steps in order; the result document.
    async fn run(&mut self) -> Result<Value> {
        let fault = crate::faults::point;
        let ipam_result = self.addresses()?;
        let host_index = self.veth().await?;
        self.node_side(&ipam_result, host_index).await?;
        fault("host-routes")?;
        let (routes, ctr_index) = self.container_side(&ipam_result).await?;
        fault("container")?;
        self.datapath(&ipam_result, host_index)?;
        fault("port-mappings")?;
        let pod_ips: Vec<IpAddr> = ipam_result.ips.iter().map(|ip| ip.address.addr()).collect();
        crate::kernel::ndp::wait_for_solicited_nodes(
            self.netns,
            ctr_index,
            &pod_ips,
            crate::kernel::ndp::JOIN_WAIT,
        )
        .await?;
        Ok(self.result(&ipam_result, routes))
    }

    /// Step 1, addresses from IPAM, each with a gateway.
    fn addresses(&mut self) -> Result<CniResult> {
        let ipam_result = ipam::add(self.conf, self.env, self.stdin)?;
        self.undo.push(Undo::Ipam);
        crate::faults::point("ipam")?;
        if ipam_result.ips.is_empty() {
            return Err(Error::Ipam("the IPAM returned no address".into()));
        }
        for ip in &ipam_result.ips {
            if ip.gateway.is_none() {
                return Err(Error::Ipam(format!(
                    "address {} has no gateway; cni-ebpf routes pod traffic through the gateway",
                    ip.address
                )));
            }
        }
        Ok(ipam_result)
    }

    /// Step 2, the device pair (veth or netkit, as `interface` says), container end
    /// created directly in the pod's namespace. Returns the host end's ifindex.
    async fn veth(&mut self) -> Result<u32> {
        let fault = crate::faults::point;
        // While the pair is unlabelled, a shared hold on the network's veth lock tells GC
        // that its ADD is alive (`unlabelled_veths`); the creating request marks it with the
        // network's group, which labelling clears.
        let in_flight = super::unlabelled_veths::InFlight::enter(self.conf)?;
        let veth = link::NewVeth {
            host: self.host_ifname,
            host_mac: self.host_mac,
            peer: &self.env.ifname,
            peer_mac: self.ctr_mac,
            mtu: self.dp.pod_mtu(),
            group: link::unlabelled_group(&self.conf.name),
        };
        self.netkit = match self.conf.interface {
            InterfaceKind::Veth => {
                self.node.create_veth(&veth, self.netns).await?;
                false
            }
            InterfaceKind::Netkit => {
                if !self.node.create_netkit(&veth, self.netns).await? {
                    return Err(Error::config(
                        "interface",
                        "\"netkit\": this kernel has no netkit devices (Linux 6.7 or later, \
                         built with CONFIG_NETKIT); use \"veth\" or \"auto\"",
                    ));
                }
                true
            }
            InterfaceKind::Auto => {
                let netkit = self.node.create_netkit(&veth, self.netns).await?;
                if !netkit {
                    self.node.create_veth(&veth, self.netns).await?;
                }
                netkit
            }
        };
        let host = self
            .node
            .link_by_name(self.host_ifname)
            .await?
            .ok_or_else(|| {
                Error::netlink(
                    "reading back the host veth",
                    format!("{} vanished", self.host_ifname),
                )
            })?;
        self.undo.push(Undo::HostLink(host.index));
        fault("veth")?;
        self.node
            .label_host_veth(
                host.index,
                &link::host_veth_alias(&self.conf.name, &self.env.container_id, &self.env.ifname),
            )
            .await?;
        drop(in_flight);
        fault("veth-labelled")?;
        Ok(host.index)
    }

    /// Step 3, node side: the host end owns each gateway address; a host route per pod
    /// address.
    async fn node_side(&mut self, ipam_result: &CniResult, host_index: u32) -> Result<()> {
        let host_ifname = self.host_ifname;
        let has_v6 = ipam_result.ips.iter().any(|ip| ip.address.addr().is_ipv6());
        // (IPv4 forwarding is enabled by `Datapath::open_or_load`.)
        if has_v6 {
            link::write_sysctl("net.ipv6.conf.all.forwarding", "1")?;
        }
        if std::path::Path::new(&format!("/proc/sys/net/ipv6/conf/{host_ifname}")).exists() {
            if has_v6 {
                // The host end must not autoconfigure from router advertisements of the
                // pod, and its link-local address must be usable at once: while it is in
                // DAD the kernel sends no neighbour solicitation for forwarded IPv6
                // packets, so a new pod would be unreachable over IPv6 for a second or two.
                link::write_sysctl(&format!("net.ipv6.conf.{host_ifname}.accept_ra"), "0")?;
                link::write_sysctl(&format!("net.ipv6.conf.{host_ifname}.accept_dad"), "0")?;
                // The link-local the node solicits from, there before the carrier is (see
                // `ndp`).
                let ll = crate::kernel::ndp::link_local_net(self.host_mac);
                self.node.add_address(host_index, ll, true).await?;
            } else {
                // A pod without an IPv6 address has no use for IPv6 on its host end. Off
                // before the end is up, the node gets no link-local address, no IPv6 route
                // and no multicast membership for it. With IPv6 on, every host end added
                // its routes to the node's IPv6 tables, which the kernel walks under the
                // rtnl lock whenever a device goes up, down or away: each ADD and DEL grew
                // slower with the pod count (`docs/benchmarks.md`).
                link::write_sysctl(&format!("net.ipv6.conf.{host_ifname}.disable_ipv6"), "1")?;
            }
        }
        let mut node_addrs = Vec::new();
        for ip in &ipam_result.ips {
            if let Some(gw) = ip.gateway {
                self.node
                    .add_address(host_index, IpNet::from(gw), true)
                    .await?;
                node_addrs.push((gw, host_index));
            }
        }
        // In the tunnel modes the tunnel device owns the gateways too: they are then the
        // source the node's own traffic to other nodes' pods leaves with, so the replies
        // come back through the tunnel (an uplink address as source would have them sent
        // back over the underlay, a path the other node never routed from).
        if let Some(tunnel) = self.dp.tunnel_ifindex() {
            for (gw, _) in &node_addrs {
                self.node
                    .add_address(tunnel, IpNet::from(*gw), true)
                    .await?;
            }
        }
        // The gateway is now a node address (host ports are reachable on it, and traffic
        // to it is never masqueraded).
        self.dp.add_node_addrs(&node_addrs)?;
        self.node.set_up(host_index).await?;
        for ip in &ipam_result.ips {
            self.node
                .add_route(&link_route(IpNet::from(ip.address.addr()), host_index))
                .await?;
        }
        Ok(())
    }

    /// Step 4, container side: host-route-only addresses, the gateway on-link (and in the
    /// neighbour table: it is the host veth, whose MAC is ours), routes via it. Returns the
    /// routes installed, as the Result reports them, and the interface's index.
    async fn container_side(&mut self, ipam_result: &CniResult) -> Result<(Vec<Route>, u32)> {
        let ifname = &self.env.ifname;
        let ctr_link = self.ctr.link_by_name(ifname).await?.ok_or_else(|| {
            Error::netlink(
                "reading back the container interface",
                format!("{ifname} vanished"),
            )
        })?;
        for ip in &ipam_result.ips {
            self.ctr
                .add_address(ctr_link.index, IpNet::from(ip.address.addr()), true)
                .await?;
        }
        self.ctr.set_up(ctr_link.index).await?;
        let routes = container_routes(ipam_result);
        for ip in &ipam_result.ips {
            if let Some(gw) = ip.gateway {
                self.ctr
                    .add_route(&link_route(IpNet::from(gw), ctr_link.index))
                    .await?;
                self.ctr
                    .add_permanent_neighbour(ctr_link.index, gw, self.host_mac)
                    .await?;
            }
        }
        // Every field the Result reports is applied: a route is never echoed with a
        // `table`, `scope` or `advmss` the kernel was not given.
        for r in &routes {
            self.ctr
                .add_route(&route_to_install(r, ctr_link.index)?)
                .await?;
        }
        Ok((routes, ctr_link.index))
    }

    /// Step 5, datapath: program on the host veth, endpoint entries, host ports.
    fn datapath(&mut self, ipam_result: &CniResult, host_index: u32) -> Result<()> {
        let (env, conf) = (self.env, self.conf);
        let pod_ips: Vec<IpAddr> = ipam_result.ips.iter().map(|ip| ip.address.addr()).collect();
        let ep = Endpoint {
            container_id: env.container_id.clone(),
            ifname: env.ifname.clone(),
            host_ifindex: host_index,
            host_ifname: self.host_ifname.to_owned(),
            host_mac: self.host_mac,
            pod_mac: self.ctr_mac,
            ips: pod_ips.clone(),
            allowed_sources: conf.allowed_sources.clone(),
            nat_flows: conf.nat_flows_per_pod,
            egress_rate: conf.egress_rate,
            host_ports: !conf.runtime_config.port_mappings.is_empty(),
            netkit: self.netkit,
            pod: PodRef::from_args(&env.args),
        };
        self.undo.push(Undo::Endpoint {
            host_ifname: self.host_ifname.to_owned(),
            ips: pod_ips.clone(),
        });
        self.dp.attach_endpoint(&ep)?;
        self.dp.record_pod_netns(self.pod_netns, host_index)?;
        crate::faults::point("datapath")?;
        if conf.runtime_config.port_mappings.is_empty() {
            return Ok(());
        }
        self.undo.push(Undo::PortMappings);
        self.dp.add_port_mappings(
            (&env.container_id, &env.ifname),
            &pod_ips,
            &conf.runtime_config.port_mappings,
        )
    }

    /// Step 6, the result: our two interfaces, the addresses and routes, after
    /// `prevResult`'s.
    fn result(&self, ipam_result: &CniResult, routes: Vec<Route>) -> Value {
        let (env, conf) = (self.env, self.conf);
        let mut result = CniResult {
            interfaces: vec![
                Interface {
                    name: self.host_ifname.to_owned(),
                    mac: Some(format_mac(&self.host_mac)),
                    mtu: Some(self.dp.pod_mtu()),
                    ..Interface::default()
                },
                Interface {
                    name: env.ifname.clone(),
                    mac: Some(format_mac(&self.ctr_mac)),
                    mtu: Some(self.dp.pod_mtu()),
                    sandbox: Some(self.netns.path().display().to_string()),
                    ..Interface::default()
                },
            ],
            ips: ipam_result
                .ips
                .iter()
                .map(|ip| IpConfig {
                    address: IpNet::from(ip.address.addr()),
                    gateway: ip.gateway,
                    interface: Some(1),
                })
                .collect(),
            routes,
            dns: if ipam_result.dns.is_empty() {
                conf.dns.clone()
            } else {
                ipam_result.dns.clone()
            },
        };
        if let Some(prev) = &conf.prev_result {
            result = merge_prev(prev, result);
        }
        result.to_json(conf.version)
    }

    /// Undoes the steps done, in reverse; logs (and goes past) an undo that fails.
    async fn rollback(&mut self) {
        let (env, conf, dp) = (self.env, self.conf, self.dp);
        for step in std::mem::take(&mut self.undo).into_iter().rev() {
            let res = match step {
                Undo::PortMappings => dp.remove_port_mappings((&env.container_id, &env.ifname)),
                Undo::Endpoint { host_ifname, ips } => {
                    dp.detach_endpoint(&env.container_id, &env.ifname, &host_ifname, &ips)
                }
                // Deleting the host end takes the container end, and every address and
                // route on either, with it.
                Undo::HostLink(index) => self.node.del_link(index).await,
                Undo::Ipam => ipam::del(conf, env, self.stdin).map(|_| ()),
            };
            if let Err(e) = res {
                tracing::error!(container = %env.container_id, "rollback step failed: {e}");
            }
        }
    }
}

/// A scope-link route to `dst` through `oif` (a pod address on the node, the gateway in
/// the pod).
fn link_route(dst: IpNet, oif: u32) -> NewRoute {
    NewRoute {
        dst,
        gw: None,
        oif,
        scope: Some(link::RT_SCOPE_LINK),
        priority: None,
        mtu: None,
        advmss: None,
        table: None,
    }
}

/// The netlink route for a Result route, with every field it carries. A `scope` beyond
/// the kernel's 8 bits is refused (it could only be installed as some other scope).
fn route_to_install(r: &Route, oif: u32) -> Result<NewRoute> {
    let scope = r
        .scope
        .map(|v| {
            u8::try_from(v).map_err(|_| {
                Error::config(
                    "ipam.routes",
                    format!(
                        "the route to {} has scope {v}; a route scope is 0-255",
                        r.dst
                    ),
                )
            })
        })
        .transpose()?;
    Ok(NewRoute {
        dst: r.dst,
        gw: r.gw,
        oif,
        scope,
        priority: r.priority,
        mtu: r.mtu,
        advmss: r.advmss,
        table: r.table,
    })
}

/// The routes installed in the container: IPAM's `routes` with the gateway of their family
/// filled in, or a default route per family when IPAM lists none.
fn container_routes(ipam: &CniResult) -> Vec<Route> {
    let gw_of = |v6: bool| {
        ipam.ips
            .iter()
            .find(|ip| ip.address.addr().is_ipv6() == v6)
            .and_then(|ip| ip.gateway)
    };
    if ipam.routes.is_empty() {
        return ipam
            .ips
            .iter()
            .filter_map(|ip| {
                let dst = if ip.address.addr().is_ipv6() {
                    IpNet::new(IpAddr::V6(0.into()), 0).ok()?
                } else {
                    IpNet::new(IpAddr::V4(0.into()), 0).ok()?
                };
                Some(Route::new(dst, ip.gateway))
            })
            .collect();
    }
    ipam.routes
        .iter()
        .filter_map(|r| {
            let gw = r.gw.or_else(|| gw_of(r.dst.addr().is_ipv6()))?;
            Some(Route {
                gw: Some(gw),
                ..r.clone()
            })
        })
        .collect()
}

/// Appends our result to a `prevResult` (we are not the first plugin of the chain).
fn merge_prev(prev: &CniResult, ours: CniResult) -> CniResult {
    let offset = prev.interfaces.len();
    let mut out = prev.clone();
    out.interfaces.extend(ours.interfaces);
    out.ips.extend(ours.ips.into_iter().map(|mut ip| {
        ip.interface = ip.interface.map(|i| i + offset);
        ip
    }));
    out.routes.extend(ours.routes);
    if out.dns.is_empty() {
        out.dns = ours.dns;
    }
    out
}
