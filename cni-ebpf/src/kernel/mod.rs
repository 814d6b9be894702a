//! Kernel plumbing over netlink and the namespace syscalls, with no knowledge of the
//! datapath's maps or of CNI: [`netns`] (entering and creating network namespaces),
//! [`link`] (veth pairs, addresses, routes, interface names), [`tc`] (clsact qdiscs and
//! tc filters), [`ndp`] (IPv6 neighbour discovery on a pod's interface), [`wireguard`] (WireGuard
//! devices' keys and peers), [`conntrack`] (where netfilter sent a connection it
//! translated). [`tc`], [`wireguard`] and [`conntrack`] send their requests through
//! [`netlink`].

pub mod conntrack;
pub mod link;
pub mod ndp;
pub mod netlink;
pub mod netns;
pub mod tc;
pub mod wireguard;
