//! What the end-to-end tests of the datapath share: the masquerading network
//! configuration, ADD/DEL/CHECK through the real binary at spec 1.1.0, `cni-ebpf inspect`
//! and raw map dumps (bpftool), and traffic tools the harness does not have — a tagged,
//! multi-threaded TCP server, a UDP exchange that reports the reply's source, an ICMP
//! sniffer and a many-connections client.
//!
//! Every wait is bounded; every thread stops when its owner drops.

use std::{
    collections::BTreeSet,
    io::{self, Read, Write},
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket},
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    thread,
    time::{Duration, Instant},
};

use crate::{
    net::{in_netns, sock_addr},
    plugin_bin,
    servers::converse,
    ConfBuilder, PluginOutput, Pod, SimNode, POD_SUBNET_V4, POD_SUBNET_V6,
};
use serde_json::{json, Value};

/// The network name of every configuration here (the `ConfBuilder` default).
pub const NET: &str = "testnet";
/// The cluster CIDR of the configuration: never masqueraded.
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";
/// The pod gateway (owned by every host veth).
pub const GW4: &str = "10.244.1.1";
/// Per-step timeout of the traffic helpers.
pub const T: Duration = Duration::from_secs(3);

/// Spec 1.1.0 (invoked directly: libcni cannot parse 1.1.0 results), IPv4 pods,
/// `ipMasq`, `clusterCIDRs`, uplink `uplink0`.
#[must_use]
pub fn masq_conf(node: &SimNode) -> ConfBuilder {
    node.conf()
        .version("1.1.0")
        .subnets(&[POD_SUBNET_V4])
        .set("ipMasq", json!(true))
        .set("clusterCIDRs", json!([CLUSTER_CIDR]))
}

/// `conf` with `runtimeConfig.portMappings` (what a runtime passes for the capability).
#[must_use]
pub fn with_ports(conf: &ConfBuilder, mappings: &Value) -> ConfBuilder {
    conf.clone()
        .set("runtimeConfig", json!({ "portMappings": mappings }))
}

/// One TCP and one UDP mapping `host_port` → `container_port`, optionally on `host_ip`.
#[must_use]
pub fn tcp_udp(host_port: u16, container_port: u16, host_ip: Option<&str>) -> Value {
    let mut out = Vec::new();
    for proto in ["tcp", "udp"] {
        let mut m =
            json!({ "hostPort": host_port, "containerPort": container_port, "protocol": proto });
        if let Some(ip) = host_ip {
            m["hostIP"] = json!(ip);
        }
        out.push(m);
    }
    Value::Array(out)
}

/// ADD through the binary; panics with the plugin's output unless it succeeds.
#[track_caller]
pub fn add(node: &SimNode, pod: &Pod, conf: &ConfBuilder) -> Value {
    node.exec_plugin("ADD", &pod.env("eth0"), &conf.plugin())
        .result()
}

/// DEL (no prevResult); panics unless it succeeds with empty stdout.
#[track_caller]
pub fn del(node: &SimNode, pod: &Pod, conf: &ConfBuilder) {
    node.exec_plugin("DEL", &pod.env("eth0"), &conf.plugin())
        .assert_empty_success();
}

/// CHECK against `prev` (an ADD result).
#[track_caller]
pub fn check(node: &SimNode, pod: &Pod, conf: &ConfBuilder, prev: &Value) -> PluginOutput {
    let conf = conf.clone().set("prevResult", prev.clone());
    node.exec_plugin("CHECK", &pod.env("eth0"), &conf.plugin())
}

/// The pod's IPv4 address (no prefix) in an ADD result.
#[track_caller]
#[must_use]
pub fn pod_ip(result: &Value) -> String {
    result["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|ip| ip["address"].as_str())
        .find(|a| !a.contains(':'))
        .and_then(|a| a.split('/').next())
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("no IPv4 address in the result: {result}"))
}

/// The host veth's name in an ADD result (the interface without a sandbox).
#[track_caller]
#[must_use]
pub fn host_veth(result: &Value) -> String {
    result["interfaces"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|i| i.get("sandbox").is_none())
        .and_then(|i| i["name"].as_str())
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("no host interface in the result: {result}"))
}

