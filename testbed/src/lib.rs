//! The test support of cni-ebpf: the eBPF packet tests' fixture (tier 2 of
//! docs/testing.md) and the end-to-end harness (tiers 3 and 4).
//!
//! - [`packet`]: the real eBPF object loaded into a private bpffs and network namespace,
//!   programs run through `BPF_PROG_TEST_RUN` on crafted frames, maps read back.
//! - [`datapath`]: what the end-to-end tests of the datapath share: the masquerading
//!   configuration, verbs at spec 1.1.0, map dumps, and traffic tools (a tagged TCP
//!   server, UDP exchanges, an ICMP sniffer, many-connection clients).
//! - [`SimNode`]: the simulated node — `node` and `ext` network namespaces
//!   joined by a veth, per-test pin root, data dir, log file; [`SimNode::pod`] makes pod
//!   namespaces. Everything is removed on drop, also when a test panics.
//! - [`Cluster`]: two simulated nodes (`node-a`, `node-b`) joined by a `fabric` bridge,
//!   with `ext` as the outside world and default gateway of both, and static routes to
//!   each other's pod CIDR.
//! - [`ApiServer`]: a stand-in Kubernetes API server (HTTPS, bearer token, Node objects)
//!   inside a namespace the test made, for `install`'s Node lookup and host-gw.
//! - [`kubeproxy`]: kube-proxy's rules (iptables and nftables mode), rendered as
//!   kube-proxy writes them and loaded into a node namespace; [`service_objects`]: the
//!   same Services as API objects (Service, EndpointSlice), for the kube-proxy
//!   replacement.
//! - [`TestCgroup`]: a cgroup-v2 directory of the test's own, for clients of the
//!   plugin's socket-level hook (run as processes inside it).
//! - [`SimNode::exec_plugin`]: runs the plugin binary the way a runtime does, inside the
//!   node namespace; [`SimNode::libcni`]: runs a conflist through the real libcni
//!   (`testbed/libcni-client`, Go), with the reference plugins of `/usr/lib/cni` on
//!   `CNI_PATH`.
//! - [`ConfBuilder`]: network configurations and conflists per `cniVersion`.
//! - [`containerd`]: Debian's containerd (CRI plugin) in a node namespace with its state in
//!   a temp dir and offline-built busybox images, driven through the CRI v1 API and `ctr`.
//! - [`Snapshot`]: links/addresses/routes of a namespace, for leak checks.
//! - [`process`]: bounded command execution inside a namespace, `ip -j`.
//! - [`net`]: ping, TCP/UDP requests and a "who am I" server, spoken natively (the
//!   machines have no `ping`/`nc`/`socat`).
//! - [`dns`]: an authoritative DNS server in a pod, the cluster DNS of the simulated
//!   cluster.
//!
//! The tests that need root are `#[ignore = "privileged: run via cargo xtask test"]`;
//! `cargo xtask test` runs them with `--ignored` after building the plugin and pointing
//! `CNI_EBPF_BIN` at it. Nothing here touches the machine's own network namespace.
#![expect(
    clippy::panic,
    reason = "test harness: failures panic with a message, the test framework's protocol"
)]

pub mod apiserver;
pub mod browser;
pub mod capture;
pub mod cgroup;
pub mod cluster;
pub mod conf;
#[cfg(feature = "cri")]
pub mod containerd;
pub mod datapath;
pub mod dns;
pub mod inspect;
pub mod kubeproxy;
pub mod libcni;
pub mod net;
pub mod netns;
pub mod netpol;
pub mod node;
pub mod packet;
pub mod plugin;
pub mod process;
pub mod servers;
pub mod service_objects;
pub mod snapshot;
pub mod testdir;
pub mod tls;

pub use apiserver::ApiServer;
pub use cgroup::TestCgroup;
pub use cluster::{Cluster, ClusterNode};
pub use conf::{ConfBuilder, ALL_VERSIONS, LIBCNI_VERSIONS, POD_SUBNET_V4, POD_SUBNET_V6};
#[cfg(feature = "cri")]
pub use containerd::{Containerd, PodSpec};
pub use inspect::{ResultView, StoreView};
pub use libcni::{ClientFailure, ClientOutput};
pub use net::{assert_no_ping, assert_ping, ping, tcp_request, udp_request};
pub use netns::{CommandFailed, NetNs};
pub use node::{
    wire_uplink, NodeNamespaces, Pod, SimNode, EXT_IP4, EXT_IP6, NODE_IP4, NODE_IP6, UPLINK,
};
pub use plugin::{fault_bin, plugin_bin, CniEnv, CniError, PluginOutput, FAULT_BIN_ENV};
pub use process::{ip_json, netns_exec, netns_exec_ok, Background, Output};
pub use servers::{EchoServer, Serving, WhoAmIServer};
pub use snapshot::Snapshot;
