//! Traffic from inside a namespace without external tools: ICMP echo (ping) and small
//! TCP/UDP "who am I" servers and clients.
//!
//! Machines of this project have no `ping`, `nc` or `socat` (only iproute2), so the
//! harness speaks these protocols itself. Each operation runs on a short-lived thread
//! that `setns`es into the namespace (a network namespace switch is per thread), so the
//! test thread never changes namespace. Sockets keep the namespace they were made in.
//! Every wait is bounded.

use std::{
    fs::File,
    io::{self, Read, Write},
    mem,
    net::{IpAddr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::Path,
    sync::{
        atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use nix::sched::{setns, CloneFlags};

/// Runs `f` on a new thread inside the network namespace at `netns` and returns its
/// value. Panics if the namespace cannot be entered or `f` panics.
#[track_caller]
pub fn in_netns<R: Send + 'static>(netns: &Path, f: impl FnOnce() -> R + Send + 'static) -> R {
    let path = netns.to_path_buf();
    let handle = thread::spawn(move || {
        enter(&path);
        f()
    });
    match handle.join() {
        Ok(v) => v,
        Err(e) => std::panic::resume_unwind(e),
    }
}

/// Moves the calling thread into `netns` (for threads that stay there).
#[track_caller]
fn enter(netns: &Path) {
    let file = File::open(netns).unwrap_or_else(|e| panic!("cannot open {}: {e}", netns.display()));
    if let Err(e) = setns(&file, CloneFlags::CLONE_NEWNET) {
        panic!("cannot enter {}: {e}", netns.display());
    }
}

static ECHO_ID: AtomicU16 = AtomicU16::new(0);

fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for chunk in data.chunks(2) {
        let word = u16::from_be_bytes([chunk[0], *chunk.get(1).unwrap_or(&0)]);
        sum += u32::from(word);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    #[expect(clippy::cast_possible_truncation, reason = "folded to 16 bits above")]
    let folded = sum as u16;
    !folded
}

fn raw_socket(v6: bool) -> io::Result<OwnedFd> {
    let (domain, proto) = if v6 {
        (libc::AF_INET6, libc::IPPROTO_ICMPV6)
    } else {
        (libc::AF_INET, libc::IPPROTO_ICMP)
    };
    // SAFETY: plain socket(2) call; the descriptor is owned right away.
    let fd = unsafe { libc::socket(domain, libc::SOCK_RAW | libc::SOCK_CLOEXEC, proto) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh, valid descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn sockaddr(addr: IpAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { mem::zeroed() };
    let len = match addr {
        IpAddr::V4(a) => {
            // SAFETY: sockaddr_storage is large enough and suitably aligned for sockaddr_in.
            let sin = unsafe { &mut *std::ptr::from_mut(&mut ss).cast::<libc::sockaddr_in>() };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_addr.s_addr = u32::from_ne_bytes(a.octets());
            mem::size_of::<libc::sockaddr_in>()
        }
        IpAddr::V6(a) => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe { &mut *std::ptr::from_mut(&mut ss).cast::<libc::sockaddr_in6>() };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_addr.s6_addr = a.octets();
            mem::size_of::<libc::sockaddr_in6>()
        }
    };
    #[expect(
        clippy::cast_possible_truncation,
        reason = "sockaddr sizes fit socklen_t"
    )]
    (ss, len as libc::socklen_t)
}

/// Sends one ICMP(v6) echo request to `addr` from the current thread's namespace and
/// waits up to `timeout` for the matching reply.
fn ping_here(addr: IpAddr, timeout: Duration) -> io::Result<bool> {
    let v6 = addr.is_ipv6();
    let fd = raw_socket(v6)?;
    let id = ECHO_ID.fetch_add(1, Ordering::Relaxed) ^ (std::process::id() as u16);
    let seq: u16 = 1;
    let mut pkt = vec![if v6 { 128 } else { 8 }, 0, 0, 0];
    pkt.extend_from_slice(&id.to_be_bytes());
    pkt.extend_from_slice(&seq.to_be_bytes());
    pkt.extend_from_slice(b"cni-ebpf-harness");
    if !v6 {
        // The kernel computes ICMPv6 checksums on raw sockets, not ICMPv4 ones.
        let c = checksum(&pkt);
        pkt[2..4].copy_from_slice(&c.to_be_bytes());
    }
    let (ss, len) = sockaddr(addr);
    // SAFETY: pkt and ss are valid for the lengths given.
    let sent = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            pkt.as_ptr().cast(),
            pkt.len(),
            0,
            std::ptr::from_ref(&ss).cast(),
            len,
        )
    };
    if sent < 0 {
        let e = io::Error::last_os_error();
        // No route / unreachable network: a failed ping, not a harness error.
        return if matches!(
            e.raw_os_error(),
            Some(libc::ENETUNREACH | libc::EHOSTUNREACH | libc::EACCES)
        ) {
            Ok(false)
        } else {
            Err(e)
        };
    }
    let deadline = Instant::now() + timeout;
    let mut buf = [0u8; 2048];
    let mut sock = File::from(fd);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        let tv = libc::timeval {
            tv_sec: libc::time_t::try_from(left.as_secs()).unwrap_or(1),
            tv_usec: libc::suseconds_t::from(left.subsec_micros().max(1)),
        };
        // SAFETY: setsockopt with a valid timeval of the right size.
        unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                std::ptr::from_ref(&tv).cast(),
                mem::size_of::<libc::timeval>() as libc::socklen_t,
            );
        }
        let n = match sock.read(&mut buf) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Ok(false)
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        // IPv4 raw sockets deliver the IP header; IPv6 ones do not.
        let icmp = if v6 {
            &buf[..n]
        } else {
            let ihl = usize::from(buf[0] & 0x0f) * 4;
            &buf[ihl.min(n)..n]
        };
        let reply_type = if v6 { 129 } else { 0 };
        if icmp.len() >= 8
            && icmp[0] == reply_type
            && icmp[4..6] == id.to_be_bytes()
            && icmp[6..8] == seq.to_be_bytes()
        {
            return Ok(true);
        }
    }
}

