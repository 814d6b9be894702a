//! Reachability probes over real sockets, for the NetworkPolicy matrix run end to end.
//!
//! - [`MatrixServer`]: what upstream's agnhost containers serve, in one pod's network
//!   namespace: TCP and UDP on ports 80 and 81 for both families (one dual-stack socket
//!   each), answering with the pod's name; and an SCTP listener on a raw socket per
//!   family that records the INIT chunks it receives.
//! - [`probe`]: one connection attempt from a pod's namespace, bounded by a timeout.
//!
//! The kernel these tests run on has no SCTP module, so an SCTP probe cannot be an SCTP
//! association: it is one INIT chunk, built as an SCTP stack would build it and sent on
//! a raw socket, and it counts as connected when the destination pod's raw listener
//! receives it. That is one way only (the datapath decides on that first packet, which is
//! what a NetworkPolicy verdict is about), and the pod's kernel never answers it.

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
            threads.push(thread::spawn(move || listen_sctp(&sock, domain, &s, &seen)));
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

fn listen_sctp(
    sock: &Socket,
    domain: Domain,
    stop: &AtomicBool,
    seen: &Mutex<HashSet<(u32, u16)>>,
) {
    let mut buf = [MaybeUninit::<u8>::uninit(); 2048];
    while !stop.load(Ordering::Relaxed) {
        let Ok(n) = sock.recv(&mut buf) else {
            continue;
        };
        // SAFETY: recv initialised the first `n` bytes.
        let data: Vec<u8> = buf[..n]
            .iter()
            .map(|b| unsafe { b.assume_init() })
            .collect();
        // An IPv4 raw socket receives the IP header too; an IPv6 one the payload only.
        let sctp = if domain == Domain::IPV4 {
            let ihl = data.first().map_or(0, |b| usize::from(b & 0x0f) * 4);
            data.get(ihl..).unwrap_or_default()
        } else {
            &data[..]
        };
        if let Some((tag, port)) = parse_init(sctp) {
            if let Ok(mut s) = seen.lock() {
                s.insert((tag, port));
            }
        }
    }
}

/// The initiate tag and destination port of an SCTP packet whose first chunk is INIT.
fn parse_init(sctp: &[u8]) -> Option<(u32, u16)> {
    let port = u16::from_be_bytes([*sctp.get(2)?, *sctp.get(3)?]);
    if *sctp.get(12)? != 1 {
        return None;
    }
    let tag = sctp.get(16..20)?;
    Some((u32::from_be_bytes([tag[0], tag[1], tag[2], tag[3]]), port))
}

/// An SCTP packet holding one INIT chunk from `src_port` to `dst_port`, with initiate
/// tag `tag`, its CRC32c checksum filled in (RFC 9260, section 3.3.2).
fn sctp_init(src_port: u16, dst_port: u16, tag: u32) -> Vec<u8> {
    let mut p = Vec::with_capacity(32);
    p.extend_from_slice(&src_port.to_be_bytes());
    p.extend_from_slice(&dst_port.to_be_bytes());
    p.extend_from_slice(&0u32.to_be_bytes()); // verification tag: 0 on an INIT
    p.extend_from_slice(&0u32.to_be_bytes()); // checksum, filled below
    p.push(1); // INIT
    p.push(0);
    p.extend_from_slice(&20u16.to_be_bytes()); // chunk length
    p.extend_from_slice(&tag.to_be_bytes());
    p.extend_from_slice(&65_535u32.to_be_bytes()); // advertised receiver window
    p.extend_from_slice(&1u16.to_be_bytes()); // outbound streams
    p.extend_from_slice(&1u16.to_be_bytes()); // inbound streams
    p.extend_from_slice(&tag.to_be_bytes()); // initial TSN
    let crc = crc32c(&p);
    p[8..12].copy_from_slice(&crc.to_le_bytes());
    p
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

/// Where a probe goes: a pod's address and port, and (for SCTP, which is one way) the
/// servers that record what arrives.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    pub addr: IpAddr,
    pub port: u16,
    pub server: &'a MatrixServer,
}

/// One connection attempt from the namespace `netns` (the calling thread moves into it
/// for good: call from a thread of its own): TCP connects and reads the server's answer,
/// UDP sends a datagram and waits for the answer, SCTP sends an INIT and waits until the
/// destination's listener has it. `false` once `timeout` has passed.
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
            let sent = Socket::new(domain, Type::RAW, Some(SockProtocol::from(IPPROTO_SCTP)))
                .and_then(|s| s.send_to(&packet, &SockAddr::from(SocketAddr::new(target.addr, 0))));
            if sent.is_err() {
                return false;
            }
            let deadline = Instant::now() + timeout;
            loop {
                if target.server.saw_sctp(tag, target.port) {
                    return true;
                }
                if Instant::now() >= deadline {
                    return false;
                }
                thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_the_rfc_test_vector() {
        // RFC 3720, B.4: 32 bytes of zeros.
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
    }

    #[test]
    fn an_init_reads_back() {
        let p = sctp_init(40_000, 80, 0xdead_beef);
        assert_eq!(parse_init(&p), Some((0xdead_beef, 80)));
        assert_eq!(p.len(), 32);
    }
}
