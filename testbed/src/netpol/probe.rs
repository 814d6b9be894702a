//! Reachability probes over real sockets, for the NetworkPolicy matrix run end to end.
//!
//! - [`MatrixServer`]: what upstream's agnhost containers serve, in one pod's network
//!   namespace: TCP and UDP on ports 80 and 81 for both families (one dual-stack socket
//!   each), answering with the pod's name; and an SCTP listener on a raw socket per
//!   family that answers each INIT chunk it receives with an INIT ACK.
//! - [`probe`]: one connection attempt from a pod's namespace, bounded by a timeout;
//!   [`greets`]: one TCP connection that must bring a server's greeting.
//! - [`ProcessProber`]: TCP and UDP attempts from a long-lived process of a pod's
//!   namespace and a cgroup (where socket hooks translate Services), many at once.
//!
//! The kernel these tests run on has no SCTP module, so an SCTP probe cannot be a whole
//! SCTP association: it is its first exchange, an INIT chunk built as an SCTP stack
//! builds it, sent on a raw socket, and the INIT ACK the destination's raw listener sends
//! back (verification tag = the INIT's initiate tag, with a state cookie). The probe
//! counts as connected when that answer arrives, from the address and port it was sent
//! to: through a Service, netfilter's SCTP conntrack translates both chunks, as it does
//! for a real association's, and the answer must pass back as the reply it is.

use std::{
    collections::HashSet,
    io::{Read, Write},
    mem::MaybeUninit,
    net::{IpAddr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket},
    path::Path,
    sync::{
        atomic::{AtomicBool, AtomicU32, Ordering},
        Arc, Mutex,
    },
    thread,
    time::{Duration, Instant},
};

use nix::sched::{setns, CloneFlags};
use socket2::{Domain, Protocol as SockProtocol, SockAddr, Socket, Type};

use super::{Protocol, PORTS};

/// Whether a client in `netns` gets the greeting line of the server at `addr` (a
/// [`crate::datapath::TaggedServer`] greets) within `within`.
#[must_use]
pub fn greets(netns: &Path, addr: &str, within: Duration) -> bool {
    let to: SocketAddr = addr.parse().unwrap_or_else(|e| panic!("{addr}: {e}"));
    crate::net::in_netns(netns, move || {
        TcpStream::connect_timeout(&to, within)
            .and_then(|s| crate::datapath::read_line(&s))
            .is_ok_and(|l| !l.is_empty())
    })
}

/// How long a server thread blocks before it looks at its stop flag.
const POLL: Duration = Duration::from_millis(100);
/// SCTP's IP protocol number.
const IPPROTO_SCTP: i32 = 132;

/// Moves the calling thread into `netns`. Panics naming the namespace if it cannot.
#[track_caller]
fn enter(netns: &Path) {
    let file = std::fs::File::open(netns)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", netns.display()));
    if let Err(e) = setns(&file, CloneFlags::CLONE_NEWNET) {
        panic!("cannot enter {}: {e}", netns.display());
    }
}