/// `<bpffsRoot>/<network>/v<LAYOUT_VERSION>`.
#[must_use]
pub fn pin_dir(node: &SimNode) -> PathBuf {
    node.pin_root()
        .join(NET)
        .join(format!("v{}", cni_ebpf_common::LAYOUT_VERSION))
}

/// The pin of map `name`.
#[must_use]
pub fn map_pin(node: &SimNode, name: &str) -> PathBuf {
    pin_dir(node).join("maps").join(name)
}

/// `cni-ebpf inspect --json` of the network, run in the node namespace.
#[track_caller]
#[must_use]
pub fn inspect(node: &SimNode) -> Value {
    let bin = plugin_bin();
    let root = node.pin_root().to_string_lossy().into_owned();
    let out = node.exec(&[
        bin.to_string_lossy().as_ref(),
        "inspect",
        "--json",
        "--network",
        NET,
        "--bpffs-root",
        &root,
    ]);
    assert!(out.success(), "cni-ebpf inspect failed: {out}");
    out.json()
}

/// The node addresses the datapath tracks (`inspect`).
#[must_use]
pub fn known_node_addrs(node: &SimNode) -> Vec<String> {
    inspect(node)["node"]["node_addrs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a.as_str().map(str::to_owned))
        .collect()
}

/// A list of an inspect document (`endpoints`, `portMappings`, `nat`, `reasons`).
#[must_use]
pub fn list<'a>(doc: &'a Value, key: &str) -> &'a [Value] {
    doc[key].as_array().map_or(&[], Vec::as_slice)
}

/// The count of reason `name` in an inspect document.
#[track_caller]
#[must_use]
pub fn reason(doc: &Value, name: &str) -> u64 {
    list(doc, "reasons")
        .iter()
        .find(|r| r["reason"] == name)
        .and_then(|r| r["count"].as_u64())
        .unwrap_or_else(|| panic!("inspect shows no reason {name}: {}", doc["reasons"]))
}

/// The endpoint entry of `ip` in an inspect document.
#[must_use]
pub fn endpoint<'a>(doc: &'a Value, ip: &str) -> Option<&'a Value> {
    list(doc, "endpoints").iter().find(|e| e["ip"] == ip)
}

/// A `u64` field of a JSON object (0 if absent).
#[must_use]
pub fn num(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or(0)
}

/// NAT entries of an inspect document that mention `ip` in any tuple field.
#[must_use]
pub fn nat_mentioning(doc: &Value, ip: &str) -> Vec<Value> {
    list(doc, "nat")
        .iter()
        .filter(|n| {
            ["src", "dst", "new_src", "new_dst"]
                .iter()
                .any(|k| n[*k] == ip)
        })
        .cloned()
        .collect()
}

/// Every (key, value) of a pinned map, read with `bpftool` (raw bytes: works without BTF).
#[track_caller]
#[must_use]
pub fn dump_map(node: &SimNode, name: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    let pin = map_pin(node, name);
    let out = node.exec(&[
        "bpftool",
        "-j",
        "map",
        "dump",
        "pinned",
        &pin.to_string_lossy(),
    ]);
    let doc = out.json();
    assert!(out.success(), "bpftool map dump failed: {out}");
    let bytes = |v: &Value| -> Vec<u8> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .filter_map(|s| u8::from_str_radix(s.trim_start_matches("0x"), 16).ok())
            .collect()
    };
    doc.as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            // Per-CPU maps list `values` per CPU; only keys matter for those.
            let v = e.get("value").map(bytes).unwrap_or_default();
            (bytes(&e["key"]), v)
        })
        .collect()
}