/// One ICMP echo from `netns` to `addr` with a 1 s timeout, retried up to `tries` times
/// (the first probe may be spent on neighbour resolution). True if any was answered.
#[track_caller]
#[must_use]
pub fn ping(netns: &Path, addr: &str, tries: u32) -> bool {
    let ip: IpAddr = addr
        .parse()
        .unwrap_or_else(|e| panic!("ping: {addr:?} is not an IP address: {e}"));
    in_netns(netns, move || {
        (0..tries).any(|_| match ping_here(ip, Duration::from_secs(1)) {
            Ok(ok) => ok,
            Err(e) => panic!("ping {ip}: {e}"),
        })
    })
}

/// An offload of a device that [`set_offload`] turns on or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offload {
    /// Generic receive offload (`ethtool -K <dev> gro`).
    Gro,
    /// TCP segmentation offload (`ethtool -K <dev> tso`).
    Tso,
}

/// Turns `offload` of `dev` in `netns` on or off, as `ethtool -K` does (the legacy
/// `ETHTOOL_SGRO` / `ETHTOOL_STSO` requests; the machines have no `ethtool`).
pub fn set_offload(netns: &Path, dev: &str, offload: Offload, on: bool) -> io::Result<()> {
    /// `SIOCETHTOOL`, `ETHTOOL_STSO` and `ETHTOOL_SGRO` from `linux/sockios.h` and
    /// `linux/ethtool.h`.
    const SIOCETHTOOL: libc::c_ulong = 0x8946;
    const ETHTOOL_STSO: u32 = 0x1f;
    const ETHTOOL_SGRO: u32 = 0x2c;
    /// `struct ethtool_value`.
    #[repr(C)]
    struct EthtoolValue {
        cmd: u32,
        data: u32,
    }
    /// `struct ifreq` with its union as `ifr_data`.
    #[repr(C)]
    struct IfreqData {
        name: [u8; libc::IFNAMSIZ],
        data: *mut EthtoolValue,
        _rest: [u8; 16],
    }
    let name = dev.as_bytes();
    if name.len() >= libc::IFNAMSIZ {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("interface name {dev:?} is too long"),
        ));
    }
    let mut ifname = [0u8; libc::IFNAMSIZ];
    ifname[..name.len()].copy_from_slice(name);
    let cmd = match offload {
        Offload::Gro => ETHTOOL_SGRO,
        Offload::Tso => ETHTOOL_STSO,
    };
    in_netns(netns, move || {
        // SAFETY: a plain socket() call; the result is checked before use.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a socket just opened and owned from here on.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut value = EthtoolValue {
            cmd,
            data: u32::from(on),
        };
        let mut req = IfreqData {
            name: ifname,
            data: &raw mut value,
            _rest: [0; 16],
        };
        // SAFETY: SIOCETHTOOL reads the ifreq and the ethtool_value it points to, both
        // alive and of the layouts the kernel expects for these requests.
        let rc = unsafe { libc::ioctl(sock.as_raw_fd(), SIOCETHTOOL as _, &raw mut req) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    })
}