/// Upstream's servers of one pod: TCP, UDP and SCTP on ports 80 and 81, both families.
/// Stopped and joined on drop.
#[derive(Debug)]
pub struct MatrixServer {
    stop: Arc<AtomicBool>,
    sctp_seen: Arc<Mutex<HashSet<(u32, u16)>>>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl MatrixServer {
    /// Starts the servers of pod `name` in `netns`. Panics if a socket cannot be bound.
    #[track_caller]
    #[must_use]
    pub fn start(netns: &Path, name: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let sctp_seen = Arc::new(Mutex::new(HashSet::new()));
        let mut threads = Vec::new();
        let reply = format!("{name}\n");
        for port in PORTS {
            let (tcp, udp) = bind_dual_stack(netns, port);
            let (s, r) = (Arc::clone(&stop), reply.clone());
            threads.push(thread::spawn(move || serve_tcp(&tcp, &s, &r)));
            let (s, r) = (Arc::clone(&stop), reply.clone());
            threads.push(thread::spawn(move || serve_udp(&udp, &s, &r)));
        }
        for domain in [Domain::IPV4, Domain::IPV6] {
            let sock = raw_sctp(netns, domain);
            let (s, seen) = (Arc::clone(&stop), Arc::clone(&sctp_seen));
            threads.push(thread::spawn(move || answer_sctp(&sock, domain, &s, &seen)));
        }
        Self {
            stop,
            sctp_seen,
            threads,
        }
    }

    /// Whether this pod has received the SCTP INIT with initiate tag `tag` on `port`.
    #[must_use]
    pub fn saw_sctp(&self, tag: u32, port: u16) -> bool {
        self.sctp_seen
            .lock()
            .is_ok_and(|seen| seen.contains(&(tag, port)))
    }
}

impl Drop for MatrixServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[track_caller]
fn bind_dual_stack(netns: &Path, port: u16) -> (Socket, Socket) {
    let path = netns.to_path_buf();
    let bound = thread::spawn(move || {
        enter(&path);
        let addr = SockAddr::from(SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)));
        let tcp = Socket::new(Domain::IPV6, Type::STREAM, Some(SockProtocol::TCP))?;
        tcp.set_only_v6(false)?;
        tcp.set_reuse_address(true)?;
        tcp.bind(&addr)?;
        tcp.listen(1024)?;
        tcp.set_read_timeout(Some(POLL))?;
        let udp = Socket::new(Domain::IPV6, Type::DGRAM, Some(SockProtocol::UDP))?;
        udp.set_only_v6(false)?;
        udp.bind(&addr)?;
        udp.set_read_timeout(Some(POLL))?;
        Ok::<_, std::io::Error>((tcp, udp))
    })
    .join();
    match bound {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => panic!("bind port {port} in {}: {e}", netns.display()),
        Err(_) => panic!(
            "bind port {port} in {}: the thread panicked",
            netns.display()
        ),
    }
}

#[track_caller]
fn raw_sctp(netns: &Path, domain: Domain) -> Socket {
    let path = netns.to_path_buf();
    let made = thread::spawn(move || {
        enter(&path);
        let sock = Socket::new(domain, Type::RAW, Some(SockProtocol::from(IPPROTO_SCTP)))?;
        sock.set_read_timeout(Some(POLL))?;
        Ok::<_, std::io::Error>(sock)
    })
    .join();
    match made {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => panic!("raw SCTP socket in {}: {e}", netns.display()),
        Err(_) => panic!(
            "raw SCTP socket in {}: the thread panicked",
            netns.display()
        ),
    }
}

fn serve_tcp(listener: &Socket, stop: &AtomicBool, reply: &str) {
    while !stop.load(Ordering::Relaxed) {
        let Ok((conn, _)) = listener.accept() else {
            continue;
        };
        let mut conn: TcpStream = conn.into();
        let _ = conn.set_write_timeout(Some(POLL));
        let _ = conn.write_all(reply.as_bytes());
    }
}

fn serve_udp(sock: &Socket, stop: &AtomicBool, reply: &str) {
    let mut buf = [MaybeUninit::<u8>::uninit(); 512];
    while !stop.load(Ordering::Relaxed) {
        let Ok((_, peer)) = sock.recv_from(&mut buf) else {
            continue;
        };
        let _ = sock.send_to(reply.as_bytes(), &peer);
    }
}

/// Receives one packet on raw SCTP socket `sock` of `domain`: the SCTP part and the
/// sender's address. An IPv4 raw socket receives the IP header too; an IPv6 one the
/// payload only.
fn recv_sctp(sock: &Socket, domain: Domain) -> Option<(Vec<u8>, IpAddr)> {
    let mut buf = [MaybeUninit::<u8>::uninit(); 2048];
    let (n, from) = sock.recv_from(&mut buf).ok()?;
    // SAFETY: recv_from initialised the first `n` bytes.
    let data: Vec<u8> = buf[..n]
        .iter()
        .map(|b| unsafe { b.assume_init() })
        .collect();
    let from = from.as_socket()?.ip();
    if domain == Domain::IPV4 {
        let ihl = data.first().map_or(0, |b| usize::from(b & 0x0f) * 4);
        Some((data.get(ihl..)?.to_vec(), from))
    } else {
        Some((data, from))
    }
}