/// Deletes `key` from a pinned map with `bpftool` (damage for CHECK tests).
#[track_caller]
pub fn delete_map_key(node: &SimNode, name: &str, key: &[u8]) {
    let pin = map_pin(node, name);
    let mut argv: Vec<String> = ["bpftool", "map", "delete", "pinned"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    argv.push(pin.to_string_lossy().into_owned());
    argv.push("key".into());
    argv.push("hex".into());
    argv.extend(key.iter().map(|b| format!("{b:02x}")));
    node.exec(&argv).ok();
}

/// Whether `needle` occurs in `hay`.
#[must_use]
pub fn contains_bytes(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

/// The node namespace's packet-filter state: `iptables-save`, `ip6tables-save` and
/// `nft list ruleset`, with the generated-at comment lines dropped. Panics if a tool is
/// missing or fails, so the comparison can never pass vacuously.
#[track_caller]
#[must_use]
pub fn rulesets(node: &SimNode) -> String {
    let mut out = String::new();
    for argv in [
        &["iptables-save"][..],
        &["ip6tables-save"][..],
        &["nft", "list", "ruleset"][..],
    ] {
        let o = node.exec(argv);
        assert!(o.success(), "{} failed in the node namespace: {o}", argv[0]);
        out.push_str(&format!("== {}\n", argv.join(" ")));
        for l in o
            .stdout
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
        {
            out.push_str(l);
            out.push('\n');
        }
    }
    out
}

/// Relative pin paths below the network's `v<LAYOUT_VERSION>` directory.
#[must_use]
pub fn pin_set(node: &SimNode) -> BTreeSet<String> {
    let prefix = Path::new(NET).join(format!("v{}", cni_ebpf_common::LAYOUT_VERSION));
    node.pins()
        .into_iter()
        .filter_map(|p| {
            p.strip_prefix(&prefix)
                .ok()
                .map(|r| r.to_string_lossy().into_owned())
        })
        .filter(|s| !s.is_empty())
        .collect()
}

/// Raises this process's open-file limit to its hard limit (the many-flows test holds
/// thousands of sockets).
pub fn raise_nofile() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid rlimit struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// The soft open-file limit.
#[must_use]
pub fn nofile() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit with a valid rlimit struct.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    lim.rlim_cur
}

// ------------------------------------------------------------------------------------
// Servers

/// How a [`TaggedServer`] treats a TCP connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Writes `<tag> <peer ip>:<peer port>\n` at once and closes (no per-connection
    /// thread: thousands of connections are cheap).
    Greet,
    /// Writes the greeting, then echoes each read back prefixed with the tag until the
    /// client closes (one thread per connection; for a handful of long-lived flows).
    Echo,
}

/// A TCP server in a namespace that names itself (`tag`) and the peer it sees, and
/// records every peer. Listens on `0.0.0.0:port` with a deep backlog and several accept
/// threads. Stopped and joined on drop.
#[derive(Debug)]
pub struct TaggedServer {
    stop: Arc<AtomicBool>,
    accepted: Arc<AtomicUsize>,
    peers: Arc<Mutex<Vec<SocketAddr>>>,
    received: Arc<Mutex<Vec<String>>>,
    threads: Vec<thread::JoinHandle<()>>,
}

fn greeting(tag: &str, peer: SocketAddr) -> String {
    format!("{tag} {}:{}\n", peer.ip().to_canonical(), peer.port())
}

