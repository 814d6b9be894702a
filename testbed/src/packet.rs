//! The fixture of the eBPF packet tests (`cni-ebpf/tests/packet`, test tier 2): a
//! throwaway bpffs with the datapath loaded into it, `BPF_PROG_TEST_RUN` through aya,
//! IPv4 packet builders and an independent checksum check.
//!
//! Nothing here touches a network namespace: test runs are synthetic, and the bpffs is a
//! fresh instance mounted on a temporary directory and unmounted on drop (also when the
//! test panics).

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests"
)]

use std::net::Ipv4Addr;

use aya::{TestRun as _, TestRunOptions};
use cni_ebpf::datapath::{
    load::{self, Faults},
    Datapath, Endpoint, NodeConfigSpec, Pins,
};

/// `TC_ACT_OK`.
pub const OK: u32 = 0;
/// `TC_ACT_SHOT`.
pub const SHOT: u32 = 2;
/// `TC_ACT_REDIRECT`.
pub const REDIRECT: u32 = 7;
/// `TC_ACT_UNSPEC` (-1): passed unchanged to the next program / the stack.
pub const PASS: u32 = u32::MAX;

pub const NODE: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
pub const NODE2: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 3);
pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 1);
pub const EXT: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 100);
pub const POD_A: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 2);
pub const POD_B: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 3);
pub const REMOTE_POD: Ipv4Addr = Ipv4Addr::new(10, 244, 2, 5);
pub const SNAT_PORTS: (u16, u16) = (61000, 65535);

pub const HOST_MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0xa, 1];
pub const POD_MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0xa, 2];
pub const HOST_MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0xb, 1];
pub const POD_MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0xb, 2];
pub const UPLINK_MAC: [u8; 6] = [0x02, 0, 0, 0, 0xe, 1];
pub const EXT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0xe, 2];
/// Pod A's and pod B's host veths: a veth pair in the fixture's private network
/// namespace (after `lo`, ifindex 1), so `from_pod` runs see each pod's packets arriving
/// on its own veth (`BPF_PROG_TEST_RUN` takes the device from `__sk_buff.ifindex`).
pub const IFINDEX_A: u32 = 2;
pub const IFINDEX_B: u32 = 3;

pub const TCP: u8 = 6;
pub const UDP: u8 = 17;
pub const ICMP: u8 = 1;
pub const SYN: u8 = 0x02;
pub const ACK: u8 = 0x10;

/// The `struct __sk_buff` `BPF_PROG_TEST_RUN` takes and gives back: its size and the
/// offsets of the fields the tests set or read.
const SKB_LEN: usize = 192;
const SKB_MARK: usize = 8;
const SKB_IFINDEX: usize = 40;
const SKB_TSTAMP: usize = 152;

/// What one `BPF_PROG_TEST_RUN` gave back.
struct TestRun {
    verdict: u32,
    /// The packet as it left.
    out: Vec<u8>,
    /// The `struct __sk_buff` after the run (zero without an `ifindex`).
    skb: [u8; SKB_LEN],
    /// The kernel's average time per run.
    ns_per_run: u32,
}