/// The server side: each INIT is recorded and answered with an INIT ACK to its sender.
fn answer_sctp(
    sock: &Socket,
    domain: Domain,
    stop: &AtomicBool,
    seen: &Mutex<HashSet<(u32, u16)>>,
) {
    while !stop.load(Ordering::Relaxed) {
        let Some((sctp, from)) = recv_sctp(sock, domain) else {
            continue;
        };
        let Some(init) = parse_chunk(&sctp, CHUNK_INIT) else {
            continue;
        };
        if let Ok(mut s) = seen.lock() {
            s.insert((init.tag, init.dst_port));
        }
        let ack = sctp_packet(
            init.dst_port,
            init.src_port,
            init.tag,
            CHUNK_INIT_ACK,
            !init.tag,
        );
        let _ = sock.send_to(&ack, &SockAddr::from(SocketAddr::new(from, 0)));
    }
}

/// SCTP chunk types.
const CHUNK_INIT: u8 = 1;
const CHUNK_INIT_ACK: u8 = 2;

/// What [`parse_chunk`] reads of an INIT or INIT ACK.
struct Chunk {
    src_port: u16,
    dst_port: u16,
    /// The packet's verification tag.
    vtag: u32,
    /// The chunk's initiate tag.
    tag: u32,
}

/// The ports, verification tag and initiate tag of an SCTP packet whose first chunk is of
/// type `kind` (INIT or INIT ACK, which share the layout of their first fields).
fn parse_chunk(sctp: &[u8], kind: u8) -> Option<Chunk> {
    let word = |at: usize| -> Option<u32> {
        let b = sctp.get(at..at + 4)?;
        Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    };
    if *sctp.get(12)? != kind {
        return None;
    }
    Some(Chunk {
        src_port: u16::from_be_bytes([*sctp.first()?, *sctp.get(1)?]),
        dst_port: u16::from_be_bytes([*sctp.get(2)?, *sctp.get(3)?]),
        vtag: word(4)?,
        tag: word(16)?,
    })
}

/// An SCTP packet from `src_port` to `dst_port` with verification tag `vtag` holding one
/// INIT (`kind` 1, `vtag` 0) or INIT ACK (`kind` 2, with a state cookie) whose initiate
/// tag and initial TSN are `tag`, its CRC32c checksum filled in (RFC 9260, 3.3.2–3.3.3).
fn sctp_packet(src_port: u16, dst_port: u16, vtag: u32, kind: u8, tag: u32) -> Vec<u8> {
    let cookie: &[u8] = if kind == CHUNK_INIT_ACK {
        // State Cookie parameter (type 7), four bytes of cookie.
        &[0, 7, 0, 8, 0xc0, 0x0c, 0x1e, 0x5a]
    } else {
        &[]
    };
    let mut p = Vec::with_capacity(40);
    p.extend_from_slice(&src_port.to_be_bytes());
    p.extend_from_slice(&dst_port.to_be_bytes());
    p.extend_from_slice(&vtag.to_be_bytes());
    p.extend_from_slice(&0u32.to_be_bytes()); // checksum, filled below
    p.push(kind);
    p.push(0);
    let len = u16::try_from(20 + cookie.len()).unwrap_or(20);
    p.extend_from_slice(&len.to_be_bytes()); // chunk length
    p.extend_from_slice(&tag.to_be_bytes());
    p.extend_from_slice(&65_535u32.to_be_bytes()); // advertised receiver window
    p.extend_from_slice(&1u16.to_be_bytes()); // outbound streams
    p.extend_from_slice(&1u16.to_be_bytes()); // inbound streams
    p.extend_from_slice(&tag.to_be_bytes()); // initial TSN
    p.extend_from_slice(cookie);
    let crc = crc32c(&p);
    p[8..12].copy_from_slice(&crc.to_le_bytes());
    p
}