impl TaggedServer {
    /// Starts it in `netns` on `port`. Panics if it cannot bind.
    #[track_caller]
    #[must_use]
    pub fn start(netns: &Path, port: u16, tag: &str, mode: Mode) -> Self {
        let bind = SocketAddr::from((Ipv4Addr::UNSPECIFIED, port));
        let listener = in_netns(netns, move || TcpListener::bind(bind))
            .unwrap_or_else(|e| panic!("bind tcp {bind} in {}: {e}", netns.display()));
        // A second listen(2) only deepens the backlog (std uses 128).
        // SAFETY: listen on a valid, listening socket.
        unsafe { libc::listen(listener.as_raw_fd(), 4096) };
        if let Err(e) = listener.set_nonblocking(true) {
            panic!("set_nonblocking: {e}");
        }
        let listener = Arc::new(listener);
        let stop = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicUsize::new(0));
        let peers = Arc::new(Mutex::new(Vec::new()));
        let received = Arc::new(Mutex::new(Vec::new()));
        let conn_threads: Arc<Mutex<Vec<thread::JoinHandle<()>>>> =
            Arc::new(Mutex::new(Vec::new()));
        let accept_threads = if mode == Mode::Greet { 4 } else { 1 };
        let mut threads = Vec::new();
        for _ in 0..accept_threads {
            let (l, s, a, p, r, c) = (
                Arc::clone(&listener),
                Arc::clone(&stop),
                Arc::clone(&accepted),
                Arc::clone(&peers),
                Arc::clone(&received),
                Arc::clone(&conn_threads),
            );
            let tag = tag.to_owned();
            threads.push(thread::spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    let (mut conn, peer) = match l.accept() {
                        Ok(x) => x,
                        Err(_) => {
                            thread::sleep(Duration::from_millis(2));
                            continue;
                        }
                    };
                    a.fetch_add(1, Ordering::Relaxed);
                    if let Ok(mut g) = p.lock() {
                        g.push(peer);
                    }
                    let _ = conn.set_nonblocking(false);
                    let _ = conn.set_write_timeout(Some(T));
                    let _ = conn.write_all(greeting(&tag, peer).as_bytes());
                    if mode == Mode::Greet {
                        continue;
                    }
                    let (s2, r2, tag2) = (Arc::clone(&s), Arc::clone(&r), tag.clone());
                    let h = thread::spawn(move || {
                        // Each read is recorded and answered with the tag in front.
                        converse(
                            &mut conn,
                            &s2,
                            Duration::from_millis(50),
                            1024,
                            |c, data| {
                                let text = String::from_utf8_lossy(data).into_owned();
                                if let Ok(mut g) = r2.lock() {
                                    g.push(text.clone());
                                }
                                c.write_all(format!("{tag2} {text}").as_bytes())
                            },
                        );
                    });
                    if let Ok(mut g) = c.lock() {
                        g.push(h);
                    }
                }
                if let Ok(mut g) = c.lock() {
                    for h in g.drain(..) {
                        let _ = h.join();
                    }
                }
            }));
        }
        Self {
            stop,
            accepted,
            peers,
            received,
            threads,
        }
    }

    /// Connections accepted so far.
    #[must_use]
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::Relaxed)
    }

    /// The peers of every accepted connection.
    #[must_use]
    pub fn peers(&self) -> Vec<SocketAddr> {
        self.peers.lock().map(|g| g.clone()).unwrap_or_default()
    }

    /// Everything read on `Echo` connections.
    #[must_use]
    pub fn received(&self) -> Vec<String> {
        self.received.lock().map(|g| g.clone()).unwrap_or_default()
    }
}

impl Drop for TaggedServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Connects from `netns` to a [`TaggedServer`] at `addr` and returns its greeting line.
#[track_caller]
pub fn greet(netns: &Path, addr: &str) -> io::Result<String> {
    let to = sock_addr(addr);
    in_netns(netns, move || {
        let s = TcpStream::connect_timeout(&to, T)?;
        read_line(&s)
    })
}