/// A datapath loaded into a private bpffs instance.
pub struct Fixture {
    pub dp: Option<Datapath>,
    mnt: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Fixture {
    /// Moves the calling test thread into a network namespace of its own holding the two
    /// pods' host veths (a veth pair at `IFINDEX_A`/`IFINDEX_B`): test runs and the programs'
    /// FIB lookups never see the machine's own devices or routes. Mounts a fresh bpffs and
    /// loads the programs into `<mnt>/net`.
    #[expect(
        clippy::new_without_default,
        reason = "making one moves the thread into a new namespace: not a default value"
    )]
    pub fn new() -> Self {
        Self::with_faults(Faults::default())
    }

    /// [`Self::new`] with the programs loaded with test-only `faults` (the same object the
    /// plugin loads, with a global set at load time).
    pub fn with_faults(faults: Faults) -> Self {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
            .unwrap_or_else(|e| panic!("unshare(CLONE_NEWNET) (needs root): {e}"));
        // One veth pair: the kernel registers the peer (veth-a) first.
        // Children inherit the calling thread's network namespace.
        let ok = std::process::Command::new("ip")
            .args([
                "link", "add", "veth-b", "type", "veth", "peer", "name", "veth-a",
            ])
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            ok,
            "creating the pods' host veths in the fixture's namespace"
        );
        for (name, want) in [("veth-a", IFINDEX_A), ("veth-b", IFINDEX_B)] {
            let cname = std::ffi::CString::new(name).unwrap();
            // SAFETY: a valid NUL-terminated name; the call only reads it.
            let idx = unsafe { libc::if_nametoindex(cname.as_ptr()) };
            assert_eq!(
                idx, want,
                "{name} must be ifindex {want} in a fresh namespace"
            );
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let mnt = dir.path().join("bpffs");
        std::fs::create_dir(&mnt).expect("mkdir bpffs");
        nix::mount::mount(
            Some("bpf"),
            &mnt,
            Some("bpf"),
            nix::mount::MsFlags::empty(),
            Some("mode=0700"),
        )
        .unwrap_or_else(|e| panic!("mounting a bpffs on {} (needs root): {e}", mnt.display()));
        let mut fx = Self {
            dp: None,
            mnt: mnt.clone(),
            _dir: dir,
        };
        if faults != Faults::default() {
            // Pinned here with the faults; `load_at` then finds them and only opens them.
            load::load_and_pin_with(&Pins::new(mnt.join("net")), faults)
                .unwrap_or_else(|e| panic!("loading the datapath with {faults:?}: {e}"));
        }
        let dp = Datapath::load_at(mnt.join("net"))
            .unwrap_or_else(|e| panic!("loading the datapath: {e}"));
        fx.dp = Some(dp);
        fx
    }

    /// A fixture with [`Self::standard_node`] (masquerade on) and [`Self::two_pods`].
    pub fn with_two_pods() -> Self {
        let fx = Self::new();
        fx.standard_node(true);
        fx.two_pods();
        fx
    }

    /// The network directory in the private bpffs.
    pub fn network_dir(&self) -> std::path::PathBuf {
        self.mnt.join("net")
    }

    pub fn dp(&self) -> &Datapath {
        self.dp.as_ref().expect("datapath")
    }

    /// Node config: node address NODE, masquerade on, cluster 10.244.0.0/16.
    pub fn standard_node(&self, masq: bool) {
        self.configure_node(&standard_settings(masq));
        self.standard_node_addrs();
    }

    /// The node addresses of [`Self::standard_node`]: NODE, NODE2 and the pods' gateway.
    pub fn standard_node_addrs(&self) {
        self.dp()
            .set_node_addrs(
                &[
                    (NODE.into(), 2),
                    (NODE2.into(), 2),
                    (GATEWAY.into(), IFINDEX_A),
                    (GATEWAY.into(), IFINDEX_B),
                ],
                2,
            )
            .unwrap_or_else(|e| panic!("set_node_addrs: {e}"));
    }

    /// Writes node config `s`.
    pub fn configure_node(&self, s: &NodeConfigSpec) {
        self.dp()
            .configure_node(s)
            .unwrap_or_else(|e| panic!("configure_node: {e}"));
    }

    /// Endpoint entries for pods A and B (no attachment).
    pub fn two_pods(&self) {
        for ep in [endpoint_a(), endpoint_b()] {
            self.dp()
                .put_endpoint_entries(&ep)
                .unwrap_or_else(|e| panic!("put_endpoint_entries {}: {e}", ep.container_id));
        }
    }

    /// Runs `prog` on `pkt`; returns the verdict and the packet as the program left it.
    /// `from_pod` runs on the sender's host veth: pod B's for pod B's source address,
    /// else pod A's (a test of foreign sources names the device with [`Self::run_on`]).
    pub fn run(&self, prog: &str, pkt: &[u8]) -> (u32, Vec<u8>) {
        let ifindex = if prog != "from_pod" {
            None
        } else if pkt.len() >= 30 && pkt[26..30] == POD_B.octets() {
            Some(IFINDEX_B)
        } else {
            Some(IFINDEX_A)
        };
        self.run_with(prog, ifindex, pkt)
    }

    /// [`Self::run`] with the packet arriving on device `ifindex`.
    pub fn run_on(&self, prog: &str, ifindex: u32, pkt: &[u8]) -> (u32, Vec<u8>) {
        self.run_with(prog, Some(ifindex), pkt)
    }

    fn run_with(&self, prog: &str, ifindex: Option<u32>, pkt: &[u8]) -> (u32, Vec<u8>) {
        let (v, out, _) = self.run_ctx(prog, ifindex, pkt);
        (v, out)
    }

    /// [`Self::run_on`], also returning the `skb->tstamp` the program left.
    pub fn run_tstamp(&self, prog: &str, ifindex: u32, pkt: &[u8]) -> (u32, u64) {
        let (v, _, ctx) = self.run_ctx(prog, Some(ifindex), pkt);
        let mut ts = [0u8; 8];
        ts.copy_from_slice(&ctx[SKB_TSTAMP..SKB_TSTAMP + 8]);
        (v, u64::from_ne_bytes(ts))
    }

    /// Runs `prog` on `pkt` arriving on `ifindex`, `repeat` times in the kernel, and
    /// returns the verdict and the kernel's average time per run (`BPF_PROG_TEST_RUN`'s
    /// `duration`, ns).
    pub fn run_timed(&self, prog: &str, ifindex: u32, pkt: &[u8], repeat: u32) -> (u32, u32) {
        let run = self.test_run(prog, Some(ifindex), pkt, repeat);
        (run.verdict, run.ns_per_run)
    }

    /// [`Self::run_on`] with `skb->mark` = `mark` going in: the verdict, the packet as it
    /// left and the `skb->mark` the program left.
    pub fn run_marked(
        &self,
        prog: &str,
        ifindex: u32,
        pkt: &[u8],
        mark: u32,
    ) -> (u32, Vec<u8>, u32) {
        let run = self.test_run_with_mark(prog, Some(ifindex), pkt, 0, mark);
        let mut m = [0u8; 4];
        m.copy_from_slice(&run.skb[SKB_MARK..SKB_MARK + 4]);
        (run.verdict, run.out, u32::from_ne_bytes(m))
    }

    /// Runs `prog` on `pkt` (arriving on `ifindex` when given) and returns the verdict,
    /// the packet as it left and the `struct __sk_buff` the kernel copied back.
    fn run_ctx(
        &self,
        prog: &str,
        ifindex: Option<u32>,
        pkt: &[u8],
    ) -> (u32, Vec<u8>, [u8; SKB_LEN]) {
        let run = self.test_run(prog, ifindex, pkt, 0);
        (run.verdict, run.out, run.skb)
    }

    /// One `BPF_PROG_TEST_RUN` of `prog` on `pkt`, `repeat` times (0: once). With
    /// `ifindex`, the packet arrives on that interface (a `struct __sk_buff` with only
    /// `ifindex` set goes in, and the kernel's copy comes back); without, no context.
    fn test_run(&self, prog: &str, ifindex: Option<u32>, pkt: &[u8], repeat: u32) -> TestRun {
        self.test_run_with_mark(prog, ifindex, pkt, repeat, 0)
    }

    /// [`Self::test_run`] with `skb->mark` = `mark` in the context (with `ifindex` only).
    fn test_run_with_mark(
        &self,
        prog: &str,
        ifindex: Option<u32>,
        pkt: &[u8],
        repeat: u32,
        mark: u32,
    ) -> TestRun {
        let program = self
            .dp()
            .program(prog)
            .unwrap_or_else(|e| panic!("opening {prog}: {e}"));
        let mut out = vec![0u8; pkt.len() + 512];
        let mut ctx = [0u8; SKB_LEN];
        if let Some(i) = ifindex {
            ctx[SKB_IFINDEX..SKB_IFINDEX + 4].copy_from_slice(&i.to_ne_bytes());
            ctx[SKB_MARK..SKB_MARK + 4].copy_from_slice(&mark.to_ne_bytes());
        }
        let mut skb = [0u8; SKB_LEN];
        let res = program
            .test_run(TestRunOptions {
                data_in: Some(pkt),
                data_out: Some(&mut out),
                ctx_in: ifindex.map(|_| &ctx[..]),
                ctx_out: ifindex.map(|_| &mut skb[..]),
                repeat,
                ..TestRunOptions::default()
            })
            .unwrap_or_else(|e| {
                let src = std::error::Error::source(&e)
                    .map(ToString::to_string)
                    .unwrap_or_default();
                panic!(
                    "BPF_PROG_TEST_RUN of {prog} on {} bytes: {e}: {src}",
                    pkt.len()
                )
            });
        out.truncate(res.data_size_out as usize);
        TestRun {
            verdict: res.return_value,
            out,
            skb,
            ns_per_run: res.duration.as_nanos() as u32,
        }
    }

    /// Asserts the outcome of case `i` of a rewrite-failure test: dropped, counted as the
    /// `i + 1`-th `drop_rewrite_failed`, and no NAT entry left (the packet's own or any).
    pub fn assert_rewrite_failed(&self, i: usize, what: &str, verdict: u32, pkt: &[u8]) {
        assert_eq!(
            verdict, SHOT,
            "case {i} ({what}): a packet whose rewrite failed must be dropped"
        );
        assert_eq!(
            self.reason(cni_ebpf_common::Reason::DropRewriteFailed),
            i as u64 + 1,
            "case {i}: counted as drop_rewrite_failed"
        );
        assert!(
            self.nat(&flow_key(pkt)).is_none(),
            "case {i}: the packet's own NAT entry must be removed"
        );
        let left = self.dp().nat_entries().unwrap();
        assert!(
            left.is_empty(),
            "case {i}: NAT entries left behind: {left:?}"
        );
    }

    /// Runs `prog` and asserts it passed the packet unchanged.
    pub fn assert_passes_unchanged(&self, prog: &str, pkt: &[u8], what: &str) {
        let (v, out) = self.run(prog, pkt);
        assert_eq!(
            v, PASS,
            "{prog}: {what}: verdict {v:#x}, expected pass (-1)"
        );
        assert_eq!(out, pkt, "{prog}: {what}: the packet was modified");
    }

    /// A pod's packet leaving through the uplink as the pod sent it: records the flow as
    /// pending the way `from_pod` does when it hands a packet to the stack, then runs
    /// `uplink_egress`.
    pub fn egress(&self, pkt: &[u8]) -> (u32, Vec<u8>) {
        self.set_flow(&flow_key(pkt), cni_ebpf_common::FlowFlags::PENDING);
        self.run("uplink_egress", pkt)
    }

    /// Gives pod `pod` (container `ctr`, interface eth0) the host ports `maps`.
    pub fn add_ports(
        &self,
        ctr: &str,
        pod: impl Into<std::net::IpAddr>,
        maps: &[cni_ebpf::cni::config::PortMapping],
    ) {
        self.dp()
            .add_port_mappings((ctr, "eth0"), &[pod.into()], maps)
            .unwrap_or_else(|e| panic!("add_port_mappings: {e}"));
    }

    /// The `FLOWS` entry of `key` (`None`: no entry).
    pub fn flow(&self, key: &cni_ebpf_common::NatKey) -> Option<cni_ebpf_common::FlowFlags> {
        let map = self.map("FLOWS");
        let flows: aya::maps::HashMap<_, cni_ebpf_common::NatKey, cni_ebpf_common::FlowEntry> =
            aya::maps::HashMap::try_from(&map).unwrap();
        flows.get(key, 0).ok().map(|e| e.flags)
    }

    /// Writes the `FLOWS` entry of `key`.
    pub fn set_flow(&self, key: &cni_ebpf_common::NatKey, flags: cni_ebpf_common::FlowFlags) {
        let mut map = self.map("FLOWS");
        let mut flows: aya::maps::HashMap<_, cni_ebpf_common::NatKey, cni_ebpf_common::FlowEntry> =
            aya::maps::HashMap::try_from(&mut map).unwrap();
        let e = cni_ebpf_common::FlowEntry {
            flags,
            ..Default::default()
        };
        flows.insert(key, e, 0).unwrap();
    }

    /// The `NAT` entry of `key` (`None`: no entry).
    pub fn nat(&self, key: &cni_ebpf_common::NatKey) -> Option<cni_ebpf_common::NatEntry> {
        let map = self.map("NAT");
        let nat: aya::maps::HashMap<_, cni_ebpf_common::NatKey, cni_ebpf_common::NatEntry> =
            aya::maps::HashMap::try_from(&map).unwrap();
        nat.get(key, 0).ok()
    }

    /// Writes the `NAT` entry of `key`.
    pub fn set_nat(&self, key: &cni_ebpf_common::NatKey, e: cni_ebpf_common::NatEntry) {
        let mut map = self.map("NAT");
        let mut nat: aya::maps::HashMap<_, cni_ebpf_common::NatKey, cni_ebpf_common::NatEntry> =
            aya::maps::HashMap::try_from(&mut map).unwrap();
        nat.insert(key, e, 0).unwrap();
    }

    /// One map of the loaded datapath, opened from its pin.
    /// Writes pod `ifindex`'s `PACING` entry as given (a mode or limit the node would not
    /// choose itself).
    pub fn put_pacing(&self, ifindex: u32, entry: cni_ebpf_common::Pacing) {
        let mut map = self.map("PACING");
        let mut pacing: aya::maps::HashMap<_, u32, cni_ebpf_common::Pacing> =
            aya::maps::HashMap::try_from(&mut map).unwrap();
        pacing.insert(ifindex, entry, 0).unwrap();
    }

    pub fn map(&self, name: &str) -> aya::maps::Map {
        let pin = self
            .network_dir()
            .join(format!("v{}", cni_ebpf_common::LAYOUT_VERSION))
            .join("maps")
            .join(name);
        let data = aya::maps::MapData::from_pin(&pin)
            .unwrap_or_else(|e| panic!("opening map pin {}: {e}", pin.display()));
        aya::maps::Map::LruHashMap(data)
    }

    pub fn reason(&self, r: cni_ebpf_common::Reason) -> u64 {
        self.dp()
            .reason_count(r)
            .unwrap_or_else(|e| panic!("reasons: {e}"))
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // Close every fd into the bpffs, then detach the mount; the tempdir goes after.
        self.dp = None;
        let _ = nix::mount::umount2(&self.mnt, nix::mount::MntFlags::MNT_DETACH);
    }
}