/// Sends 1 MiB from `netns` to the echo server at `to` (64 KiB writes, then a half
/// close) and returns how many bytes came back. Panics if the connection fails.
#[track_caller]
#[must_use]
pub fn echo_mib(netns: &Path, to: SocketAddr) -> usize {
    in_netns(netns, move || {
        let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(3))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut w = s.try_clone()?;
        let writer = thread::spawn(move || {
            let chunk = vec![0x5a_u8; 64 * 1024];
            for _ in 0..16 {
                w.write_all(&chunk)?;
            }
            w.shutdown(std::net::Shutdown::Write)
        });
        let mut got = Vec::new();
        s.read_to_end(&mut got)?;
        writer
            .join()
            .map_err(|_| std::io::Error::other("writer panicked"))??;
        Ok::<_, std::io::Error>(got.len())
    })
    .unwrap_or_else(|e| panic!("echo to {to}: {e}"))
}

/// Counter `name` of table `table` (`Ip`, `IpExt`, …) in the text of `/proc/net/snmp`
/// or `/proc/net/netstat`, where each table is a row of names followed by a row of
/// values, both prefixed `<table>: `.
#[must_use]
pub fn proc_net_counter(text: &str, table: &str, name: &str) -> Option<u64> {
    let prefix = format!("{table}: ");
    let mut rows = text.lines().filter_map(|l| l.strip_prefix(&prefix));
    let (names, values) = (rows.next()?, rows.next()?);
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == name)
        .and_then(|(_, v)| v.parse().ok())
}

/// Panics unless [`ping`] from `netns` to `addr` succeeds within 3 tries.
#[track_caller]
pub fn assert_ping(netns: &Path, addr: &str) {
    if !ping(netns, addr, 3) {
        let routes = crate::process::netns_exec(netns, &["ip", "route", "show", "table", "all"]);
        let addrs = crate::process::netns_exec(netns, &["ip", "addr"]);
        panic!(
            "no ping reply from {addr} in {}\naddresses:\n{}\nroutes:\n{}",
            netns.display(),
            addrs.stdout,
            routes.stdout
        );
    }
}

/// Panics if a bounded ping from `netns` to `addr` gets an answer.
#[track_caller]
pub fn assert_no_ping(netns: &Path, addr: &str) {
    assert!(
        !ping(netns, addr, 1),
        "unexpected ping reply from {addr} in {}",
        netns.display()
    );
}

/// `addr` as a socket address (`"198.18.0.2:8080"`, `"[fd00::1]:80"`); panics naming it
/// otherwise.
#[track_caller]
#[must_use]
pub fn sock_addr(addr: &str) -> SocketAddr {
    addr.parse()
        .unwrap_or_else(|e| panic!("{addr:?} is not ip:port: {e}"))
}

/// Connects over TCP from `netns` to `addr` (e.g. `"198.18.0.2:8080"` or
/// `"[fd00::1]:80"`), sends `payload`, and returns the whole answer; errors (refused,
/// timed out) are returned, not panicked. Bounded by `timeout` per step.
#[track_caller]
pub fn tcp_request(
    netns: &Path,
    addr: &str,
    payload: &[u8],
    timeout: Duration,
) -> io::Result<String> {
    let to = sock_addr(addr);
    let payload = payload.to_vec();
    in_netns(netns, move || {
        let mut s = TcpStream::connect_timeout(&to, timeout)?;
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
        s.write_all(&payload)?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    })
}

/// Sends one UDP datagram from `netns` to `addr` and returns the first answer.
#[track_caller]
pub fn udp_request(
    netns: &Path,
    addr: &str,
    payload: &[u8],
    timeout: Duration,
) -> io::Result<String> {
    let to = sock_addr(addr);
    let payload = payload.to_vec();
    in_netns(netns, move || {
        let bind: SocketAddr = if to.is_ipv6() {
            (Ipv6Addr::UNSPECIFIED, 0).into()
        } else {
            ([0, 0, 0, 0], 0).into()
        };
        let s = UdpSocket::bind(bind)?;
        s.set_read_timeout(Some(timeout))?;
        s.send_to(&payload, to)?;
        let mut buf = [0u8; 2048];
        let (n, _) = s.recv_from(&mut buf)?;
        Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
    })
}