/// Reads one `\n`-terminated line (bounded by [`T`]).
pub fn read_line(mut s: &TcpStream) -> io::Result<String> {
    s.set_read_timeout(Some(T))?;
    let mut out = Vec::new();
    let mut b = [0u8; 1];
    while out.len() < 512 {
        match s.read(&mut b)? {
            0 => break,
            _ if b[0] == b'\n' => break,
            _ => out.push(b[0]),
        }
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// A long-lived TCP connection opened from a namespace (the socket keeps it).
#[track_caller]
pub fn connect(netns: &Path, addr: &str) -> io::Result<TcpStream> {
    let to = sock_addr(addr);
    in_netns(netns, move || TcpStream::connect_timeout(&to, T))
}

/// Sends one UDP datagram from `netns` to `addr` (retrying up to 3 times on silence) and
/// returns the first answer with the address it came from.
#[track_caller]
pub fn udp_exchange(netns: &Path, addr: &str, payload: &[u8]) -> io::Result<(String, SocketAddr)> {
    let to = sock_addr(addr);
    let payload = payload.to_vec();
    in_netns(netns, move || {
        let s = UdpSocket::bind(unspecified_like(&to))?;
        s.set_read_timeout(Some(Duration::from_secs(1)))?;
        let mut last = io::Error::from(io::ErrorKind::TimedOut);
        for _ in 0..3 {
            s.send_to(&payload, to)?;
            let mut buf = [0u8; 2048];
            match s.recv_from(&mut buf) {
                Ok((n, from)) => {
                    return Ok((String::from_utf8_lossy(&buf[..n]).into_owned(), from))
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    })
}

/// Sends a datagram from a connected UDP socket in `netns` to `addr`, where nothing
/// listens, and returns what the next receive says: `ConnectionRefused` means the ICMP
/// port-unreachable error made it back to the socket. Bounded by 1 s per try, 3 tries.
#[track_caller]
pub fn udp_error(netns: &Path, addr: &str) -> io::Result<usize> {
    let to = sock_addr(addr);
    in_netns(netns, move || {
        let s = UdpSocket::bind(unspecified_like(&to))?;
        s.connect(to)?;
        s.set_read_timeout(Some(Duration::from_secs(1)))?;
        let mut last = Ok(0);
        for _ in 0..3 {
            s.send(b"anyone?")?;
            let mut buf = [0u8; 64];
            last = s.recv(&mut buf);
            if !matches!(&last, Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut))
            {
                return last;
            }
        }
        last
    })
}

/// Any port on the unspecified address of `to`'s family (a local socket to send to it).
fn unspecified_like(to: &SocketAddr) -> SocketAddr {
    if to.is_ipv6() {
        SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 0))
    } else {
        SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0))
    }
}

/// The first line of a WhoAmIServer / TaggedServer answer, without the tag.
#[must_use]
pub fn seen_peer(answer: &str) -> String {
    let line = answer.lines().next().unwrap_or_default();
    line.rsplit(' ').next().unwrap_or_default().to_owned()
}

/// The IP part of `ip:port`.
#[must_use]
pub fn ip_of(peer: &str) -> &str {
    peer.rsplit_once(':').map_or(peer, |(ip, _)| ip)
}

/// Panics unless the server's answer `answer` says it saw the peer address `want`
/// (`what`: which exchange, for the message).
#[track_caller]
pub fn assert_seen_as(answer: &str, want: impl AsRef<str>, what: impl std::fmt::Display) {
    let peer = seen_peer(answer);
    assert_eq!(
        ip_of(&peer),
        want.as_ref(),
        "{what}: the server saw {peer} (answer {answer:?})"
    );
}

// ------------------------------------------------------------------------------------
// ICMP sniffer