/// An INIT from `src_port` to `dst_port` with initiate tag `tag`.
fn sctp_init(src_port: u16, dst_port: u16, tag: u32) -> Vec<u8> {
    sctp_packet(src_port, dst_port, 0, CHUNK_INIT, tag)
}

fn crc32c(data: &[u8]) -> u32 {
    let mut crc = u32::MAX;
    for b in data {
        crc ^= u32::from(*b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82f6_3b78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

static NEXT_TAG: AtomicU32 = AtomicU32::new(1);

/// Where a probe goes: a pod's address (or its Service's) and port, and the servers of the
/// pod (which record the SCTP INITs they answer).
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    pub addr: IpAddr,
    pub port: u16,
    pub server: &'a MatrixServer,
}

/// One connection attempt from the namespace `netns` (the calling thread moves into it
/// for good: call from a thread of its own): TCP connects and reads the server's answer,
/// UDP sends a datagram and waits for the answer, SCTP sends an INIT and waits for its
/// INIT ACK from the address and port it was sent to. `false` once `timeout` has passed.
#[must_use]
pub fn probe(netns: &Path, target: Target<'_>, protocol: Protocol, timeout: Duration) -> bool {
    enter(netns);
    let to = SocketAddr::new(target.addr, target.port);
    match protocol {
        Protocol::Tcp => TcpStream::connect_timeout(&to, timeout)
            .and_then(|mut s| {
                s.set_read_timeout(Some(timeout))?;
                let mut buf = [0u8; 64];
                s.read(&mut buf)
            })
            .is_ok_and(|n| n > 0),
        Protocol::Udp => {
            let any: SocketAddr = if to.is_ipv4() {
                (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
            } else {
                (Ipv6Addr::UNSPECIFIED, 0).into()
            };
            UdpSocket::bind(any)
                .and_then(|s| {
                    s.set_read_timeout(Some(timeout))?;
                    s.send_to(b"probe", to)?;
                    let mut buf = [0u8; 64];
                    s.recv(&mut buf)
                })
                .is_ok_and(|n| n > 0)
        }
        Protocol::Sctp => {
            let tag = NEXT_TAG.fetch_add(1, Ordering::Relaxed);
            let domain = if to.is_ipv4() {
                Domain::IPV4
            } else {
                Domain::IPV6
            };
            let src_port = 32_768 + u16::try_from(tag % 28_000).unwrap_or(0);
            let packet = sctp_init(src_port, target.port, tag);
            let Ok(sock) = Socket::new(domain, Type::RAW, Some(SockProtocol::from(IPPROTO_SCTP)))
            else {
                return false;
            };
            if sock
                .send_to(&packet, &SockAddr::from(SocketAddr::new(target.addr, 0)))
                .is_err()
            {
                return false;
            }
            let deadline = Instant::now() + timeout;
            // Every SCTP packet for the namespace reaches a raw socket: this probe's answer
            // is the INIT ACK with its tag, from where the INIT went.
            while let Some(left) = deadline.checked_duration_since(Instant::now()) {
                if sock
                    .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                    .is_err()
                {
                    return false;
                }
                let Some((sctp, from)) = recv_sctp(&sock, domain) else {
                    continue;
                };
                if let Some(ack) = parse_chunk(&sctp, CHUNK_INIT_ACK) {
                    if ack.vtag == tag
                        && from == target.addr
                        && ack.src_port == target.port
                        && ack.dst_port == src_port
                    {
                        return true;
                    }
                }
            }
            false
        }
    }
}

/// A client process in a pod's namespace and a cgroup (`cni-ebpf-netclient
/// serve-probes`), which makes TCP and UDP attempts as [`probe`] does, each on a thread
/// of its own: for probes whose sockets must be the cgroup's (a socket hook's
/// translation), without a process per probe. Killed on drop.
pub struct ProcessProber {
    child: std::process::Child,
    input: Mutex<std::process::ChildStdin>,
    waiting: Arc<Mutex<std::collections::HashMap<u64, std::sync::mpsc::Sender<bool>>>>,
    next: std::sync::atomic::AtomicU64,
    reader: Option<thread::JoinHandle<()>>,
}

impl ProcessProber {
    /// Starts `client` (the netclient binary) in `netns`, moved into `cgroup`. Panics if it
    /// cannot start.
    #[track_caller]
    #[must_use]
    pub fn start(client: &Path, netns: &Path, cgroup: &crate::TestCgroup) -> Self {
        use std::{io::BufRead, process::Stdio};
        let mut cmd = std::process::Command::new(client);
        cmd.arg("serve-probes")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        crate::process::in_netns(&mut cmd, netns);
        cgroup.enter_on_exec(&mut cmd);
        let mut child = cmd.spawn().unwrap_or_else(|e| {
            panic!("starting {} in {}: {e}", client.display(), netns.display())
        });
        let (Some(input), Some(output)) = (child.stdin.take(), child.stdout.take()) else {
            panic!("the prober in {} has no pipes", netns.display());
        };
        let waiting: Arc<Mutex<std::collections::HashMap<u64, std::sync::mpsc::Sender<bool>>>> =
            Arc::default();
        let w = Arc::clone(&waiting);
        let reader = thread::spawn(move || {
            for line in std::io::BufReader::new(output).lines() {
                let Ok(line) = line else {
                    break;
                };
                let mut f = line.split_whitespace();
                let (Some(id), Some(outcome)) = (f.next(), f.next()) else {
                    continue;
                };
                let Ok(id) = id.parse::<u64>() else {
                    continue;
                };
                if let Some(tx) = w.lock().ok().and_then(|mut m| m.remove(&id)) {
                    let _ = tx.send(outcome == "ok");
                }
            }
        });
        Self {
            child,
            input: Mutex::new(input),
            waiting,
            next: std::sync::atomic::AtomicU64::new(0),
            reader: Some(reader),
        }
    }

    /// One TCP (the server speaks first) or UDP attempt to `to` within `timeout` (UDP: two
    /// tries); `false` for SCTP, which these processes do not speak.
    #[must_use]
    pub fn probe(&self, to: SocketAddr, protocol: Protocol, timeout: Duration) -> bool {
        let (proto, payload) = match protocol {
            Protocol::Tcp => ("tcp", "-"),
            Protocol::Udp => ("udp", "probe"),
            Protocol::Sctp => return false,
        };
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = std::sync::mpsc::channel();
        if let Ok(mut m) = self.waiting.lock() {
            m.insert(id, tx);
        }
        let line = format!("{id} {proto} {to} {payload} {}\n", timeout.as_millis());
        let sent = self.input.lock().is_ok_and(|mut i| {
            i.write_all(line.as_bytes())
                .and_then(|()| i.flush())
                .is_ok()
        });
        // The process bounds each attempt by `timeout` (twice for UDP); a margin for it to
        // start the thread and answer.
        sent && rx
            .recv_timeout(3 * timeout + Duration::from_secs(2))
            .unwrap_or(false)
    }
}

impl Drop for ProcessProber {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

#[cfg(test)]
#[expect(clippy::expect_used, reason = "tests")]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_the_rfc_test_vector() {
        // RFC 3720, B.4: 32 bytes of zeros.
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
    }

    #[test]
    fn an_init_ack_answers_its_init() {
        let init = parse_chunk(&sctp_init(40_000, 80, 0xdead_beef), CHUNK_INIT).expect("INIT");
        let ack = sctp_packet(init.dst_port, init.src_port, init.tag, CHUNK_INIT_ACK, 7);
        let ack = parse_chunk(&ack, CHUNK_INIT_ACK).expect("INIT ACK");
        assert_eq!(
            (ack.src_port, ack.dst_port, ack.vtag, ack.tag),
            (80, 40_000, 0xdead_beef, 7)
        );
    }

    #[test]
    fn an_init_reads_back() {
        let p = sctp_init(40_000, 80, 0xdead_beef);
        let init = parse_chunk(&p, CHUNK_INIT).map(|c| (c.tag, c.dst_port, c.vtag));
        assert_eq!(init, Some((0xdead_beef, 80, 0)));
        assert_eq!(p.len(), 32);
    }
}