/// What a long-lived connection saw.
#[derive(Debug, Default)]
pub struct Conversation {
    /// Exchanges completed.
    pub exchanges: AtomicU64,
    /// The slowest exchange, in microseconds.
    pub worst_rtt_us: AtomicU64,
    /// The first failure, if any.
    pub failure: std::sync::Mutex<Option<String>>,
}

/// One persistent connection from `netns` to `to`, one 16-byte exchange every 5 ms until
/// `stop` (bounded by `limit`); any error or an exchange slower than 2 s is a failure.
#[must_use]
pub fn converse(
    netns: &Path,
    to: SocketAddr,
    stop: Arc<AtomicBool>,
    limit: Duration,
) -> (Arc<Conversation>, thread::JoinHandle<()>) {
    let c = Arc::new(Conversation::default());
    let (c2, netns) = (c.clone(), netns.to_path_buf());
    let h = thread::spawn(move || {
        let fail = |why: String| {
            if let Ok(mut f) = c2.failure.lock() {
                f.get_or_insert(why);
            }
        };
        let res = in_netns(&netns, move || {
            TcpStream::connect_timeout(&to, Duration::from_secs(3))
        });
        let mut s = match res {
            Ok(s) => s,
            Err(e) => return fail(format!("connect {to}: {e}")),
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let _ = s.set_nodelay(true);
        let started = Instant::now();
        let mut i: u64 = 0;
        while !stop.load(Ordering::Relaxed) && started.elapsed() < limit {
            let msg = format!("{i:016}");
            let t = Instant::now();
            let mut back = [0u8; 16];
            if let Err(e) = s
                .write_all(msg.as_bytes())
                .and_then(|()| s.read_exact(&mut back))
            {
                return fail(format!(
                    "exchange {i} with {to} after {:?}: {e}",
                    started.elapsed()
                ));
            }
            if back != msg.as_bytes() {
                return fail(format!("exchange {i} with {to}: got {back:?}"));
            }
            let rtt = u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX);
            c2.worst_rtt_us.fetch_max(rtt, Ordering::Relaxed);
            c2.exchanges.fetch_add(1, Ordering::Relaxed);
            i += 1;
            thread::sleep(Duration::from_millis(5));
        }
    });
    (c, h)
}

/// The value of the first sample of metric `family` whose labels include every
/// `labels` pair, scraped from `/metrics` at `addr` inside `netns`; 0 when the scrape
/// fails or no sample matches.
#[must_use]
pub fn metric_value(netns: &Path, addr: SocketAddr, family: &str, labels: &[(&str, &str)]) -> f64 {
    let Ok((_, _, text)) = http_get(netns, addr, "/metrics", Duration::from_secs(2)) else {
        return 0.0;
    };
    let prefix = format!("{family}{{");
    let wanted: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    text.lines()
        .find(|l| l.starts_with(&prefix) && wanted.iter().all(|w| l.contains(w.as_str())))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .unwrap_or(0.0)
}

/// `GET path` over HTTP/1.1 from inside `netns`, each step bounded by `timeout`:
/// (status, headers, body).
pub fn http_get(
    netns: &Path,
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> io::Result<(u16, String, String)> {
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/plain\r\n\r\n");
    in_netns(netns, move || {
        let mut s = TcpStream::connect_timeout(&addr, timeout)?;
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
        s.write_all(req.as_bytes())?;
        let mut raw = Vec::new();
        // The server closes after one answer; 64 MiB bounds a runaway.
        s.take(64 << 20).read_to_end(&mut raw)?;
        let raw = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((raw.as_str(), ""));
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        Ok((status, head.to_owned(), body.to_owned()))
    })
}

#[cfg(test)]
mod tests {
    use super::proc_net_counter;

    #[test]
    fn a_counter_is_read_from_its_tables_name_and_value_rows() {
        let text = "Ip: Forwarding InReceives\nIp: 1 42\nIcmp: InMsgs\nIcmp: 7\n\
                    IpExt: InNoRoutes InNoECTPkts\nIpExt: 0 168\n";
        assert_eq!(proc_net_counter(text, "Ip", "InReceives"), Some(42));
        assert_eq!(proc_net_counter(text, "IpExt", "InNoECTPkts"), Some(168));
        assert_eq!(proc_net_counter(text, "Ip", "InNoECTPkts"), None);
        assert_eq!(proc_net_counter(text, "Tcp", "InSegs"), None);
    }
}