/// Collects the (source, ICMP type) of every ICMP packet arriving in a namespace, through
/// a raw socket, until dropped or [`Self::take`]n.
#[derive(Debug)]
pub struct IcmpSniffer {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<(Ipv4Addr, u8)>>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl IcmpSniffer {
    /// Starts sniffing in `netns`. Panics if the raw socket cannot be opened.
    #[track_caller]
    #[must_use]
    pub fn start(netns: &Path) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
        let (s, v, path) = (Arc::clone(&stop), Arc::clone(&seen), netns.to_path_buf());
        let thread = thread::spawn(move || {
            in_netns(&path, move || {
                // SAFETY: plain socket(2); the descriptor is owned by `file` at once.
                let fd = unsafe {
                    libc::socket(
                        libc::AF_INET,
                        libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                        libc::IPPROTO_ICMP,
                    )
                };
                if fd < 0 {
                    let _ = ready_tx.send(Err(io::Error::last_os_error().to_string()));
                    return;
                }
                // SAFETY: fd is fresh and owned by nobody else.
                let sock: UdpSocket = unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) };
                let _ = sock.set_read_timeout(Some(Duration::from_millis(50)));
                let _ = ready_tx.send(Ok(()));
                let mut buf = [0u8; 2048];
                // Stop only once the queue is drained (a recv timing out after `stop`):
                // on a loaded machine this thread may not run before the traffic is over.
                loop {
                    let stopping = s.load(Ordering::Relaxed);
                    let Ok(n) = sock.recv(&mut buf) else {
                        if stopping {
                            break;
                        }
                        continue;
                    };
                    let ihl = usize::from(buf[0] & 0x0f) * 4;
                    if n >= ihl + 8 && n >= 20 {
                        let src = Ipv4Addr::new(buf[12], buf[13], buf[14], buf[15]);
                        if let Ok(mut g) = v.lock() {
                            g.push((src, buf[ihl]));
                        }
                    }
                }
            });
        });
        match ready_rx.recv_timeout(T) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("cannot open a raw ICMP socket in {}: {e}", netns.display()),
            Err(e) => panic!("ICMP sniffer did not start: {e}"),
        }
        Self {
            stop,
            seen,
            thread: Some(thread),
        }
    }

    /// Stops and returns what was seen.
    #[must_use]
    pub fn take(mut self) -> Vec<(Ipv4Addr, u8)> {
        self.stop_thread();
        self.seen.lock().map(|g| g.clone()).unwrap_or_default()
    }

    fn stop_thread(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for IcmpSniffer {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

// ------------------------------------------------------------------------------------
// Many flows

/// Opens `n` TCP connections from `netns`, round-robin over `targets`, on `threads`
/// threads, and returns them all still open (so every flow is live at once). Each connect
/// is bounded by [`T`]; failures are returned per connection.
#[track_caller]
#[must_use]
pub fn open_many_tcp(
    netns: &Path,
    targets: &[SocketAddr],
    n: usize,
    threads: usize,
) -> Vec<io::Result<TcpStream>> {
    let targets = targets.to_vec();
    in_netns(netns, move || {
        // Threads spawned here inherit this thread's network namespace.
        let per = n.div_ceil(threads);
        let chunks: Vec<Vec<usize>> = (0..threads)
            .map(|t| (t * per..((t + 1) * per).min(n)).collect())
            .collect();
        thread::scope(|scope| {
            let handles: Vec<_> = chunks
                .into_iter()
                .map(|idx| {
                    let targets = &targets;
                    scope.spawn(move || {
                        idx.into_iter()
                            .map(|i| TcpStream::connect_timeout(&targets[i % targets.len()], T))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| match h.join() {
                    Ok(v) => v,
                    Err(e) => std::panic::resume_unwind(e),
                })
                .collect()
        })
    })
}

/// Opens `n` UDP sockets in `netns` (all kept open), each sending `payload` to one of
/// `targets` (round-robin) and waiting for the answer — up to 3 tries of 1 s — on
/// `threads` threads. Returns each socket's answer (or error) and the sockets.
#[track_caller]
#[must_use]
pub fn many_udp(
    netns: &Path,
    targets: &[SocketAddr],
    n: usize,
    threads: usize,
) -> (Vec<io::Result<String>>, Vec<UdpSocket>) {
    let targets = targets.to_vec();
    in_netns(netns, move || {
        let per = n.div_ceil(threads);
        thread::scope(|scope| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let targets = &targets;
                    scope.spawn(move || {
                        let mut answers = Vec::new();
                        let mut socks = Vec::new();
                        for i in t * per..((t + 1) * per).min(n) {
                            let to = targets[i % targets.len()];
                            let s =
                                match UdpSocket::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)))
                                {
                                    Ok(s) => s,
                                    Err(e) => {
                                        answers.push(Err(e));
                                        continue;
                                    }
                                };
                            let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
                            let mut answer = Err(io::Error::from(io::ErrorKind::TimedOut));
                            for _ in 0..3 {
                                if let Err(e) = s.send_to(format!("flow {i}").as_bytes(), to) {
                                    answer = Err(e);
                                    break;
                                }
                                let mut buf = [0u8; 512];
                                match s.recv_from(&mut buf) {
                                    Ok((len, _)) => {
                                        answer =
                                            Ok(String::from_utf8_lossy(&buf[..len]).into_owned());
                                        break;
                                    }
                                    Err(e) => answer = Err(e),
                                }
                            }
                            answers.push(answer);
                            socks.push(s);
                        }
                        (answers, socks)
                    })
                })
                .collect();
            let mut answers = Vec::new();
            let mut socks = Vec::new();
            for h in handles {
                match h.join() {
                    Ok((a, s)) => {
                        answers.extend(a);
                        socks.extend(s);
                    }
                    Err(e) => std::panic::resume_unwind(e),
                }
            }
            (answers, socks)
        })
    })
}