// ------------------------------------------------------------------- checksums

/// RFC 1071 Internet checksum, written independently of the kernel's helpers.
pub fn inet_csum(chunks: &[&[u8]]) -> u16 {
    let mut sum: u32 = 0;
    let mut odd: Option<u8> = None;
    for chunk in chunks {
        for &b in *chunk {
            match odd.take() {
                None => odd = Some(b),
                Some(hi) => sum += u32::from(u16::from_be_bytes([hi, b])),
            }
        }
    }
    if let Some(hi) = odd {
        sum += u32::from(u16::from_be_bytes([hi, 0]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn pseudo(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, len: usize) -> Vec<u8> {
    let mut p = Vec::with_capacity(12);
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    p.push(0);
    p.push(proto);
    p.extend_from_slice(&(len as u16).to_be_bytes());
    p
}

// ------------------------------------------------------------------- builders

pub fn eth(dst: [u8; 6], src: [u8; 6], ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

pub fn ipv4(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, ttl: u8, payload: &[u8]) -> Vec<u8> {
    let mut h = vec![0u8; 20];
    h[0] = 0x45;
    h[2..4].copy_from_slice(&((20 + payload.len()) as u16).to_be_bytes());
    h[4..6].copy_from_slice(&0x1234u16.to_be_bytes());
    h[6] = 0x40; // DF
    h[8] = ttl;
    h[9] = proto;
    h[12..16].copy_from_slice(&src.octets());
    h[16..20].copy_from_slice(&dst.octets());
    let c = inet_csum(&[&h]);
    h[10..12].copy_from_slice(&c.to_be_bytes());
    h.extend_from_slice(payload);
    h
}

pub fn tcp(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    sport: u16,
    dport: u16,
    flags: u8,
    data: &[u8],
) -> Vec<u8> {
    let mut s = vec![0u8; 20];
    s[0..2].copy_from_slice(&sport.to_be_bytes());
    s[2..4].copy_from_slice(&dport.to_be_bytes());
    s[4..8].copy_from_slice(&1000u32.to_be_bytes());
    s[12] = 5 << 4;
    s[13] = flags;
    s[14..16].copy_from_slice(&65535u16.to_be_bytes());
    s.extend_from_slice(data);
    let c = inet_csum(&[&pseudo(src, dst, TCP, s.len()), &s]);
    s[16..18].copy_from_slice(&c.to_be_bytes());
    s
}

pub fn udp(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    sport: u16,
    dport: u16,
    data: &[u8],
    with_csum: bool,
) -> Vec<u8> {
    let mut s = vec![0u8; 8];
    s[0..2].copy_from_slice(&sport.to_be_bytes());
    s[2..4].copy_from_slice(&dport.to_be_bytes());
    s[4..6].copy_from_slice(&((8 + data.len()) as u16).to_be_bytes());
    s.extend_from_slice(data);
    if with_csum {
        let mut c = inet_csum(&[&pseudo(src, dst, UDP, s.len()), &s]);
        if c == 0 {
            c = 0xffff;
        }
        s[6..8].copy_from_slice(&c.to_be_bytes());
    }
    s
}

pub fn icmp(ty: u8, code: u8, rest: [u8; 4], data: &[u8]) -> Vec<u8> {
    let mut s = vec![ty, code, 0, 0];
    s.extend_from_slice(&rest);
    s.extend_from_slice(data);
    let c = inet_csum(&[&s]);
    s[2..4].copy_from_slice(&c.to_be_bytes());
    s
}

pub fn echo(ty: u8, id: u16, seq: u16) -> Vec<u8> {
    let mut rest = [0u8; 4];
    rest[..2].copy_from_slice(&id.to_be_bytes());
    rest[2..].copy_from_slice(&seq.to_be_bytes());
    icmp(ty, 0, rest, b"ping payload 0123456789")
}

/// A full frame: Ethernet + IPv4 + the given L4 bytes.
pub fn frame(
    dmac: [u8; 6],
    smac: [u8; 6],
    src: Ipv4Addr,
    dst: Ipv4Addr,
    proto: u8,
    l4: &[u8],
) -> Vec<u8> {
    eth(dmac, smac, 0x0800, &ipv4(src, dst, proto, 64, l4))
}

pub fn tcp_frame(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16, flags: u8) -> Vec<u8> {
    frame(
        UPLINK_MAC,
        EXT_MAC,
        src,
        dst,
        TCP,
        &tcp(src, dst, sport, dport, flags, b"hello"),
    )
}

pub fn udp_frame(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16) -> Vec<u8> {
    frame(
        UPLINK_MAC,
        EXT_MAC,
        src,
        dst,
        UDP,
        &udp(src, dst, sport, dport, b"datagram", true),
    )
}

// ------------------------------------------------------------------- parsing

/// The `NatKey` of a frame's flow as the eBPF programs build it (addresses and ports in
/// network order; an ICMP echo request's id is its source port, a reply's its destination).
pub fn flow_key(f: &[u8]) -> cni_ebpf_common::NatKey {
    let p = parse_checked(f);
    let (sport, dport) = match (p.proto, p.icmp_type) {
        (ICMP, 8) => (p.icmp_id, 0),
        (ICMP, 0) => (0, p.icmp_id),
        (ICMP, _) => (0, 0),
        _ => (p.sport, p.dport),
    };
    cni_ebpf_common::NatKey {
        saddr: u32::from_ne_bytes(p.src.octets()),
        daddr: u32::from_ne_bytes(p.dst.octets()),
        sport: sport.to_be(),
        dport: dport.to_be(),
        proto: p.proto,
        _pad: [0; 3],
    }
}

/// What the tests look at in a (rewritten) frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    pub dmac: [u8; 6],
    pub smac: [u8; 6],
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub ttl: u8,
    pub proto: u8,
    pub sport: u16,
    pub dport: u16,
    /// ICMP type, or 0xff.
    pub icmp_type: u8,
    /// ICMP echo id.
    pub icmp_id: u16,
    pub l4: Vec<u8>,
}

/// Parses a frame and asserts every checksum (IPv4 header, TCP/UDP with pseudo-header,
/// ICMP) is right, computed here from scratch.
pub fn parse_checked(f: &[u8]) -> Parsed {
    assert!(f.len() >= 34, "frame too short: {}", f.len());
    let ip = &f[14..34];
    assert_eq!(ip[0], 0x45, "not a plain IPv4 header");
    assert_eq!(
        inet_csum(&[ip]),
        0,
        "IPv4 header checksum is wrong: {:02x?}",
        ip
    );
    let tot = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
    let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
    let l4 = f[34..14 + tot].to_vec();
    let mut p = Parsed {
        dmac: f[0..6].try_into().unwrap(),
        smac: f[6..12].try_into().unwrap(),
        src,
        dst,
        ttl: ip[8],
        proto: ip[9],
        sport: 0,
        dport: 0,
        icmp_type: 0xff,
        icmp_id: 0,
        l4: l4.clone(),
    };
    match ip[9] {
        proto @ (TCP | UDP) => {
            // A UDP checksum of zero means "none" (IPv4).
            if proto == TCP || l4[6..8] != [0, 0] {
                assert_eq!(
                    inet_csum(&[&pseudo(src, dst, proto, l4.len()), &l4]),
                    0,
                    "{} checksum is wrong",
                    if proto == TCP { "TCP" } else { "UDP" }
                );
            }
            p.sport = u16::from_be_bytes([l4[0], l4[1]]);
            p.dport = u16::from_be_bytes([l4[2], l4[3]]);
        }
        ICMP => {
            assert_eq!(inet_csum(&[&l4]), 0, "ICMP checksum is wrong");
            p.icmp_type = l4[0];
            p.icmp_id = u16::from_be_bytes([l4[4], l4[5]]);
        }
        _ => {}
    }
    p
}

/// Pod A's attachment as [`Fixture::two_pods`] makes it.
pub fn endpoint_a() -> Endpoint {
    pod_endpoint("ctr-a", POD_A, IFINDEX_A, HOST_MAC_A, POD_MAC_A)
}

/// Pod B's attachment as [`Fixture::two_pods`] makes it.
pub fn endpoint_b() -> Endpoint {
    pod_endpoint("ctr-b", POD_B, IFINDEX_B, HOST_MAC_B, POD_MAC_B)
}

fn pod_endpoint(
    id: &str,
    ip: Ipv4Addr,
    ifindex: u32,
    host_mac: [u8; 6],
    pod_mac: [u8; 6],
) -> Endpoint {
    Endpoint {
        container_id: id.into(),
        ifname: "eth0".into(),
        host_ifindex: ifindex,
        host_ifname: format!("veth-{id}"),
        host_mac,
        pod_mac,
        ips: vec![ip.into()],
        allowed_sources: Vec::new(),
        nat_flows: cni_ebpf_common::DEFAULT_NAT_FLOWS_PER_POD,
        egress_rate: None,
        // As ADD writes a pod with host ports (and older builds every pod): the hairpin
        // lookup stays on, so that any fixture may give the pod host ports later.
        host_ports: true,
        netkit: false,
        pod: None,
    }
}

/// The egress rate of the pacing tests: 20 frames of `frame_len` bytes a second (a frame
/// costs 50 ms, far longer than a test's loop takes even on a loaded machine, so the
/// schedule does not catch up with the clock meanwhile) with a burst of `burst_frames`;
/// and one frame's cost in the schedule (ns).
pub fn frame_rate(frame_len: usize, burst_frames: u64) -> (cni_ebpf::cni::config::EgressRate, u64) {
    let bytes_per_s = frame_len as u64 * 20;
    let rate = cni_ebpf::cni::config::EgressRate {
        bits_per_s: bytes_per_s * 8,
        burst_bits: frame_len as u64 * 8 * burst_frames,
    };
    (rate, frame_len as u64 * 1_000_000_000 / bytes_per_s)
}

/// Every tc program of the datapath.
pub const ALL_PROGS: [&str; 3] = ["from_pod", "uplink_ingress", "uplink_egress"];

/// Pod A's IPv6 address in the dual-stack tests.
pub const POD_A6: std::net::Ipv6Addr = std::net::Ipv6Addr::new(0xfd00, 0x10, 0x244, 1, 0, 0, 0, 2);

/// An Ethernet frame from pod A carrying IPv6 UDP (a 4-byte payload) from `src` to `dst`.
pub fn udp6_frame(src: std::net::Ipv6Addr, dst: std::net::Ipv6Addr) -> Vec<u8> {
    let udp = [
        0x9c, 0x40, 0x00, 0x35, 0x00, 0x0c, 0x00, 0x00, b'p', b'i', b'n', b'g',
    ];
    let mut ip = vec![0x60, 0, 0, 0];
    ip.extend_from_slice(&(udp.len() as u16).to_be_bytes());
    ip.extend_from_slice(&[17, 64]);
    ip.extend_from_slice(&src.octets());
    ip.extend_from_slice(&dst.octets());
    ip.extend_from_slice(&udp);
    eth(HOST_MAC_A, POD_MAC_A, 0x86dd, &ip)
}

/// The settings of [`Fixture::standard_node`]: node address NODE, cluster 10.244.0.0/16,
/// the SNAT ports of [`SNAT_PORTS`] with the default cap per pod and destination.
pub fn standard_settings(masq: bool) -> NodeConfigSpec {
    NodeConfigSpec {
        node_addr: Some(NODE),
        uplink_ifindex: 2,
        ip_masq: masq,
        same_node_fast_path: true,
        network_policy: false,
        cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
        node_addr6: None,
        cluster_cidrs6: Vec::new(),
        snat_ports: SNAT_PORTS,
        snat_dest_cap: cni_ebpf::datapath::snat_dest_cap(None, SNAT_PORTS),
        netns_cookie: 0,
        tunnel: None,
        wireguard: None,
    }
}

/// A port mapping (`host_ip`: an address or nothing).
pub fn pm(
    host_port: u16,
    container_port: u16,
    protocol: &str,
    host_ip: Option<&str>,
) -> cni_ebpf::cni::config::PortMapping {
    cni_ebpf::cni::config::PortMapping {
        host_port,
        container_port,
        protocol: protocol.into(),
        host_ip: host_ip.map(|s| s.parse().unwrap()),
    }
}

/// The two NAT entries of a masqueraded TCP flow `pod:pod_port → peer:peer_port` that
/// leaves as `node:node_port` (addresses as the maps hold them, ports in host order):
/// the forward one (`uplink_egress`) and the reverse one (`uplink_ingress`), each with
/// its key.
pub fn snat_tcp_pair(
    (pod, pod_port): (u32, u16),
    (peer, peer_port): (u32, u16),
    (node, node_port): (u32, u16),
) -> [(cni_ebpf_common::NatKey, cni_ebpf_common::NatEntry); 2] {
    use cni_ebpf_common::{NatEntry, NatHook, NatKey, NatKind};
    let (pp, qp, np) = (pod_port.to_be(), peer_port.to_be(), node_port.to_be());
    let key = |saddr, sport, daddr, dport| NatKey {
        saddr,
        daddr,
        sport,
        dport,
        proto: TCP,
        _pad: [0; 3],
    };
    let entry = |(saddr, sport), (daddr, dport), hook, kind| NatEntry {
        saddr,
        daddr,
        sport,
        dport,
        hook,
        kind,
        ..NatEntry::default()
    };
    [
        (
            key(pod, pp, peer, qp),
            entry(
                (node, np),
                (peer, qp),
                NatHook::UPLINK_OUT,
                NatKind::SNAT_FWD,
            ),
        ),
        (
            key(peer, qp, node, np),
            entry((peer, qp), (pod, pp), NatHook::UPLINK_IN, NatKind::SNAT_REV),
        ),
    ]
}