/// Waits (bounded by `timeout`, polling) until `f` holds; returns whether it did.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// An address family, where a helper reads a per-family figure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

/// Packets the node's kernel forwarded: `Ip: ForwDatagrams` (IPv4, `/proc/net/snmp`) or
/// `Ip6OutForwDatagrams` (IPv6, `/proc/net/snmp6`).
#[track_caller]
pub fn forwarded_datagrams(node: &SimNode, family: Family) -> u64 {
    match family {
        Family::V4 => {
            let text = node.exec(&["cat", "/proc/net/snmp"]).stdout.clone();
            crate::net::proc_net_counter(&text, "Ip", "ForwDatagrams")
                .unwrap_or_else(|| panic!("no ForwDatagrams in /proc/net/snmp: {text}"))
        }
        Family::V6 => {
            let text = node.exec(&["cat", "/proc/net/snmp6"]).stdout.clone();
            text.lines()
                .filter_map(|l| l.split_once(char::is_whitespace))
                .find(|(n, _)| *n == "Ip6OutForwDatagrams")
                .and_then(|(_, v)| v.trim().parse().ok())
                .unwrap_or_else(|| panic!("no Ip6OutForwDatagrams in /proc/net/snmp6: {text}"))
        }
    }
}

/// Sends `len` bytes over TCP from `netns` to a sink in `ext` listening on `addr`
/// (`ip:port` or `[ip6]:port`) and returns how many the sink received (bounded by [`T`]
/// per read).
#[track_caller]
pub fn upload(node: &SimNode, netns: &Path, addr: &str, len: usize) -> usize {
    let bind: SocketAddr = addr
        .parse()
        .unwrap_or_else(|e| panic!("{addr} is not a socket address: {e}"));
    let listener = in_netns(node.ext_netns(), move || TcpListener::bind(bind))
        .unwrap_or_else(|e| panic!("bind {bind} in ext: {e}"));
    let sink = thread::spawn(move || -> io::Result<usize> {
        let (mut conn, _) = listener.accept()?;
        conn.set_read_timeout(Some(T))?;
        let mut buf = vec![0u8; 64 * 1024];
        let mut total = 0;
        loop {
            match conn.read(&mut buf)? {
                0 => return Ok(total),
                n => total += n,
            }
        }
    });
    let mut s = connect(netns, addr).unwrap_or_else(|e| panic!("TCP → ext {addr}: {e}"));
    s.set_write_timeout(Some(T)).ok();
    let data = vec![0x5au8; len];
    if let Err(e) = s.write_all(&data) {
        panic!("upload of {len} bytes to ext {addr}: {e}");
    }
    drop(s);
    match sink.join() {
        Ok(Ok(n)) => n,
        Ok(Err(e)) => panic!("sink in ext: {e}"),
        Err(_) => panic!("sink thread panicked"),
    }
}

/// The IPv6 cluster CIDR (the pod prefix of every node).
pub const CLUSTER_CIDR6: &str = "fd00:10:244::/48";

/// Dual-stack pods, masquerade on, both families' cluster CIDRs.
pub fn dual_stack_masq_conf(node: &SimNode) -> ConfBuilder {
    node.conf()
        .version("1.1.0")
        .subnets(&[POD_SUBNET_V4, POD_SUBNET_V6])
        .set("ipMasq", json!(true))
        .set("clusterCIDRs", json!([CLUSTER_CIDR, CLUSTER_CIDR6]))
}

/// The pod's IPv6 address (no prefix) in an ADD result.
#[track_caller]
pub fn pod_ip6(result: &Value) -> String {
    result["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|ip| ip["address"].as_str())
        .find(|a| a.contains(':'))
        .and_then(|a| a.split('/').next())
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("no IPv6 address in the result: {result}"))
}
